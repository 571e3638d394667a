//! The in-place layout: an index file beside the model that says where each expert's gate, up and down
//! bytes already are inside the GGUF's stacked tensors, and what they hash to, so the store reads experts
//! straight out of the model instead of out of a second copy.
//!
//! The file is binary and small (a 32-byte digest per expert plus a table per layer: 0.2 MB for a model
//! of 48 layers × 128 experts), little-endian, and ends with the BLAKE3 of everything before it, so a
//! truncated or damaged index is refused as such rather than read as a wrong table. `docs/formats.md`
//! lays the format out field by field.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use titan_gguf::GgufFile;
use titan_kernels::GgmlType;

use crate::convert::{remove_stale_partials, sibling, sync_dir};
use titan_layout::{ExpertLayout, ModelIdentity};

use crate::manifest::{LayerEntry, TensorSpec};
use crate::output::{check_output, OutputKind};
use crate::StoreError;

/// The first eight bytes of every index.
const MAGIC: &[u8; 8] = b"TITANIDX";
/// Bumped whenever the index's layout changes incompatibly.
pub const INDEX_VERSION: u32 = 1;
/// Bytes of one layer's table entry: the layer number, then type, rows, cols, offset and bytes for each
/// of gate, up and down.
const LAYER_ENTRY: usize = 4 + 3 * (4 + 8 + 8 + 8 + 8);

/// An in-place index, as read from or written to its file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Index {
    /// The model the index describes (its file name is how `titan verify INDEX` finds it).
    pub source: ModelIdentity,
    pub n_layer: usize,
    pub n_expert: usize,
    /// The MoE layers, ascending, with one expert's gate, up and down shapes and sizes.
    pub layers: Vec<LayerEntry>,
    /// Per MoE layer: the offsets in the GGUF file of expert 0's gate, up and down slices. Expert e's
    /// slice of a part is at `offset + e × bytes`, since a stacked tensor is its experts one after another.
    pub offsets: Vec<[u64; 3]>,
    /// Per (MoE layer, expert), layer-major: BLAKE3 of the expert's gate ‖ up ‖ down bytes — the same
    /// digest a copied store gives the expert's record.
    pub digests: Vec<[u8; 32]>,
}

impl Index {
    /// Index `gguf`'s experts: locate every slice and hash it (every expert byte of the model is read
    /// once); `progress(done, total)` counts expert bytes hashed.
    pub fn build(gguf: &GgufFile, progress: &mut dyn FnMut(u64, u64)) -> Result<Index, StoreError> {
        let layout = ExpertLayout::of(gguf)?;
        let n_expert = layout.n_expert;
        let total = layout.expert_bytes_total();
        let mut digests = Vec::with_capacity(layout.layers.len() * n_expert);
        let mut done = 0;
        for entry in &layout.layers {
            for e in 0..n_expert {
                let digest = layout.digest(gguf, entry.layer, e).ok_or_else(|| StoreError::Model {
                    path: gguf.path().to_path_buf(),
                    what: format!("layer {}'s expert tensors are shorter than their shapes", entry.layer),
                })?;
                digests.push(digest);
                done += entry.record_bytes();
                progress(done, total);
            }
            // The index is made once and the model may be larger than memory: hand the layer's pages
            // back rather than let them crowd out everything else this process holds.
            for (offset, part) in entry.offsets.iter().zip(&entry.parts) {
                gguf.release(*offset as usize, (part.bytes * n_expert as u64) as usize);
            }
        }
        Ok(Index {
            source: ModelIdentity::of(gguf)?,
            n_layer: layout.n_layer,
            n_expert,
            offsets: layout.layers.iter().map(|l| l.offsets).collect(),
            layers: layout.layers.iter().map(LayerEntry::of).collect(),
            digests,
        })
    }

    /// The file's bytes, checksum included.
    pub fn to_bytes(&self) -> Vec<u8> {
        let name = self.source.file_name.as_bytes();
        // File names are at most 255 bytes on every filesystem TITAN runs on; a longer one is cut at a
        // character boundary, which only shortens what `titan verify INDEX` looks for beside the index.
        let mut name_len = name.len().min(u16::MAX as usize);
        while !self.source.file_name.is_char_boundary(name_len) {
            name_len -= 1;
        }
        let mut b = Vec::with_capacity(66 + name_len + self.layers.len() * LAYER_ENTRY + self.digests.len() * 32 + 32);
        b.extend_from_slice(MAGIC);
        for v in [INDEX_VERSION, self.n_layer as u32, self.n_expert as u32] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&(self.layers.len() as u32).to_le_bytes());
        b.extend_from_slice(&self.source.file_size.to_le_bytes());
        let header = blake3::Hash::from_hex(&self.source.header_blake3).map_or([0; 32], |h| *h.as_bytes());
        b.extend_from_slice(&header);
        b.extend_from_slice(&(name_len as u16).to_le_bytes());
        b.extend_from_slice(&name[..name_len]);
        for (l, offsets) in self.layers.iter().zip(&self.offsets) {
            b.extend_from_slice(&(l.layer as u32).to_le_bytes());
            for (spec, offset) in [&l.gate, &l.up, &l.down].into_iter().zip(offsets) {
                let ty = spec.ggml_type().map_or(u32::MAX, GgmlType::id);
                b.extend_from_slice(&ty.to_le_bytes());
                for v in [spec.rows as u64, spec.cols as u64, *offset, spec.bytes] {
                    b.extend_from_slice(&v.to_le_bytes());
                }
            }
        }
        for d in &self.digests {
            b.extend_from_slice(d);
        }
        let sum = blake3::hash(&b);
        b.extend_from_slice(sum.as_bytes());
        b
    }

    /// Read and check an index file: its magic, version, checksum, and that its tables have the sizes
    /// its counts give (nothing about the model yet).
    pub fn load(path: &Path) -> Result<Index, StoreError> {
        let bytes = fs::read(path).map_err(StoreError::io(path))?;
        Index::parse(&bytes).map_err(|e| match e {
            ParseError::Version(found) => StoreError::Version {
                path: path.to_path_buf(),
                found,
                supported: INDEX_VERSION,
            },
            ParseError::Bad(what) => StoreError::Index {
                path: path.to_path_buf(),
                what,
            },
        })
    }

    fn parse(bytes: &[u8]) -> Result<Index, ParseError> {
        let bad = |what: &str| ParseError::Bad(what.to_string());
        // A file cut inside the magic (an empty one included) is a truncated index, not a foreign file.
        if !bytes.starts_with(MAGIC) && !MAGIC.starts_with(bytes) {
            return Err(bad("not a TITAN expert index (it does not start with TITANIDX)"));
        }
        let version = bytes
            .get(8..12)
            .map(|v| u32::from_le_bytes(v.try_into().unwrap_or([0; 4])));
        match version {
            Some(INDEX_VERSION) => {}
            Some(v) => return Err(ParseError::Version(v)),
            None => return Err(bad("the index is truncated (it ends inside its header)")),
        }
        let Some(body_len) = bytes.len().checked_sub(32).filter(|&n| n >= 12) else {
            return Err(bad("the index is truncated (it ends inside its header)"));
        };
        let (body, sum) = bytes.split_at(body_len);
        if blake3::hash(body).as_bytes() != sum {
            return Err(bad("its checksum does not match: the index is truncated or damaged"));
        }
        // The checksum held, so what follows fails only for an index a buggy or hostile writer made;
        // it is still checked, never trusted, before anything is sized by it.
        let mut r = Reader { bytes: body, at: 12 };
        let n_layer = r.u32("n_layer")? as usize;
        let n_expert = r.u32("n_expert")? as usize;
        let n_moe = r.u32("the layer count")? as usize;
        let file_size = r.u64("the model's size")?;
        let header = r.take(32, "the model's header digest")?;
        let name_len = r.u16("the model's name")? as usize;
        let name = std::str::from_utf8(r.take(name_len, "the model's name")?)
            .map_err(|_| bad("the model's file name is not UTF-8"))?;
        let source = ModelIdentity {
            file_name: name.to_string(),
            file_size,
            header_blake3: blake3::Hash::from_bytes(header.try_into().unwrap_or([0; 32]))
                .to_hex()
                .to_string(),
        };
        let digest_count = n_moe.checked_mul(n_expert);
        let want = digest_count
            .and_then(|d| d.checked_mul(32))
            .and_then(|d| d.checked_add(n_moe.checked_mul(LAYER_ENTRY)?));
        if want != Some(body.len() - r.at) {
            return Err(ParseError::Bad(format!(
                "it lists {n_moe} MoE layers of {n_expert} experts but holds {} bytes of tables",
                body.len() - r.at
            )));
        }
        let mut layers = Vec::with_capacity(n_moe);
        let mut offsets = Vec::with_capacity(n_moe);
        for _ in 0..n_moe {
            let layer = r.u32("a layer entry")? as usize;
            let mut specs = Vec::with_capacity(3);
            let mut offs = [0u64; 3];
            for off in &mut offs {
                let ty = r.u32("a layer entry")?;
                let ty = GgmlType::from_id(ty)
                    .ok_or_else(|| ParseError::Bad(format!("layer {layer} has an unknown type id {ty}")))?;
                let rows = r.u64("a layer entry")?;
                let cols = r.u64("a layer entry")?;
                *off = r.u64("a layer entry")?;
                let bytes = r.u64("a layer entry")?;
                let (Ok(rows), Ok(cols)) = (usize::try_from(rows), usize::try_from(cols)) else {
                    return Err(ParseError::Bad(format!("layer {layer}'s shapes overflow")));
                };
                specs.push(TensorSpec {
                    ty: ty.name().to_string(),
                    rows,
                    cols,
                    bytes,
                });
            }
            let [gate, up, down] =
                <[TensorSpec; 3]>::try_from(specs).map_err(|_| bad("a layer entry has not three parts"))?;
            layers.push(LayerEntry { layer, gate, up, down });
            offsets.push(offs);
        }
        let digests = r
            .rest()
            .chunks_exact(32)
            .map(|d| d.try_into().unwrap_or([0; 32]))
            .collect();
        Ok(Index {
            source,
            n_layer,
            n_expert,
            layers,
            offsets,
            digests,
        })
    }
}

enum ParseError {
    Version(u32),
    Bad(String),
}

/// Little-endian fields from the front of a byte slice, each failure naming the field it fell in.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, field: &str) -> Result<&'a [u8], ParseError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let Some(end) = end else {
            return Err(ParseError::Bad(format!(
                "it ends at byte {} inside {field}",
                self.bytes.len()
            )));
        };
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn u16(&mut self, field: &str) -> Result<u16, ParseError> {
        Ok(u16::from_le_bytes(self.take(2, field)?.try_into().unwrap_or([0; 2])))
    }

    fn u32(&mut self, field: &str) -> Result<u32, ParseError> {
        Ok(u32::from_le_bytes(self.take(4, field)?.try_into().unwrap_or([0; 4])))
    }

    fn u64(&mut self, field: &str) -> Result<u64, ParseError> {
        Ok(u64::from_le_bytes(self.take(8, field)?.try_into().unwrap_or([0; 8])))
    }

    fn rest(&self) -> &'a [u8] {
        &self.bytes[self.at..]
    }
}

/// Write the in-place index of `gguf` to the file `out` (conventionally `MODEL.titan-index` beside the
/// model); `progress(done, total)` counts expert bytes hashed. Atomic, as `convert` is: the index is
/// written to `<out>.partial-<pid>`, fsynced and renamed into place.
pub fn write_index(
    gguf: &GgufFile,
    out: &Path,
    force: bool,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Index, StoreError> {
    check_output(out, &[gguf.path()], OutputKind::File)?;
    if out.exists() && !force {
        return Err(StoreError::Exists {
            path: out.to_path_buf(),
        });
    }
    let index = Index::build(gguf, progress)?;
    remove_stale_partials(out);
    let partial: PathBuf = sibling(out, &format!("partial-{}", std::process::id()));
    let written = File::create(&partial)
        .and_then(|mut f| {
            f.write_all(&index.to_bytes())?;
            f.sync_all()
        })
        .map_err(StoreError::io(&partial));
    let result = written
        .and_then(|()| fs::rename(&partial, out).map_err(StoreError::io(out)))
        .and_then(|()| match out.parent().filter(|p| !p.as_os_str().is_empty()) {
            Some(parent) => sync_dir(parent),
            None => Ok(()),
        });
    if result.is_err() {
        // Best effort: the error being returned matters more than a failure to clean up after it.
        let _ = fs::remove_file(&partial);
    }
    result.map(|()| index)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{test_dir, write_model, Spec};
    use crate::{Layout, Store, StoreOptions};
    use std::os::unix::fs::FileExt;

    #[test]
    fn an_index_reads_back_as_written() {
        let dir = test_dir();
        let gguf = write_model(dir.path(), "m.gguf", &Spec::q4_k_m());
        let out = dir.path().join("m.titan-index");
        let mut calls = Vec::new();
        let written = write_index(&gguf, &out, false, &mut |d, t| calls.push((d, t))).unwrap();
        assert_eq!(Index::load(&out).unwrap(), written);
        assert_eq!(written.digests.len(), 2 * 8);
        assert_eq!(written.source.file_name, "m.gguf");
        let (done, total) = *calls.last().unwrap();
        assert_eq!(done, total, "progress ends at the total");
        // The table is small beside the experts it indexes: a digest per expert and 112 bytes a layer.
        let len = std::fs::metadata(&out).unwrap().len();
        assert_eq!(len, 66 + 6 + 2 * 112 + 16 * 32 + 32);

        let err = write_index(&gguf, &out, false, &mut |_, _| {}).unwrap_err();
        assert!(matches!(err, StoreError::Exists { .. }), "{err}");
        write_index(&gguf, &out, true, &mut |_, _| {}).unwrap();
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(!names.iter().any(|n| n.contains(".partial-")), "{names:?}");
    }

    /// Open `index` over `gguf` and return the error's message.
    fn refused(index: &Path, gguf: &GgufFile) -> (StoreError, String) {
        let err = Store::open(index, gguf).err().unwrap();
        let msg = err.to_string();
        (err, msg)
    }

    #[test]
    fn a_truncated_damaged_or_foreign_index_is_refused_with_the_reason() {
        let dir = test_dir();
        let gguf = write_model(dir.path(), "m.gguf", &Spec::mixed());
        let path = dir.path().join("m.titan-index");
        let good = write_index(&gguf, &path, false, &mut |_, _| {}).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let name = path.display().to_string();

        for cut in [bytes.len() - 1, bytes.len() / 2, 40, 10, 0] {
            std::fs::write(&path, &bytes[..cut]).unwrap();
            let (e, msg) = refused(&path, &gguf);
            assert!(matches!(e, StoreError::Index { .. }), "cut at {cut}: {msg}");
            assert!(msg.starts_with(&format!("{name}: ")), "{msg}");
            assert!(msg.contains("truncated"), "cut at {cut}: {msg}");
            assert!(msg.ends_with("re-run titan convert --layout in-place"), "{msg}");
        }
        for at in [20, 70, bytes.len() - 100, bytes.len() - 1] {
            let mut bad = bytes.clone();
            bad[at] ^= 0x01;
            std::fs::write(&path, &bad).unwrap();
            let (_, msg) = refused(&path, &gguf);
            assert!(msg.contains("checksum does not match"), "byte {at}: {msg}");
        }
        let mut bad = bytes.clone();
        bad[0] = b'X';
        std::fs::write(&path, &bad).unwrap();
        assert!(refused(&path, &gguf).1.contains("not a TITAN expert index"));
        let mut bad = bytes.clone();
        bad[8..12].copy_from_slice(&2u32.to_le_bytes());
        std::fs::write(&path, &bad).unwrap();
        let (e, msg) = refused(&path, &gguf);
        assert!(
            matches!(
                e,
                StoreError::Version {
                    found: 2,
                    supported: 1,
                    ..
                }
            ),
            "{msg}"
        );

        // Well-formed and checksummed, but wrong: the checks behind the checksum still hold.
        let rewrite = |index: &Index| std::fs::write(&path, index.to_bytes()).unwrap();
        let mut bad = good.clone();
        bad.offsets[1][2] += 64;
        rewrite(&bad);
        let (e, msg) = refused(&path, &gguf);
        assert!(matches!(e, StoreError::Index { .. }), "{msg}");
        assert!(msg.contains("layer 1's expert offsets are not the model's"), "{msg}");
        let mut bad = good.clone();
        bad.offsets[3][0] = u64::MAX - 8;
        rewrite(&bad);
        assert!(refused(&path, &gguf).1.contains("run past the end of"));
        let mut bad = good.clone();
        bad.digests.pop();
        rewrite(&bad);
        assert!(refused(&path, &gguf)
            .1
            .contains("lists 4 MoE layers of 6 experts but holds"));
        let mut bad = good.clone();
        bad.layers[2].up.ty = "Q4_K".into();
        rewrite(&bad);
        assert!(refused(&path, &gguf).1.contains("layer 2's up expert is Q4_K"));
        let mut bad = good.clone();
        // Opening hashes expert i % n_expert of the i-th MoE layer: expert 3 of layer 3 here.
        bad.digests[3 * 6 + 3][0] ^= 1;
        rewrite(&bad);
        let (e, _) = refused(&path, &gguf);
        assert!(
            matches!(
                e,
                StoreError::NotFromModel {
                    layer: 3,
                    expert: 3,
                    ..
                }
            ),
            "{e}"
        );

        // An index of another model: refused by the model's identity.
        rewrite(&good);
        let other = write_model(
            dir.path(),
            "other.gguf",
            &Spec {
                seed: 5,
                ..Spec::mixed()
            },
        );
        let (e, msg) = refused(&path, &other);
        assert!(matches!(e, StoreError::WrongModel { .. }), "{msg}");
        assert!(msg.contains("was made from m.gguf"), "{msg}");
        Store::open(&path, &gguf).unwrap();
    }

    #[test]
    fn verify_without_a_model_finds_it_beside_the_index_or_says_where_it_looked() {
        let dir = test_dir();
        let gguf = write_model(dir.path(), "m.gguf", &Spec::mixed());
        let path = dir.path().join("m.titan-index");
        write_index(&gguf, &path, false, &mut |_, _| {}).unwrap();
        let store = Store::open_unchecked(&path, &StoreOptions::default()).unwrap();
        assert_eq!((store.layout(), store.file_path()), (Layout::InPlace, gguf.path()));
        let report = store.verify(&mut |_, _| {}).unwrap();
        assert!(report.is_ok() && report.records == 24, "{:?}", report.bad);

        std::fs::rename(gguf.path(), dir.path().join("moved.gguf")).unwrap();
        let err = Store::open_unchecked(&path, &StoreOptions::default()).err().unwrap();
        assert!(matches!(err, StoreError::IndexedModel { .. }), "{err}");
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("indexes {}", gguf.path().display())) && msg.ends_with("pass the model with --model"),
            "{msg}"
        );
    }

    #[test]
    fn a_flipped_model_byte_is_caught_by_the_read_that_uses_it() {
        let dir = test_dir();
        let spec = Spec::q4_k_m();
        let gguf_path = write_model(dir.path(), "m.gguf", &spec).path().to_path_buf();
        let path = dir.path().join("m.titan-index");
        let index = write_index(&GgufFile::open(&gguf_path).unwrap(), &path, false, &mut |_, _| {}).unwrap();
        // Expert 5 of layer 2 (the second MoE layer): its down slice, one byte in. Open samples expert
        // 1 of that layer, so the damage is found by the read, as it would be after opening.
        let l = &index.layers[1];
        let at = index.offsets[1][2] + 5 * l.down.bytes + 1;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&gguf_path)
            .unwrap();
        let mut b = [0u8];
        file.read_exact_at(&mut b, at).unwrap();
        file.write_all_at(&[b[0] ^ 0x80], at).unwrap();

        let gguf = GgufFile::open(&gguf_path).unwrap();
        for direct_io in [false, true] {
            let opts = StoreOptions {
                direct_io,
                verify_digests: true,
            };
            let store = Store::open_with(&path, &gguf, &opts).unwrap();
            let err = store.read(2, 5).unwrap_err();
            let gate = index.offsets[1][0] + 5 * l.gate.bytes;
            assert!(
                matches!(err, StoreError::Digest { layer: 2, expert: 5, offset, .. } if offset == gate),
                "{err}"
            );
            let msg = err.to_string();
            assert!(
                msg.starts_with(&format!(
                    "expert 5 of layer 2 failed its digest check in {} (offset {gate:#x}): \
                     the model changed or is damaged",
                    gguf_path.display()
                )),
                "{msg}"
            );
            store.read(2, 4).unwrap();
            let report = store.verify(&mut |_, _| {}).unwrap();
            assert_eq!(report.bad.len(), 1, "{:?}", report.bad);
            assert_eq!(store.source_mismatches(&gguf, true).unwrap(), vec![(2, 5)]);
        }
        // With checking off, the damaged bytes come back: the user's choice, as with a copy.
        let opts = StoreOptions {
            direct_io: false,
            verify_digests: false,
        };
        Store::open_with(&path, &gguf, &opts).unwrap().read(2, 5).unwrap();
    }
}
