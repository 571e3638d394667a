//! `Store`: open a store directory, check it against the model, and read records with positional reads
//! into aligned buffers, optionally bypassing the page cache, checking each record's digest.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;

use titan_gguf::GgufFile;

use crate::manifest::{
    expert_tensors, ExpertLayout, LayerEntry, Manifest, SourceIdentity, TensorSpec,
};
use crate::record::{Part, RecordShape};
use crate::{AlignedBuf, ExpertRecord, StoreError, EXPERTS_FILE, MANIFEST_FILE, MIN_ALIGNMENT};

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

/// Where a record is and what it must hash to.
struct Loc {
    offset: u64,
    length: u64,
    digest: [u8; 32],
}

pub struct Store {
    dir: PathBuf,
    bin_path: PathBuf,
    /// Where record bytes come from: `experts.bin`, or what [`Store::with_source`] put in its place.
    source: Box<dyn RecordSource>,
    opts: StoreOptions,
    manifest: Manifest,
    /// One per MoE layer, in the order of `manifest.layers` (ascending layer numbers). Nothing here is
    /// sized by the manifest's `n_layer`, which is only a number compared with the model's.
    shapes: Vec<RecordShape>,
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

impl Store {
    /// Open with default options (buffered reads, digests checked).
    pub fn open(dir: &Path, gguf: &GgufFile) -> Result<Store, StoreError> {
        Store::open_with(dir, gguf, &StoreOptions::default())
    }

    /// Open `dir` and check that it was made from `gguf` and matches its expert tensors.
    pub fn open_with(
        dir: &Path,
        gguf: &GgufFile,
        opts: &StoreOptions,
    ) -> Result<Store, StoreError> {
        let store = Store::open_unchecked(dir, opts)?;
        let m = &store.manifest;
        let source = SourceIdentity::of(gguf)?;
        if !m.source.matches(&source) {
            return Err(StoreError::WrongModel {
                dir: dir.to_path_buf(),
                made_from: m.source.file_name.clone(),
                made_size: m.source.file_size,
                model: gguf.path().to_path_buf(),
            });
        }
        let layout = ExpertLayout::of(gguf, &expert_tensors(gguf)?)?;
        if let Some(what) = layout_difference(m, &layout) {
            return Err(StoreError::Inconsistent {
                path: dir.join(MANIFEST_FILE),
                what,
            });
        }
        // The header can be copied from another store's manifest, and models that differ only in their
        // weights (fine-tunes, synthetic files of other seeds) share it: the binding is the expert bytes
        // themselves. One expert per MoE layer is hashed here; `titan verify --model` hashes all of them.
        if let Some(&(layer, expert)) = store.source_mismatches(gguf, false)?.first() {
            return Err(StoreError::NotFromModel {
                dir: dir.to_path_buf(),
                layer,
                expert,
                model: gguf.path().to_path_buf(),
            });
        }
        Ok(store)
    }

    /// The (layer, expert) pairs whose bytes in `gguf` do not have the digest of their record here: every
    /// expert when `all`, else one per MoE layer (a different one in each, so a few layers already cover
    /// several expert ids). The model's layout must already match the manifest's.
    pub fn source_mismatches(
        &self,
        gguf: &GgufFile,
        all: bool,
    ) -> Result<Vec<(usize, usize)>, StoreError> {
        let tensors = expert_tensors(gguf)?;
        let n_expert = self.manifest.n_expert;
        let mut bad = Vec::new();
        for (i, (lt, entry)) in tensors.iter().zip(&self.manifest.layers).enumerate() {
            let experts = if all { 0..n_expert } else { i % n_expert..i % n_expert + 1 };
            for e in experts {
                let mut hasher = blake3::Hasher::new();
                for (t, spec) in [(lt.gate, &entry.gate), (lt.up, &entry.up), (lt.down, &entry.down)] {
                    let start = gguf.data_offset + t.offset + e as u64 * spec.bytes;
                    let bytes = usize::try_from(start)
                        .ok()
                        .zip(usize::try_from(spec.bytes).ok())
                        .and_then(|(s, n)| gguf.bytes(s, n))
                        .ok_or_else(|| StoreError::Model {
                            path: gguf.path().to_path_buf(),
                            what: format!("{} expert {e} lies past the end of the file", t.name),
                        })?;
                    hasher.update(bytes);
                }
                if *hasher.finalize().as_bytes() != self.locs[i * n_expert + e].digest {
                    bad.push((entry.layer, e));
                }
            }
        }
        Ok(bad)
    }

    /// Open `dir` without a model: the manifest is checked for consistency with itself and with the size
    /// of `experts.bin`, but not against a GGUF. For `titan verify`, which then checks every digest.
    pub fn open_unchecked(dir: &Path, opts: &StoreOptions) -> Result<Store, StoreError> {
        if crate::convert::is_partial(dir) {
            return Err(StoreError::Unfinished {
                path: dir.to_path_buf(),
            });
        }
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
        let mut shapes = Vec::with_capacity(manifest.layers.len());
        for (i, l) in manifest.layers.iter().enumerate() {
            if l.layer >= manifest.n_layer || i > 0 && l.layer <= manifest.layers[i - 1].layer {
                return Err(bad(format!(
                    "layer {} is out of order or not below n_layer {}",
                    l.layer, manifest.n_layer
                )));
            }
            shapes.push(record_shape(l).ok_or_else(|| {
                bad(format!("layer {} has a type TITAN does not know", l.layer))
            })?);
        }
        let locs = check_records(&manifest).map_err(bad)?;

        let bin_path = dir.join(EXPERTS_FILE);
        let file = open_records(&bin_path, opts.direct_io)?;
        let actual = file.metadata().map_err(StoreError::io(&bin_path))?.len();
        let expected = locs
            .last()
            .map_or(0, |l| l.offset + l.length.next_multiple_of(align));
        if actual < expected {
            return Err(StoreError::Truncated {
                path: bin_path,
                actual,
                expected,
            });
        }
        Ok(Store {
            dir: dir.to_path_buf(),
            bin_path,
            source: Box::new(file),
            opts: opts.clone(),
            manifest,
            shapes,
            locs,
        })
    }

    /// Reads the records through `source` instead of `experts.bin` (same offsets and lengths): how a test
    /// puts a failing or lying disk under the store and the cache, everything above it unchanged.
    pub fn with_source(mut self, source: impl RecordSource + 'static) -> Store {
        self.source = Box::new(source);
        self
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    pub fn n_layer(&self) -> usize {
        self.manifest.n_layer
    }

    pub fn n_expert(&self) -> usize {
        self.manifest.n_expert
    }

    /// Whether `layer` has experts in the store (dense layers do not).
    pub fn is_moe_layer(&self, layer: usize) -> bool {
        self.layer_index(layer).is_some()
    }

    /// Position of `layer` in the manifest's table of MoE layers.
    fn layer_index(&self, layer: usize) -> Option<usize> {
        self.manifest.layers.binary_search_by_key(&layer, |l| l.layer).ok()
    }

    /// Bytes a record takes to read and to hold: its length padded to the alignment.
    pub fn record_bytes(&self, layer: usize, expert: usize) -> Option<u64> {
        self.loc(layer, expert)
            .map(|l| l.length.next_multiple_of(self.manifest.alignment))
    }

    /// The largest `record_bytes` of any record.
    pub fn max_record_bytes(&self) -> u64 {
        self.locs
            .iter()
            .map(|l| l.length.next_multiple_of(self.manifest.alignment))
            .max()
            .unwrap_or(0)
    }

    /// Read one record (one positional read of the whole padded record), checking its digest unless
    /// digests were turned off. A record that fails its digest is dropped, never returned.
    pub fn read(&self, layer: usize, expert: usize) -> Result<ExpertRecord, StoreError> {
        self.read_checked(layer, expert, self.opts.verify_digests)
    }

    fn read_checked(
        &self,
        layer: usize,
        expert: usize,
        check: bool,
    ) -> Result<ExpertRecord, StoreError> {
        let (Some(loc), Some(shape)) = (
            self.loc(layer, expert),
            self.layer_index(layer).map(|i| &self.shapes[i]),
        ) else {
            return Err(StoreError::NoRecord { layer, expert });
        };
        let align = self.manifest.alignment as usize;
        let span = loc.length.next_multiple_of(self.manifest.alignment);
        let too_big = || StoreError::Io {
            path: self.bin_path.clone(),
            source: std::io::Error::new(
                std::io::ErrorKind::OutOfMemory,
                format!("cannot allocate {span} bytes for a record"),
            ),
        };
        let mut buf = usize::try_from(span)
            .ok()
            .and_then(|n| AlignedBuf::zeroed(n, align))
            .ok_or_else(too_big)?;
        self.read_exact_at(buf.as_mut_slice(), loc.offset)?;
        if check && blake3::hash(&buf.as_slice()[..loc.length as usize]).as_bytes() != &loc.digest {
            return Err(StoreError::Digest {
                layer,
                expert,
                path: self.bin_path.clone(),
                offset: loc.offset,
            });
        }
        Ok(ExpertRecord::new(layer, expert, *shape, buf))
    }

    fn read_exact_at(&self, mut dst: &mut [u8], mut offset: u64) -> Result<(), StoreError> {
        let expected = offset + dst.len() as u64;
        while !dst.is_empty() {
            match self.source.read_at(dst, offset) {
                Ok(0) => {
                    return Err(StoreError::Truncated {
                        path: self.bin_path.clone(),
                        actual: offset,
                        expected,
                    })
                }
                Ok(n) => {
                    dst = &mut dst[n..];
                    offset += n as u64;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                // O_DIRECT reads fail with EINVAL when the device's block is larger than the store alignment.
                Err(e) if self.opts.direct_io && e.raw_os_error() == Some(libc::EINVAL) => {
                    return Err(StoreError::DirectIoUnsupported {
                        path: self.bin_path.clone(),
                        source: e,
                    })
                }
                Err(e) => {
                    return Err(StoreError::Io {
                        path: self.bin_path.clone(),
                        source: e,
                    })
                }
            }
        }
        Ok(())
    }

    /// Read every record and check every digest, on one reader thread per core (at most 8: enough to keep
    /// an NVMe queue busy while hashing); `progress(done, total)` counts record bytes. All bad records are
    /// reported, not just the first; `Err` only if the reader threads could not run.
    pub fn verify(&self, progress: &mut dyn FnMut(u64, u64)) -> Result<VerifyReport, StoreError> {
        let threads = std::thread::available_parallelism().map_or(4, |n| n.get().min(8));
        let total: u64 = self.locs.iter().map(|l| l.length).sum();
        let keys: Vec<(usize, usize)> = self
            .manifest
            .records
            .iter()
            .map(|r| (r.layer, r.expert))
            .collect();
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
                        .send((i, self.read_checked(layer, expert, true).err()))
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
                done += self.locs[i].length;
                results[i] = err;
                progress(done, total);
            }
            // Fewer threads than asked for only slows the check; none at all is an error.
            match spawn_error {
                Some(e) if spawned == 0 => Err(e),
                _ => Ok(()),
            }
        });
        spawned.map_err(StoreError::io(&self.bin_path))?;
        Ok(VerifyReport {
            records: keys.len(),
            bytes: total,
            bad: results.into_iter().flatten().collect(),
        })
    }

    fn loc(&self, layer: usize, expert: usize) -> Option<&Loc> {
        if expert >= self.manifest.n_expert {
            return None;
        }
        self.locs
            .get(self.layer_index(layer)? * self.manifest.n_expert + expert)
    }
}

/// What differs between a manifest's layer table and a model's expert tensors, if anything.
fn layout_difference(m: &Manifest, model: &ExpertLayout) -> Option<String> {
    if (m.n_layer, m.n_expert) != (model.n_layer, model.n_expert) {
        return Some(format!(
            "the store has {} layers of {} experts, the model {} layers of {}",
            m.n_layer, m.n_expert, model.n_layer, model.n_expert
        ));
    }
    let layers = |t: &[LayerEntry]| t.iter().map(|l| l.layer).collect::<Vec<_>>();
    if layers(&m.layers) != layers(&model.layers) {
        return Some(format!(
            "the store has experts in layers {:?}, the model in {:?}",
            layers(&m.layers),
            layers(&model.layers)
        ));
    }
    let describe = |s: &TensorSpec| format!("{} {}×{} ({} bytes)", s.ty, s.rows, s.cols, s.bytes);
    for (ours, theirs) in m.layers.iter().zip(&model.layers) {
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

fn record_shape(l: &LayerEntry) -> Option<RecordShape> {
    let part = |s: &TensorSpec, start: u64| -> Option<Part> {
        Some(Part {
            ty: s.ggml_type()?,
            rows: s.rows,
            cols: s.cols,
            start: usize::try_from(start).ok()?,
            len: usize::try_from(s.bytes).ok()?,
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
        .zip(
            m.layers
                .iter()
                .flat_map(|l| std::iter::repeat_n(l, m.n_expert)),
        )
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
        let digest = blake3::Hash::from_hex(&r.blake3)
            .map_err(|e| format!("{what} digest {:?}: {e}", r.blake3))?;
        locs.push(Loc {
            offset: r.offset,
            length: r.length,
            digest: *digest.as_bytes(),
        });
    }
    Ok(locs)
}

/// Open `experts.bin` for reading, with O_DIRECT (Linux) or F_NOCACHE (macOS) when asked.
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
                source: e,
            },
            _ => StoreError::Io {
                path: path.to_path_buf(),
                source: e,
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
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(f)
    }
    #[cfg(not(any(target_os = "linux", target_os = "macos")))]
    {
        let source = std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "no direct I/O on this platform",
        );
        Err(StoreError::DirectIoUnsupported {
            path: path.to_path_buf(),
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{convert_default, gguf_slice, test_dir, write_model, Spec};
    use titan_kernels::WeightView;

    fn check_all_records(store: &Store, gguf: &GgufFile) {
        for r in &store.manifest().records {
            let rec = store.read(r.layer, r.expert).unwrap();
            assert_eq!((rec.layer, rec.expert), (r.layer, r.expert));
            for (part, t) in [("gate", rec.gate()), ("up", rec.up()), ("down", rec.down())] {
                assert!(
                    t.data == gguf_slice(gguf, r.layer, r.expert, part),
                    "{part} of ({}, {})",
                    r.layer,
                    r.expert
                );
                let info = gguf
                    .tensor(&format!("blk.{}.ffn_{part}_exps.weight", r.layer))
                    .unwrap();
                assert_eq!(
                    (t.ty, t.cols as u64, t.rows as u64),
                    (info.ty, info.dims[0], info.dims[1])
                );
                WeightView::new(t.ty, t.rows, t.cols, t.data).unwrap();
                assert_eq!(t.weight_view().data.len(), t.data.len());
            }
            assert_eq!(
                rec.resident_bytes(),
                store.record_bytes(r.layer, r.expert).unwrap()
            );
            assert_eq!(rec.bytes().len() as u64, r.length);
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
            for direct_io in [false, true] {
                let store = Store::open_with(
                    &out,
                    &gguf,
                    &StoreOptions {
                        direct_io,
                        verify_digests: true,
                    },
                )
                .unwrap();
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

        let m = store.manifest().clone();
        let (a, b) = (3, 12);
        let off_a = corrupt(&out, &m, a);
        let off_b = corrupt(&out, &m, b);
        let (ra, rb) = (&m.records[a], &m.records[b]);
        let err = store.read(ra.layer, ra.expert).unwrap_err();
        assert!(
            matches!(err, StoreError::Digest { layer, expert, offset, .. } if (layer, expert, offset) == (ra.layer, ra.expert, off_a))
        );
        let want = format!(
            "expert {} of layer {} failed its digest check in {} (offset {:#x}): re-run titan convert",
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
                    layer,
                    expert,
                    offset,
                    ..
                } => (*layer, *expert, *offset),
                other => panic!("{other}"),
            })
            .collect();
        assert_eq!(
            bad,
            vec![(ra.layer, ra.expert, off_a), (rb.layer, rb.expert, off_b)]
        );

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
            msg.contains("experts.bin is")
                && msg.contains("truncated")
                && msg.contains("titan convert"),
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
            msg.contains("was made from a.gguf")
                && msg.contains(&format!("run titan convert {}", b.path().display())),
            "{msg}"
        );
        // A renamed copy of the same model is the same model.
        std::fs::copy(a.path(), dir.path().join("renamed.gguf")).unwrap();
        Store::open(
            &out,
            &GgufFile::open(dir.path().join("renamed.gguf")).unwrap(),
        )
        .unwrap();
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
            Store::open(&out, &gguf)
                .err()
                .map(|e| (e.to_string(), e))
                .unwrap()
        };
        let json = |m: &Manifest| serde_json::to_string(m).unwrap();

        let (msg, e) = open_with(&good[..good.len() / 2]);
        assert!(
            matches!(e, StoreError::ManifestParse { .. })
                && msg.contains("model.titan/manifest.json does not parse: "),
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
            matches!(e, StoreError::Inconsistent { .. })
                && msg.contains("record 5 (layer 1, expert 5)"),
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
        // A layer count nothing backs is compared, never allocated for.
        let mut bad = m.clone();
        bad.n_layer = usize::MAX;
        let (msg, _) = open_with(&json(&bad));
        assert!(
            msg.contains(&format!("the store has {} layers of", usize::MAX)),
            "{msg}"
        );
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
        assert!(
            matches!(err, StoreError::DirectIoUnsupported { .. }),
            "{err}"
        );
        assert!(
            err.to_string()
                .starts_with("/proc/self/status: the filesystem refuses direct I/O (O_DIRECT)"),
            "{err}"
        );
        open_records(path, false).unwrap();
    }
}
