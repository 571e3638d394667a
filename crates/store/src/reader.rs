//! `Store`: open a store — a directory holding a copy of the experts, or an index of the experts inside
//! the model — check it against the model, and read records with positional reads into aligned buffers,
//! optionally bypassing the page cache, checking each record's digest.
//!
//! Both layouts come down to the same table: for every (layer, expert), the offsets of its gate, up and
//! down bytes in one file (`experts.bin`, or the GGUF) and the BLAKE3 of those bytes. Everything above
//! `read` — the cache, prefetch, pinning, `verify` — sees no difference between them.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;

use titan_gguf::GgufFile;

use crate::index::Index;
use titan_layout::{ExpertLayout, ModelIdentity};

use crate::manifest::{LayerEntry, Manifest, TensorSpec};
use crate::record::{Part, RecordShape};
use crate::{AlignedBuf, ExpertRecord, StoreError, DEFAULT_ALIGNMENT, EXPERTS_FILE, MANIFEST_FILE, MIN_ALIGNMENT};

#[derive(Clone, Debug)]
pub struct StoreOptions {
    /// Read with O_DIRECT: records bypass the page cache, so the expert budget is the only memory they use.
    pub direct_io: bool,
    /// Check each record's BLAKE3 digest as it is read (`verify` always checks).
    pub verify_digests: bool,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            direct_io: false,
            verify_digests: true,
        }
    }
}

/// Where a store's expert bytes live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// A directory (`MODEL.titan/`) holding a copy of every expert as one aligned record of
    /// `experts.bin`: one read per expert, twice the model's disk space.
    Copy,
    /// An index file (`MODEL.titan-index`) of where each expert's gate, up and down bytes are inside the
    /// GGUF itself: three reads per expert, no second copy.
    InPlace,
}

/// Where a record's bytes are and what they must hash to.
struct Loc {
    /// Offsets of the gate, up and down bytes in the file read (their lengths are the layer's).
    parts: [u64; 3],
    /// BLAKE3 of gate ‖ up ‖ down.
    digest: [u8; 32],
}

pub struct Store {
    /// The store directory (copy) or the index file (in place).
    path: PathBuf,
    layout: Layout,
    /// The file the records are read from: `experts.bin`, or the model.
    file_path: PathBuf,
    file_len: u64,
    /// Where record bytes come from: `file_path`, or what [`Store::with_source`] put in its place.
    source: Box<dyn RecordSource>,
    opts: StoreOptions,
    /// Reads start and end on multiples of this, and buffers start on one.
    align: u64,
    identity: ModelIdentity,
    n_layer: usize,
    n_expert: usize,
    /// The MoE layers, ascending. Nothing here is sized by `n_layer`, which is only a number compared
    /// with the model's.
    layers: Vec<LayerEntry>,
    /// One per MoE layer, in the order of `layers`.
    shapes: Vec<RecordShape>,
    /// One per (MoE layer, expert), layer-major.
    locs: Vec<Loc>,
}

/// Positional reads of record bytes, as `pread` gives them.
pub trait RecordSource: Send + Sync {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize>;
}

impl RecordSource for File {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        FileExt::read_at(self, buf, offset)
    }
}

/// The outcome of `Store::verify`: every record was read; `bad` lists each one that failed.
#[derive(Debug)]
pub struct VerifyReport {
    pub records: usize,
    pub bytes: u64,
    /// One error per bad record (digest mismatch or read failure), in record order.
    pub bad: Vec<StoreError>,
}

impl VerifyReport {
    pub fn is_ok(&self) -> bool {
        self.bad.is_empty()
    }
}

/// One positional read of a record: `len` bytes of the file from `offset` into the buffer at `at`, of
/// which the first `need` must be there (the rest may lie past the end of the file).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Span {
    offset: u64,
    len: u64,
    at: u64,
    need: u64,
}

/// How one record is read: its spans, where its gate, up and down start in the buffer, the buffer's size.
/// At most three spans, held inline: the cache asks for a record's size on every request, hits included.
#[derive(Debug, PartialEq, Eq)]
struct Plan {
    span: [Span; 3],
    n_spans: usize,
    starts: [u64; 3],
    len: u64,
}

impl Plan {
    fn spans(&self) -> &[Span] {
        &self.span[..self.n_spans]
    }
}

/// Plan the reads of parts at `(offset, length)`. A part that starts where the previous one ends (a
/// copied record) extends that read; one elsewhere (in place) gets a read of its own. Each read is
/// rounded out to `align` at both ends, because O_DIRECT transfers whole aligned blocks into aligned
/// memory; the rounding costs at most two blocks per part, and the bytes outside the parts are never
/// looked at.
fn plan(parts: [(u64, u64); 3], align: u64) -> Plan {
    let empty = Span {
        offset: 0,
        len: 0,
        at: 0,
        need: 0,
    };
    let (mut span, mut n_spans, mut starts, mut len) = ([empty; 3], 0, [0; 3], 0);
    for (i, (offset, n)) in parts.into_iter().enumerate() {
        match span[..n_spans].last_mut() {
            Some(s) if s.offset + s.need == offset => {
                starts[i] = s.at + s.need;
                s.need += n;
                let grown = (s.offset + s.need).next_multiple_of(align) - s.offset;
                len += grown - s.len;
                s.len = grown;
            }
            _ => {
                let lo = offset / align * align;
                let hi = (offset + n).next_multiple_of(align);
                starts[i] = len + offset - lo;
                span[n_spans] = Span {
                    offset: lo,
                    len: hi - lo,
                    at: len,
                    need: offset + n - lo,
                };
                n_spans += 1;
                len += hi - lo;
            }
        }
    }
    Plan {
        span,
        n_spans,
        starts,
        len,
    }
}

impl Store {
    /// Open with default options (buffered reads, digests checked).
    pub fn open(path: &Path, gguf: &GgufFile) -> Result<Store, StoreError> {
        Store::open_with(path, gguf, &StoreOptions::default())
    }

    /// Open the store at `path` — a store directory, or an in-place index file — and check that it was
    /// made from `gguf` and matches its expert tensors.
    pub fn open_with(path: &Path, gguf: &GgufFile, opts: &StoreOptions) -> Result<Store, StoreError> {
        if crate::convert::is_partial(path) {
            return Err(StoreError::Unfinished {
                path: path.to_path_buf(),
            });
        }
        let store = if path.is_file() {
            Store::open_in_place(path, Index::load(path)?, gguf, opts)?
        } else {
            Store::open_copy(path, opts)?
        };
        store.check_model(gguf)?;
        Ok(store)
    }

    /// Open `path` without a model. A store directory's manifest is checked for consistency with itself
    /// and with the size of `experts.bin`, not against a GGUF; an index is opened over the model it names
    /// beside it (it has no bytes of its own). For `titan verify`, which then checks every digest.
    pub fn open_unchecked(path: &Path, opts: &StoreOptions) -> Result<Store, StoreError> {
        if crate::convert::is_partial(path) {
            return Err(StoreError::Unfinished {
                path: path.to_path_buf(),
            });
        }
        if !path.is_file() {
            return Store::open_copy(path, opts);
        }
        let index = Index::load(path)?;
        let model = path.with_file_name(&index.source.file_name);
        let gguf = GgufFile::open(&model).map_err(|e| StoreError::IndexedModel {
            index: path.to_path_buf(),
            model: model.clone(),
            what: e.to_string(),
        })?;
        let store = Store::open_in_place(path, index, &gguf, opts)?;
        store.check_model(&gguf)?;
        Ok(store)
    }

    fn open_copy(dir: &Path, opts: &StoreOptions) -> Result<Store, StoreError> {
        let man_path = dir.join(MANIFEST_FILE);
        let manifest = Manifest::load(&man_path)?;
        let bad = |what: String| StoreError::Inconsistent {
            path: man_path.clone(),
            what,
        };
        let align = manifest.alignment;
        if !align.is_power_of_two() || align < MIN_ALIGNMENT || usize::try_from(align).is_err() {
            return Err(bad(format!(
                "alignment {align} is not a power of two of at least {MIN_ALIGNMENT}"
            )));
        }
        let shapes = layer_shapes(manifest.n_layer, &manifest.layers).map_err(bad)?;
        let locs = check_records(&manifest).map_err(bad)?;

        let bin_path = dir.join(EXPERTS_FILE);
        let file = open_records(&bin_path, opts.direct_io)?;
        let actual = file.metadata().map_err(StoreError::io(&bin_path))?.len();
        let expected = manifest
            .records
            .last()
            .map_or(0, |r| r.offset + r.length.next_multiple_of(align));
        if actual < expected {
            return Err(StoreError::Truncated {
                path: bin_path,
                actual,
                expected,
            });
        }
        Ok(Store {
            path: dir.to_path_buf(),
            layout: Layout::Copy,
            file_path: bin_path,
            file_len: actual,
            source: Box::new(file),
            opts: opts.clone(),
            align,
            identity: manifest.source,
            n_layer: manifest.n_layer,
            n_expert: manifest.n_expert,
            layers: manifest.layers,
            shapes,
            locs,
        })
    }

    /// A store over `gguf`'s own bytes, located by `index` (read from `path`).
    fn open_in_place(path: &Path, index: Index, gguf: &GgufFile, opts: &StoreOptions) -> Result<Store, StoreError> {
        let bad = |what: String| StoreError::Index {
            path: path.to_path_buf(),
            what,
        };
        let shapes = layer_shapes(index.n_layer, &index.layers).map_err(bad)?;
        let n_expert = index.n_expert as u64;
        let mut locs = Vec::with_capacity(index.digests.len());
        for ((l, offsets), digests) in index
            .layers
            .iter()
            .zip(&index.offsets)
            .zip(index.digests.chunks(index.n_expert.max(1)))
        {
            let sizes = [l.gate.bytes, l.up.bytes, l.down.bytes];
            // Expert e of a part is at offset + e × bytes; the last one must end inside the file.
            for (offset, bytes) in offsets.iter().zip(sizes) {
                let end = bytes.checked_mul(n_expert).and_then(|n| n.checked_add(*offset));
                if end.is_none_or(|end| end > gguf.file_len()) {
                    return Err(bad(format!(
                        "layer {}'s experts at {offset:#x} run past the end of {}",
                        l.layer,
                        gguf.path().display()
                    )));
                }
            }
            for (e, digest) in digests.iter().enumerate() {
                let e = e as u64;
                locs.push(Loc {
                    parts: [0, 1, 2].map(|p| offsets[p] + e * sizes[p]),
                    digest: *digest,
                });
            }
        }
        let file_path = gguf.path().to_path_buf();
        let file = open_records(&file_path, opts.direct_io)?;
        let file_len = file.metadata().map_err(StoreError::io(&file_path))?.len();
        Ok(Store {
            path: path.to_path_buf(),
            layout: Layout::InPlace,
            file_path,
            file_len,
            source: Box::new(file),
            opts: opts.clone(),
            align: DEFAULT_ALIGNMENT,
            identity: index.source,
            n_layer: index.n_layer,
            n_expert: index.n_expert,
            layers: index.layers,
            shapes,
            locs,
        })
    }

    /// Check that the store was made from `gguf`: the same file (size and header), the same expert
    /// tensors, and — since a header can be copied, and models that differ only in their weights share
    /// one — the same expert bytes, for one expert per MoE layer (`titan verify --model` hashes all).
    fn check_model(&self, gguf: &GgufFile) -> Result<(), StoreError> {
        if !self.identity.matches(&ModelIdentity::of(gguf)?) {
            return Err(StoreError::WrongModel {
                dir: self.path.clone(),
                made_from: self.identity.file_name.clone(),
                made_size: self.identity.file_size,
                model: gguf.path().to_path_buf(),
            });
        }
        let layout = ExpertLayout::of(gguf)?;
        let mut difference = layout_difference(self, &layout);
        if self.layout == Layout::InPlace && difference.is_none() {
            // The header digest matched, so only an index written wrongly can get here.
            difference = layout.layers.iter().enumerate().find_map(|(i, l)| {
                (self.locs.get(i * self.n_expert).map(|loc| loc.parts) != Some(l.offsets))
                    .then(|| format!("layer {}'s expert offsets are not the model's", l.layer))
            });
        }
        if let Some(what) = difference {
            return Err(match self.layout {
                Layout::Copy => StoreError::Inconsistent {
                    path: self.path.join(MANIFEST_FILE),
                    what,
                },
                Layout::InPlace => StoreError::Index {
                    path: self.path.clone(),
                    what,
                },
            });
        }
        if let Some(&(layer, expert)) = self.source_mismatches(gguf, false)?.first() {
            return Err(StoreError::NotFromModel {
                dir: self.path.clone(),
                layer,
                expert,
                model: gguf.path().to_path_buf(),
            });
        }
        Ok(())
    }

    /// The (layer, expert) pairs whose bytes in `gguf` do not have the digest of their record here: every
    /// expert when `all`, else one per MoE layer (a different one in each, so a few layers already cover
    /// several expert ids). The model's layout must already match the store's.
    pub fn source_mismatches(&self, gguf: &GgufFile, all: bool) -> Result<Vec<(usize, usize)>, StoreError> {
        let layout = ExpertLayout::of(gguf)?;
        let n_expert = self.n_expert;
        let mut bad = Vec::new();
        for (i, entry) in layout.layers.iter().enumerate() {
            let experts = if all {
                0..n_expert
            } else {
                i % n_expert..i % n_expert + 1
            };
            for e in experts {
                let digest = layout.digest(gguf, entry.layer, e).ok_or_else(|| StoreError::Model {
                    path: gguf.path().to_path_buf(),
                    what: format!("expert {e} of layer {} lies past the end of the file", entry.layer),
                })?;
                if digest != self.locs[i * n_expert + e].digest {
                    bad.push((entry.layer, e));
                }
            }
        }
        Ok(bad)
    }

    /// Reads the records through `source` instead of the store's file (same offsets and lengths): how a
    /// test puts a failing or lying disk under the store and the cache, everything above it unchanged.
    pub fn with_source(mut self, source: impl RecordSource + 'static) -> Store {
        self.source = Box::new(source);
        self
    }

    /// The store directory, or the index file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The file records are read from: the store's `experts.bin`, or the model itself.
    pub fn file_path(&self) -> &Path {
        &self.file_path
    }

    pub fn n_layer(&self) -> usize {
        self.n_layer
    }

    pub fn n_expert(&self) -> usize {
        self.n_expert
    }

    /// The MoE layers, ascending, with their experts' shapes.
    pub fn layers(&self) -> &[LayerEntry] {
        &self.layers
    }

    /// Every (layer, expert) the store holds, layer-major.
    pub fn records(&self) -> impl ExactSizeIterator<Item = (usize, usize)> + '_ {
        let n = self.n_expert.max(1);
        (0..self.locs.len()).map(move |i| (self.layers[i / n].layer, i % n))
    }

    /// Whether `layer` has experts in the store (dense layers do not).
    pub fn is_moe_layer(&self, layer: usize) -> bool {
        self.layer_index(layer).is_some()
    }

    /// Position of `layer` in the table of MoE layers.
    fn layer_index(&self, layer: usize) -> Option<usize> {
        self.layers.binary_search_by_key(&layer, |l| l.layer).ok()
    }

    /// How record `i` (layer-major) is read.
    fn plan_of(&self, i: usize) -> Plan {
        let shape = &self.shapes[i / self.n_expert.max(1)];
        let parts = self.locs[i].parts;
        let lens = [shape.gate.len, shape.up.len, shape.down.len];
        plan([0, 1, 2].map(|p| (parts[p], lens[p] as u64)), self.align)
    }

    fn index_of(&self, layer: usize, expert: usize) -> Option<usize> {
        if expert >= self.n_expert {
            return None;
        }
        Some(self.layer_index(layer)? * self.n_expert + expert)
    }

    /// Bytes a record takes to read and to hold: its parts' reads, each rounded out to the alignment.
    pub fn record_bytes(&self, layer: usize, expert: usize) -> Option<u64> {
        self.index_of(layer, expert).map(|i| self.plan_of(i).len)
    }

    /// The largest `record_bytes` of any record.
    pub fn max_record_bytes(&self) -> u64 {
        (0..self.locs.len()).map(|i| self.plan_of(i).len).max().unwrap_or(0)
    }

    /// Read one record (one positional read per span of its plan), checking its digest unless digests
    /// were turned off. A record that fails its digest is dropped, never returned.
    pub fn read(&self, layer: usize, expert: usize) -> Result<ExpertRecord, StoreError> {
        self.read_checked(layer, expert, self.opts.verify_digests, None)
    }

    /// [`Store::read`] into `spare`, a buffer of an earlier record, when it is long enough (its bytes
    /// outside the new record's reads are left as they were; nothing looks at them). Reusing a buffer
    /// saves mapping, zeroing and unmapping one per read: about 1.3 ms of an I/O thread's time for a
    /// 2.65 MB record on the 2-core EPYC (`record_cpu`), against a read of 5–10 ms.
    pub fn read_reusing(
        &self,
        layer: usize,
        expert: usize,
        spare: Option<AlignedBuf>,
    ) -> Result<ExpertRecord, StoreError> {
        self.read_checked(layer, expert, self.opts.verify_digests, spare)
    }

    fn read_checked(
        &self,
        layer: usize,
        expert: usize,
        check: bool,
        spare: Option<AlignedBuf>,
    ) -> Result<ExpertRecord, StoreError> {
        let Some(i) = self.index_of(layer, expert) else {
            return Err(StoreError::NoRecord { layer, expert });
        };
        let plan = self.plan_of(i);
        let too_big = || StoreError::Io {
            path: self.file_path.clone(),
            error: std::io::Error::new(
                std::io::ErrorKind::OutOfMemory,
                format!("cannot allocate {} bytes for a record", plan.len),
            ),
        };
        let len = usize::try_from(plan.len).map_err(|_| too_big())?;
        let fits = |b: &AlignedBuf| b.len() >= len && (b.as_slice().as_ptr() as u64).is_multiple_of(self.align);
        let mut buf = match spare.filter(fits) {
            Some(b) => b,
            None => AlignedBuf::zeroed(len, self.align as usize).ok_or_else(too_big)?,
        };
        self.read_spans(plan.spans(), &mut buf.as_mut_slice()[..len])?;
        let mut shape = self.shapes[i / self.n_expert];
        for (part, start) in [&mut shape.gate, &mut shape.up, &mut shape.down]
            .into_iter()
            .zip(plan.starts)
        {
            part.start = start as usize;
        }
        let record = ExpertRecord::new(layer, expert, shape, buf);
        if check {
            // Exactly the bytes the kernels will use, nothing of the rounding around them.
            let mut hasher = blake3::Hasher::new();
            for t in [record.gate(), record.up(), record.down()] {
                hasher.update(t.data);
            }
            if hasher.finalize().as_bytes() != &self.locs[i].digest {
                return Err(StoreError::Digest {
                    layer,
                    expert,
                    path: self.file_path.clone(),
                    offset: self.locs[i].parts[0],
                    next: match self.layout {
                        Layout::Copy => "re-run titan convert --layout copy",
                        Layout::InPlace => {
                            "the model changed or is damaged since its index was made; \
                             restore the model, or re-run titan convert --layout in-place"
                        }
                    },
                });
            }
        }
        Ok(record)
    }

    /// Read the spans into their places in `buf`, all at once. An in-place record is three reads far apart
    /// in the file; one after another they leave the disk idle between them, and with only a few of a
    /// layer's experts missing, a record's own spans are what keeps several reads in flight (measured with
    /// `read_records`, one record at a time: 464 MB/s reading the spans one after another, 770–1018 MB/s
    /// at once, as fast as one read of a copied record). A scoped thread costs tens of microseconds
    /// against a read of milliseconds.
    fn read_spans(&self, spans: &[Span], buf: &mut [u8]) -> Result<(), StoreError> {
        // The spans follow each other in the buffer in order; cut it into their disjoint slices.
        let mut reads = Vec::with_capacity(spans.len());
        let (mut rest, mut cut) = (buf, 0);
        for s in spans {
            let (dst, tail) = std::mem::take(&mut rest)[(s.at - cut) as usize..].split_at_mut(s.len as usize);
            reads.push((dst, s));
            (rest, cut) = (tail, s.at + s.len);
        }
        let mut reads = reads.into_iter();
        let Some((dst, first)) = reads.next() else {
            return Ok(());
        };
        std::thread::scope(|scope| {
            let mut result = Ok(());
            let mut others = Vec::new();
            let io = |error| StoreError::Io {
                path: self.file_path.clone(),
                error,
            };
            for (dst, s) in reads {
                match std::thread::Builder::new().spawn_scoped(scope, move || self.read_span(dst, s.offset, s.need)) {
                    Ok(h) => others.push(h),
                    Err(e) => result = Err(io(e)), // a process at its thread limit: an error, not a panic
                }
            }
            result = result.and(self.read_span(dst, first.offset, first.need));
            for h in others {
                let joined = h
                    .join()
                    .unwrap_or_else(|_| Err(io(std::io::Error::other("a read thread panicked"))));
                result = result.and(joined);
            }
            result
        })
    }

    /// Fill `dst` from `offset`, stopping early only at the end of the file and only once the first
    /// `need` bytes are in (with O_DIRECT a read past the end returns what there is; the next one, at an
    /// unaligned offset, would fail).
    fn read_span(&self, dst: &mut [u8], offset: u64, need: u64) -> Result<(), StoreError> {
        let mut done = 0;
        while done < dst.len() && offset + (done as u64) < self.file_len {
            match self.source.read_at(&mut dst[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                // O_DIRECT reads fail with EINVAL when the device's block is larger than the alignment.
                Err(e) if self.opts.direct_io && e.raw_os_error() == Some(libc::EINVAL) => {
                    return Err(StoreError::DirectIoUnsupported {
                        path: self.file_path.clone(),
                        error: e,
                    })
                }
                Err(e) => {
                    return Err(StoreError::Io {
                        path: self.file_path.clone(),
                        error: e,
                    })
                }
            }
        }
        if (done as u64) < need {
            return Err(StoreError::Truncated {
                path: self.file_path.clone(),
                actual: offset + done as u64,
                expected: offset + need,
            });
        }
        Ok(())
    }

    /// Read every record and check every digest, on one reader thread per core (at most 8: enough to keep
    /// an NVMe queue busy while hashing); `progress(done, total)` counts record bytes. All bad records are
    /// reported, not just the first; `Err` only if the reader threads could not run.
    pub fn verify(&self, progress: &mut dyn FnMut(u64, u64)) -> Result<VerifyReport, StoreError> {
        let threads = std::thread::available_parallelism().map_or(4, |n| n.get().min(8));
        let length = |i: usize| self.layers[i / self.n_expert.max(1)].record_length();
        let total: u64 = (0..self.locs.len()).map(length).sum();
        let keys: Vec<(usize, usize)> = self.records().collect();
        let next = AtomicUsize::new(0);
        let mut results: Vec<Option<StoreError>> = Vec::with_capacity(keys.len());
        results.resize_with(keys.len(), || None);
        let spawned = std::thread::scope(|s| {
            let (tx, rx) = mpsc::channel();
            let (mut spawned, mut spawn_error) = (0, None);
            for _ in 0..threads.min(keys.len().max(1)) {
                let (tx, keys, next) = (tx.clone(), &keys, &next);
                // Workers take the next record index until none is left, so any one of them finishes the job.
                let worker = move || loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&(layer, expert)) = keys.get(i) else {
                        break;
                    };
                    if tx
                        .send((i, self.read_checked(layer, expert, true, None).err()))
                        .is_err()
                    {
                        break;
                    }
                };
                match std::thread::Builder::new().spawn_scoped(s, worker) {
                    Ok(_) => spawned += 1,
                    Err(e) => spawn_error = Some(e),
                }
            }
            drop(tx);
            let mut done = 0;
            for (i, err) in rx {
                done += length(i);
                results[i] = err;
                progress(done, total);
            }
            // Fewer threads than asked for only slows the check; none at all is an error.
            match spawn_error {
                Some(e) if spawned == 0 => Err(e),
                _ => Ok(()),
            }
        });
        spawned.map_err(StoreError::io(&self.file_path))?;
        Ok(VerifyReport {
            records: keys.len(),
            bytes: total,
            bad: results.into_iter().flatten().collect(),
        })
    }
}

/// What differs between a store's layer table and a model's expert tensors, if anything.
fn layout_difference(s: &Store, model: &ExpertLayout) -> Option<String> {
    if (s.n_layer, s.n_expert) != (model.n_layer, model.n_expert) {
        return Some(format!(
            "the store has {} layers of {} experts, the model {} layers of {}",
            s.n_layer, s.n_expert, model.n_layer, model.n_expert
        ));
    }
    let ours: Vec<usize> = s.layers.iter().map(|l| l.layer).collect();
    let theirs: Vec<usize> = model.layers.iter().map(|l| l.layer).collect();
    if ours != theirs {
        return Some(format!(
            "the store has experts in layers {ours:?}, the model in {theirs:?}"
        ));
    }
    let describe = |s: &TensorSpec| format!("{} {}×{} ({} bytes)", s.ty, s.rows, s.cols, s.bytes);
    let model: Vec<LayerEntry> = model.layers.iter().map(LayerEntry::of).collect();
    for (ours, theirs) in s.layers.iter().zip(&model) {
        for (part, a, b) in [
            ("gate", &ours.gate, &theirs.gate),
            ("up", &ours.up, &theirs.up),
            ("down", &ours.down, &theirs.down),
        ] {
            if a != b {
                return Some(format!(
                    "layer {}'s {part} expert is {} in the store but {} in the model",
                    ours.layer,
                    describe(a),
                    describe(b)
                ));
            }
        }
    }
    None
}

/// Each MoE layer's record shape; the layers must be ascending and below `n_layer`, and the last of them
/// must be layer `n_layer - 1`: a model's layers without experts are its first ones (DeepSeek's dense lead),
/// so any other `n_layer` is one the store does not back (checked here because `titan verify` without a model
/// has nothing else to compare it with).
fn layer_shapes(n_layer: usize, layers: &[LayerEntry]) -> Result<Vec<RecordShape>, String> {
    let mut shapes = Vec::with_capacity(layers.len());
    for (i, l) in layers.iter().enumerate() {
        if l.layer >= n_layer || i > 0 && l.layer <= layers[i - 1].layer {
            return Err(format!(
                "layer {} is out of order or not below n_layer {n_layer}",
                l.layer
            ));
        }
        shapes.push(record_shape(l).ok_or_else(|| format!("layer {} has a type TITAN does not know", l.layer))?);
    }
    let Some(last) = layers.last() else {
        return Err("it lists no layer with experts".into());
    };
    if last.layer + 1 != n_layer {
        return Err(format!(
            "n_layer is {n_layer}, but its last layer with experts is layer {} (a model's last layer always has \
             experts)",
            last.layer
        ));
    }
    Ok(shapes)
}

fn record_shape(l: &LayerEntry) -> Option<RecordShape> {
    let part = |s: &TensorSpec, start: u64| -> Option<Part> {
        Some(Part {
            ty: s.ggml_type()?,
            rows: s.rows,
            cols: s.cols,
            start: usize::try_from(start).ok()?,
            len: usize::try_from(s.bytes).ok()?,
            layout: titan_kernels::WeightLayout::Plain,
        })
    };
    Some(RecordShape {
        gate: part(&l.gate, 0)?,
        up: part(&l.up, l.gate.bytes)?,
        down: part(&l.down, l.gate.bytes.checked_add(l.up.bytes)?)?,
    })
}

/// The record table must list every (MoE layer, expert) once, layer-major, at aligned, non-overlapping
/// offsets, each with the length its layer's shapes give and a well-formed digest.
fn check_records(m: &Manifest) -> Result<Vec<Loc>, String> {
    let want = m.layers.len().checked_mul(m.n_expert);
    if want != Some(m.records.len()) {
        return Err(format!(
            "{} records listed; the model has {} MoE layers × {} experts",
            m.records.len(),
            m.layers.len(),
            m.n_expert
        ));
    }
    let mut locs = Vec::with_capacity(m.records.len());
    let mut end = 0u64;
    for (i, (r, l)) in m
        .records
        .iter()
        .zip(m.layers.iter().flat_map(|l| std::iter::repeat_n(l, m.n_expert)))
        .enumerate()
    {
        let expert = i % m.n_expert.max(1);
        let what = format!("record {i} (layer {}, expert {})", r.layer, r.expert);
        if (r.layer, r.expert) != (l.layer, expert) {
            return Err(format!(
                "{what} is out of order: expected layer {}, expert {expert}",
                l.layer
            ));
        }
        if r.length != l.record_length() {
            return Err(format!(
                "{what} is {} bytes; the model's shapes give {}",
                r.length,
                l.record_length()
            ));
        }
        if r.offset % m.alignment != 0 || r.offset < end {
            return Err(format!(
                "{what} offset {:#x} is misaligned or overlaps the previous record",
                r.offset
            ));
        }
        end = r
            .offset
            .checked_add(r.length.next_multiple_of(m.alignment))
            .ok_or_else(|| format!("{what} offset overflows"))?;
        let digest = blake3::Hash::from_hex(&r.blake3).map_err(|e| format!("{what} digest {:?}: {e}", r.blake3))?;
        // A copied record's parts follow one another: gate, then up, then down.
        let (gate, up) = (r.offset + l.gate.bytes, r.offset + l.gate.bytes + l.up.bytes);
        locs.push(Loc {
            parts: [r.offset, gate, up],
            digest: *digest.as_bytes(),
        });
    }
    Ok(locs)
}

/// Open the file records are read from (`experts.bin`, or the model), with O_DIRECT (Linux) or
/// F_NOCACHE (macOS) when asked.
fn open_records(path: &Path, direct: bool) -> Result<File, StoreError> {
    let mut o = OpenOptions::new();
    o.read(true);
    if !direct {
        return o.open(path).map_err(StoreError::io(path));
    }
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.custom_flags(libc::O_DIRECT);
        o.open(path).map_err(|e| match e.raw_os_error() {
            Some(libc::EINVAL) => StoreError::DirectIoUnsupported {
                path: path.to_path_buf(),
                error: e,
            },
            _ => StoreError::Io {
                path: path.to_path_buf(),
                error: e,
            },
        })
    }
    #[cfg(target_os = "macos")]
    {
        use std::os::fd::AsRawFd;
        let f = o.open(path).map_err(StoreError::io(path))?;
        // SAFETY: fcntl on a descriptor we own; F_NOCACHE is macOS's per-file page-cache bypass.
        if unsafe { libc::fcntl(f.as_raw_fd(), libc::F_NOCACHE, 1) } == -1 {
            return Err(StoreError::DirectIoUnsupported {
                path: path.to_path_buf(),
                error: std::io::Error::last_os_error(),
            });
        }
        Ok(f)
    }
    #[cfg(not(any(target_os = "linux", target_os = "macos")))]
    {
        let error = std::io::Error::new(std::io::ErrorKind::Unsupported, "no direct I/O on this platform");
        Err(StoreError::DirectIoUnsupported {
            path: path.to_path_buf(),
            error,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{convert_default, gguf_slice, test_dir, write_model, Spec};
    use titan_kernels::WeightView;

    fn check_all_records(store: &Store, gguf: &GgufFile) {
        assert_eq!(store.records().len(), store.layers().len() * store.n_expert());
        for (layer, expert) in store.records() {
            let rec = store.read(layer, expert).unwrap();
            assert_eq!((rec.layer, rec.expert), (layer, expert));
            let mut length = 0;
            for (part, t) in [("gate", rec.gate()), ("up", rec.up()), ("down", rec.down())] {
                assert!(
                    t.data == gguf_slice(gguf, layer, expert, part),
                    "{part} of ({layer}, {expert})"
                );
                let info = gguf.tensor(&format!("blk.{layer}.ffn_{part}_exps.weight")).unwrap();
                assert_eq!(
                    (t.ty, t.cols as u64, t.rows as u64),
                    (info.ty, info.dims[0], info.dims[1])
                );
                WeightView::new(t.ty, t.rows, t.cols, t.data).unwrap();
                assert_eq!(t.weight_view().data.len(), t.data.len());
                length += t.data.len() as u64;
            }
            assert_eq!(rec.resident_bytes(), store.record_bytes(layer, expert).unwrap());
            let entry = &store.layers()[store.layer_index(layer).unwrap()];
            assert_eq!(length, entry.record_length());
        }
    }

    #[test]
    fn buffered_and_direct_reads_return_the_gguf_bytes() {
        let dir = test_dir();
        for (i, spec) in [Spec::q4_k_m(), Spec::mixed()].iter().enumerate() {
            let gguf = write_model(dir.path(), &format!("m{i}.gguf"), spec);
            let out = dir.path().join(format!("m{i}.titan"));
            crate::convert(
                &gguf,
                &out,
                &crate::ConvertOptions {
                    alignment: 512,
                    force: false,
                },
                &mut |_, _| {},
            )
            .unwrap();
            let index = dir.path().join(format!("m{i}.titan-index"));
            crate::write_index(&gguf, &index, false, &mut |_, _| {}).unwrap();
            for (path, layout) in [(&out, Layout::Copy), (&index, Layout::InPlace)] {
                for direct_io in [false, true] {
                    let store = Store::open_with(
                        path,
                        &gguf,
                        &StoreOptions {
                            direct_io,
                            verify_digests: true,
                        },
                    )
                    .unwrap();
                    assert_eq!(store.layout(), layout);
                    check_all_records(&store, &gguf);
                    assert!(!store.is_moe_layer(spec.n_layer));
                    for &l in &spec.dense {
                        assert!(!store.is_moe_layer(l));
                        assert!(matches!(store.read(l, 0), Err(StoreError::NoRecord { .. })));
                    }
                    assert!(matches!(
                        store.read(spec.n_layer - 1, spec.n_expert),
                        Err(StoreError::NoRecord { .. })
                    ));
                }
            }
        }
    }

    #[test]
    fn reads_are_planned_whole_for_a_copy_and_per_part_in_place() {
        let span = |offset, len, at, need| Span { offset, len, at, need };
        // A copied record: aligned, its parts back to back, one read padded at the end.
        let p = plan([(8192, 1000), (9192, 1000), (10192, 3000)], 4096);
        assert_eq!(p.spans(), [span(8192, 8192, 0, 5000)]);
        assert_eq!((p.starts, p.len), ([0, 1000, 2000], 8192));
        // In place: three tensors apart, each slice rounded out to whole blocks at both ends.
        let p = plan([(100, 5000), (40_000, 4096), (1 << 20, 10)], 4096);
        assert_eq!(
            p.spans(),
            [
                span(0, 8192, 0, 5100),
                span(36_864, 8192, 8192, 7232),
                span(1 << 20, 4096, 16_384, 10),
            ]
        );
        assert_eq!((p.starts, p.len), ([100, 8192 + 3136, 16_384], 20_480));
        // Slices that happen to abut across tensors are one read, as in a copy.
        let p = plan([(512, 512), (1024, 512), (8192, 512)], 512);
        assert_eq!(p.spans(), [span(512, 1024, 0, 1024), span(8192, 512, 1024, 512)]);
        assert_eq!((p.starts, p.len), ([0, 512, 1024], 1536));
    }

    /// Flip one byte in the middle of a record's data.
    fn corrupt(store_dir: &Path, m: &Manifest, index: usize) -> u64 {
        let r = &m.records[index];
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(store_dir.join(EXPERTS_FILE))
            .unwrap();
        let at = r.offset + r.length / 2;
        let mut b = [0u8];
        f.read_exact_at(&mut b, at).unwrap();
        f.write_all_at(&[b[0] ^ 0x10], at).unwrap();
        r.offset
    }

    #[test]
    fn digest_failures_name_layer_expert_file_and_offset_and_verify_reports_all() {
        let dir = test_dir();
        let gguf = write_model(dir.path(), "m.gguf", &Spec::q4_k_m());
        let out = convert_default(&gguf, dir.path());
        let store = Store::open(&out, &gguf).unwrap();
        let mut last = (0, 0);
        let report = store.verify(&mut |d, t| last = (d, t)).unwrap();
        assert!(report.is_ok(), "{:?}", report.bad);
        assert_eq!((report.records, last.0), (16, last.1));

        let m = Manifest::load(&out.join(MANIFEST_FILE)).unwrap();
        let (a, b) = (3, 12);
        let off_a = corrupt(&out, &m, a);
        let off_b = corrupt(&out, &m, b);
        let (ra, rb) = (&m.records[a], &m.records[b]);
        let err = store.read(ra.layer, ra.expert).unwrap_err();
        assert!(
            matches!(err, StoreError::Digest { layer, expert, offset, .. } if (layer, expert, offset) == (ra.layer, ra.expert, off_a))
        );
        let want = format!(
            "expert {} of layer {} failed its digest check in {} (offset {:#x}): re-run titan convert --layout copy",
            ra.expert,
            ra.layer,
            out.join(EXPERTS_FILE).display(),
            off_a
        );
        assert_eq!(err.to_string(), want);
        // `titan verify STORE` opens without the model and finds the same records.
        let unchecked = Store::open_unchecked(&out, &StoreOptions::default()).unwrap();
        let report = unchecked.verify(&mut |_, _| {}).unwrap();
        let bad: Vec<(usize, usize, u64)> = report
            .bad
            .iter()
            .map(|e| match e {
                StoreError::Digest {
                    layer, expert, offset, ..
                } => (*layer, *expert, *offset),
                other => panic!("{other}"),
            })
            .collect();
        assert_eq!(bad, vec![(ra.layer, ra.expert, off_a), (rb.layer, rb.expert, off_b)]);

        // With O_DIRECT too; and with checking turned off the damaged bytes come back (the user's choice).
        let direct = Store::open_with(
            &out,
            &gguf,
            &StoreOptions {
                direct_io: true,
                verify_digests: true,
            },
        )
        .unwrap();
        assert!(matches!(
            direct.read(rb.layer, rb.expert),
            Err(StoreError::Digest { .. })
        ));
        let unchecked = Store::open_with(
            &out,
            &gguf,
            &StoreOptions {
                direct_io: false,
                verify_digests: false,
            },
        )
        .unwrap();
        assert!(unchecked.read(rb.layer, rb.expert).is_ok());
    }

    #[test]
    fn a_truncated_store_is_refused() {
        let dir = test_dir();
        let gguf = write_model(dir.path(), "m.gguf", &Spec::mixed());
        let out = convert_default(&gguf, dir.path());
        let bin = out.join(EXPERTS_FILE);
        let len = std::fs::metadata(&bin).unwrap().len();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&bin)
            .unwrap()
            .set_len(len - 4096)
            .unwrap();
        let err = Store::open(&out, &gguf).err().unwrap();
        assert!(
            matches!(err, StoreError::Truncated { actual, expected, .. } if actual == len - 4096 && expected == len),
            "{err}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains("experts.bin is") && msg.contains("truncated") && msg.contains("titan convert"),
            "{msg}"
        );
        std::fs::remove_file(&bin).unwrap();
        let err = Store::open(&out, &gguf).err().unwrap();
        assert!(err.to_string().contains("experts.bin"), "{err}");
    }

    #[test]
    fn a_store_from_another_model_is_refused() {
        let dir = test_dir();
        let a = write_model(dir.path(), "a.gguf", &Spec::mixed());
        // Same shapes and metadata, other weights: the header still differs (general.name carries the seed).
        let b = write_model(
            dir.path(),
            "b.gguf",
            &Spec {
                seed: 7,
                ..Spec::mixed()
            },
        );
        let out = convert_default(&a, dir.path());
        let err = Store::open(&out, &b).err().unwrap();
        assert!(matches!(err, StoreError::WrongModel { .. }), "{err}");
        let msg = err.to_string();
        assert!(
            msg.contains("was made from a.gguf") && msg.contains(&format!("run titan convert {}", b.path().display())),
            "{msg}"
        );
        // A renamed copy of the same model is the same model.
        std::fs::copy(a.path(), dir.path().join("renamed.gguf")).unwrap();
        Store::open(&out, &GgufFile::open(dir.path().join("renamed.gguf")).unwrap()).unwrap();
    }

    #[test]
    fn bad_manifests_are_refused_with_the_reason() {
        let dir = test_dir();
        let gguf = write_model(dir.path(), "m.gguf", &Spec::q4_k_m());
        let out = convert_default(&gguf, dir.path());
        let path = out.join(MANIFEST_FILE);
        let good = std::fs::read_to_string(&path).unwrap();
        let m: Manifest = serde_json::from_str(&good).unwrap();
        let open_with = |text: &str| {
            std::fs::write(&path, text).unwrap();
            Store::open(&out, &gguf).err().map(|e| (e.to_string(), e)).unwrap()
        };
        let json = |m: &Manifest| serde_json::to_string(m).unwrap();

        let (msg, e) = open_with(&good[..good.len() / 2]);
        assert!(
            matches!(e, StoreError::ManifestParse { .. }) && msg.contains("model.titan/manifest.json does not parse: "),
            "{msg}"
        );
        let (msg, _) = open_with("{\"hello\": 1}");
        assert!(msg.contains("does not parse"), "{msg}");
        let (msg, e) = open_with(&json(&Manifest {
            version: 99,
            ..m.clone()
        }));
        assert!(matches!(e, StoreError::Version { found: 99, .. }), "{msg}");

        let mut bad = m.clone();
        bad.records[5].length += 1;
        let (msg, e) = open_with(&json(&bad));
        assert!(
            matches!(e, StoreError::Inconsistent { .. }) && msg.contains("record 5 (layer 1, expert 5)"),
            "{msg}"
        );
        let mut bad = m.clone();
        bad.records[2].offset += 512;
        let (msg, _) = open_with(&json(&bad));
        assert!(msg.contains("misaligned or overlaps"), "{msg}");
        let mut bad = m.clone();
        bad.records.swap(1, 2);
        let (msg, _) = open_with(&json(&bad));
        assert!(msg.contains("out of order"), "{msg}");
        let mut bad = m.clone();
        bad.records[0].blake3 = "xyz".into();
        let (msg, _) = open_with(&json(&bad));
        assert!(msg.contains("digest \"xyz\""), "{msg}");
        let mut bad = m.clone();
        bad.layers[1].down.ty = "Q5_K".into();
        let (msg, _) = open_with(&json(&bad));
        assert!(
            msg.contains("layer 2's down expert is Q5_K 256×512 (73728 bytes) in the store but Q4_K"),
            "{msg}"
        );
        // A layer count nothing backs is refused as such, never allocated for; with a model or without one.
        for n_layer in [usize::MAX, 4] {
            let mut bad = m.clone();
            bad.n_layer = n_layer;
            let (msg, e) = open_with(&json(&bad));
            let want = format!("n_layer is {n_layer}, but its last layer with experts is layer 2");
            assert!(
                matches!(e, StoreError::Inconsistent { .. }) && msg.contains(&want),
                "{msg}"
            );
            let e = Store::open_unchecked(&out, &StoreOptions::default()).err().unwrap();
            assert!(e.to_string().contains(&want), "{e}");
        }
        let mut bad = m.clone();
        bad.layers.clear();
        bad.records.clear();
        let (msg, _) = open_with(&json(&bad));
        assert!(msg.contains("it lists no layer with experts"), "{msg}");
        let mut bad = m.clone();
        bad.layers.swap(0, 1);
        let (msg, _) = open_with(&json(&bad));
        assert!(msg.contains("out of order"), "{msg}");
        let mut bad = m.clone();
        bad.records.pop();
        let (msg, _) = open_with(&json(&bad));
        assert!(msg.contains("15 records listed"), "{msg}");

        std::fs::write(&path, &good).unwrap();
        Store::open(&out, &gguf).unwrap();
        std::fs::remove_file(&path).unwrap();
        let msg = Store::open(&out, &gguf).err().unwrap().to_string();
        assert!(msg.contains("manifest.json cannot be read"), "{msg}");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn direct_io_on_a_filesystem_that_refuses_it_says_so() {
        // procfs rejects O_DIRECT at open with EINVAL (tmpfs did too before Linux 6.6, so it is no test).
        let path = Path::new("/proc/self/status");
        let err = open_records(path, true).unwrap_err();
        assert!(matches!(err, StoreError::DirectIoUnsupported { .. }), "{err}");
        assert!(
            err.to_string()
                .starts_with("/proc/self/status: the filesystem refuses direct I/O (O_DIRECT)"),
            "{err}"
        );
        open_records(path, false).unwrap();
    }
}
