//! Every way the store and the cache can fail, each message naming the file and saying what to do next.
//!
//! An error that wraps another prints it in its own message and does not also return it as
//! [`source`](std::error::Error::source) (the fields are named `error`, which `thiserror` leaves alone), so a
//! chain of causes printed one after another names each cause once.

use std::io;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// An I/O error on a named file.
    #[error("{path}: {error}", path = path.display())]
    Io { path: PathBuf, error: io::Error },
    /// The filesystem does not support O_DIRECT (tmpfs, some network filesystems).
    #[error("{path}: the filesystem refuses direct I/O (O_DIRECT): {error}; run without --direct-io", path = path.display())]
    DirectIoUnsupported { path: PathBuf, error: io::Error },
    /// `manifest.json` is missing or unreadable.
    #[error("{path} cannot be read: {error}; is this a store written by titan convert?", path = path.display())]
    ManifestMissing { path: PathBuf, error: io::Error },
    /// `manifest.json` is not valid JSON of the expected shape.
    #[error("{path} does not parse: {what}; re-run titan convert --layout copy", path = path.display())]
    ManifestParse { path: PathBuf, what: String },
    /// The store was written by a TITAN with another format version.
    #[error("{path}: store format version {found} is not supported (this TITAN reads version {supported}); re-run titan convert", path = path.display())]
    Version { path: PathBuf, found: u32, supported: u32 },
    /// The store was converted from a different model file (or from an older version of it).
    #[error("{dir} was made from {made_from} ({made_size} bytes), not from {model}: run titan convert {model} to make a store for this model", dir = dir.display(), model = model.display())]
    WrongModel {
        dir: PathBuf,
        made_from: String,
        made_size: u64,
        model: PathBuf,
    },
    /// The manifest names this model, but an expert's bytes in the model are not the ones the store holds.
    #[error("{dir} was not made from {model}: expert {expert} of layer {layer} differs; run titan convert {model} to make a store for this model", dir = dir.display(), model = model.display())]
    NotFromModel {
        dir: PathBuf,
        layer: usize,
        expert: usize,
        model: PathBuf,
    },
    /// `experts.bin` is shorter than the manifest says.
    #[error("{path} is {actual} bytes but the manifest needs {expected}: the store is truncated; re-run titan convert", path = path.display())]
    Truncated { path: PathBuf, actual: u64, expected: u64 },
    /// The manifest's tables contradict themselves or the model's shapes and types.
    #[error("{path}: {what}; re-run titan convert --layout copy", path = path.display())]
    Inconsistent { path: PathBuf, what: String },
    /// A record's bytes do not match its digest; the record is never used. `next` says what to do,
    /// which depends on the layout: a damaged copy is made again, a damaged model is not the store's fault.
    #[error("expert {expert} of layer {layer} failed its digest check in {path} (offset {offset:#x}): {next}", path = path.display())]
    Digest {
        layer: usize,
        expert: usize,
        path: PathBuf,
        offset: u64,
        next: &'static str,
    },
    /// An in-place index that is truncated, damaged, or not an index at all.
    #[error("{path}: {what}; re-run titan convert --layout in-place", path = path.display())]
    Index { path: PathBuf, what: String },
    /// `titan verify INDEX` looks for the indexed model beside the index and cannot open it.
    #[error("{index} indexes {model}, which cannot be opened ({what}); pass the model with --model", index = index.display(), model = model.display())]
    IndexedModel {
        index: PathBuf,
        model: PathBuf,
        what: String,
    },
    /// The directory is a conversion that never finished.
    #[error("{path} is an unfinished conversion, not a store: delete it and run titan convert --layout copy", path = path.display())]
    Unfinished { path: PathBuf },
    /// An output path that writing would destroy an input through, or that is not what the command writes.
    #[error("refusing to write {path}: {what}", path = path.display())]
    Output { path: PathBuf, what: String },
    /// `convert` would replace an existing store.
    #[error("{path} already exists: pass --force to replace it", path = path.display())]
    Exists { path: PathBuf },
    /// The model has no stacked expert tensors.
    #[error("{0}, nothing to convert")]
    NoExperts(titan_layout::LayoutError),
    /// The model's expert tensors have shapes the store cannot hold.
    #[error("{path}: {what}", path = path.display())]
    Model { path: PathBuf, what: String },
    /// A record alignment that is not a power of two of at least 512 bytes.
    #[error("record alignment {0} must be a power of two of at least 512 bytes")]
    Alignment(u64),
    /// A (layer, expert) the store does not hold.
    #[error("the store has no expert {expert} in layer {layer}")]
    NoRecord { layer: usize, expert: usize },
    /// The pinned set does not fit in the cache budget beside the one record that streaming needs.
    #[error("pinned experts need {need} bytes but the expert budget has {room} bytes for them (it keeps one record's room to stream the rest): pin fewer experts or raise --expert-budget")]
    PinOverBudget { need: u64, room: u64 },
    /// Streaming was asked for and no store is beside the model.
    #[error(
        "no expert store beside {m} (looked for {copy} and {index}): create one with `titan convert {m}` (an index, \
         no copy) or `titan convert {m} --layout copy` (a copy of the experts)",
        m = model.display(), copy = copy.display(), index = index.display()
    )]
    NoStore {
        model: PathBuf,
        copy: PathBuf,
        index: PathBuf,
    },
    /// The store named is neither a store directory nor an index.
    #[error("{path}: no expert store there (create it with `titan convert {model}`)", path = path.display(), model = model.display())]
    NotAStore { path: PathBuf, model: PathBuf },
    /// An automatic budget on a system whose available memory cannot be read.
    #[error(
        "the memory available is unknown (TITAN_MEMORY_AVAILABLE is not a size, or MemAvailable cannot be read \
         from /proc/meminfo), so an automatic expert budget cannot be sized; give --expert-budget a size"
    )]
    MemoryUnknown,
    /// Not even the dense weights, the KV caches and the margin fit in memory.
    #[error(
        "{model}: {needs} do not fit in the {available} of memory available, so not even its experts can stream \
         (--resident tries anyway{less})",
        model = model.display(),
        available = crate::units::human_bytes(*available),
        less = if *kv { "; a smaller --ctx-size (or --parallel) needs less" } else { "" }
    )]
    NoRoom {
        model: PathBuf,
        needs: String,
        available: u64,
        kv: bool,
    },
    /// The index beside the model could not be written.
    #[error(
        "writing the expert index {path} (give --store a writable place for one made with \
         `titan convert --layout in-place -o`): {error}",
        path = path.display()
    )]
    IndexBeside { path: PathBuf, error: Box<StoreError> },
    /// The model itself cannot be loaded (its file, its hyper-parameters, a routing profile).
    #[error(transparent)]
    Engine(#[from] titan_engine::EngineError),
}

impl From<titan_layout::LayoutError> for StoreError {
    fn from(e: titan_layout::LayoutError) -> StoreError {
        match e {
            e @ titan_layout::LayoutError::NoExperts { .. } => StoreError::NoExperts(e),
            titan_layout::LayoutError::Model { path, what } => StoreError::Model { path, what },
        }
    }
}

impl StoreError {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> StoreError {
        let path = path.into();
        move |error| StoreError::Io { path, error }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error;

    /// An error that quotes its cause does not also return it as its source, so printing the chain (as the
    /// command line and `anyhow`'s `{:#}` do) names the cause once.
    #[test]
    fn a_wrapped_error_is_named_once() {
        let gone = || io::Error::from(io::ErrorKind::NotFound);
        let text = gone().to_string();
        let io = |path: &str| StoreError::Io {
            path: path.into(),
            error: gone(),
        };
        let errors = [
            io("/s/experts.bin"),
            StoreError::DirectIoUnsupported {
                path: "/s/experts.bin".into(),
                error: gone(),
            },
            StoreError::ManifestMissing {
                path: "/s/manifest.json".into(),
                error: gone(),
            },
            StoreError::IndexBeside {
                path: "/m.titan-index".into(),
                error: Box::new(io("/m.titan-index.partial-1")),
            },
        ];
        for e in errors {
            let mut chain = e.to_string();
            let mut source = e.source();
            while let Some(s) = source {
                chain = format!("{chain}: {s}");
                source = s.source();
            }
            assert_eq!(chain.matches(&text).count(), 1, "{chain}");
        }
    }
}
