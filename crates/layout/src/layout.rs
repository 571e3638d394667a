//! Where each (layer, expert) matrix lies in a GGUF file, and what its bytes hash to.

use std::path::PathBuf;

use titan_gguf::{GgufFile, TensorInfo};
use titan_kernels::GgmlType;

use crate::names::{bias_name, is_expert_tensor, parse_weight_name, weight_name, Part};

/// BLAKE3 of an expert's gate ‖ up ‖ down bytes: the digest a store record and an index entry give the
/// expert. A shard's digest ([`ExpertLayout::carried_digest`]) also covers the expert's bias rows, if the
/// model has them; for every other model the two are the same.
pub type Digest = [u8; 32];

#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error(
        "{path}: no expert tensors (blk.N.ffn_gate_exps.weight, ffn_up_exps, ffn_down_exps): not an MoE model",
        path = path.display()
    )]
    NoExperts { path: PathBuf },
    #[error("{path}: {what}", path = path.display())]
    Model { path: PathBuf, what: String },
}

/// One expert's matrix of a stacked tensor: `rows` rows of `cols` elements of `ty`, `bytes` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slice {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub bytes: u64,
}

/// One MoE layer's experts: the shape of each part and where expert 0's slice of it starts in the file
/// (expert `e`'s is `e × bytes` further on).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerExperts {
    pub layer: usize,
    /// Gate, up, down.
    pub parts: [Slice; 3],
    /// File offsets of expert 0's gate, up and down.
    pub offsets: [u64; 3],
    /// The experts' bias rows, if the model has them (gpt-oss).
    pub biases: Option<LayerBiases>,
}

/// One MoE layer's expert biases, `blk.L.ffn_{gate,up,down}_exps.bias` (`[len, n_expert]`): like the
/// matrices, expert `e`'s row of a part is one contiguous byte range, `e × bytes` after expert 0's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerBiases {
    /// Gate, up, down: each one row (`rows` is 1) of `cols` elements.
    pub parts: [Slice; 3],
    /// File offsets of expert 0's gate, up and down rows.
    pub offsets: [u64; 3],
}

impl LayerBiases {
    /// File offset and length of expert `e`'s bias row of `part`.
    pub fn range(&self, e: usize, part: Part) -> (u64, u64) {
        let s = self.parts[part as usize];
        (self.offsets[part as usize] + e as u64 * s.bytes, s.bytes)
    }
}

impl LayerExperts {
    pub fn part(&self, p: Part) -> &Slice {
        &self.parts[p as usize]
    }

    /// Gate + up + down bytes of one expert.
    pub fn record_bytes(&self) -> u64 {
        self.parts.iter().map(|s| s.bytes).sum()
    }

    /// File offset and length of expert `e`'s slice of `part`.
    pub fn range(&self, e: usize, part: Part) -> (u64, u64) {
        let s = self.parts[part as usize];
        (self.offsets[part as usize] + e as u64 * s.bytes, s.bytes)
    }
}

/// A model file's experts: every MoE layer's three stacked tensors, checked to be whole expert slices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpertLayout {
    /// Layers of the model, MoE or not (`block_count`).
    pub n_layer: usize,
    pub n_expert: usize,
    /// The MoE layers, ascending; dense layers (DeepSeek's first) have no entry.
    pub layers: Vec<LayerExperts>,
}

impl ExpertLayout {
    /// The experts of `gguf`: a model, or a shard of one (whose tensors hold only some experts; then
    /// `n_expert` is how many). An error if it has none, or if a layer's tensors are not whole slices.
    pub fn of(gguf: &GgufFile) -> Result<ExpertLayout, LayoutError> {
        let err = |what: String| LayoutError::Model {
            path: gguf.path().to_path_buf(),
            what,
        };
        let mut layers: Vec<usize> = gguf
            .tensors
            .iter()
            .filter_map(|t| parse_weight_name(&t.name).map(|(l, _)| l))
            .collect();
        layers.sort_unstable();
        layers.dedup();
        let Some(&first) = layers.first() else {
            return Err(LayoutError::NoExperts {
                path: gguf.path().to_path_buf(),
            });
        };
        let tensor = |layer: usize, part: Part| {
            let name = weight_name(layer, part);
            gguf.tensor(&name)
                .ok_or_else(|| err(format!("layer {layer} has some expert tensors but no {name}")))
        };
        let first_gate = tensor(first, Part::Gate)?;
        let n_expert = first_gate.dims.get(2).copied().unwrap_or(0);
        let slice = |t: &TensorInfo| -> Result<Slice, LayoutError> {
            let [cols, rows, n] = t.dims[..] else {
                return Err(err(format!(
                    "{} has dims {:?}; expected [cols, rows, n_expert]",
                    t.name, t.dims
                )));
            };
            if n != n_expert || n == 0 {
                return Err(err(format!(
                    "{} has {n} experts; expected {n_expert} as in {}",
                    t.name, first_gate.name
                )));
            }
            let (cols, rows) = (usize::try_from(cols).ok(), usize::try_from(rows).ok());
            let bytes = cols
                .zip(rows)
                .and_then(|(c, r)| t.ty.row_bytes(c)?.checked_mul(r))
                .filter(|b| (*b as u64).checked_mul(n) == Some(t.size))
                .ok_or_else(|| {
                    err(format!(
                        "{} ({} {:?}) is not n_expert whole expert slices",
                        t.name, t.ty, t.dims
                    ))
                })?;
            Ok(Slice {
                ty: t.ty,
                rows: rows.unwrap_or(0),
                cols: cols.unwrap_or(0),
                bytes: bytes as u64,
            })
        };
        // A bias tensor `[len, n_expert]` of a part whose matrices have `len` rows: one row per expert.
        let bias_row = |t: &TensorInfo, len: usize| -> Result<Slice, LayoutError> {
            let bytes = t
                .ty
                .row_bytes(len)
                .filter(|&b| t.dims[..] == [len as u64, n_expert] && (b as u64).checked_mul(n_expert) == Some(t.size))
                .ok_or_else(|| {
                    err(format!(
                        "{} ({} {:?}) is not one row of {len} per expert of {n_expert}",
                        t.name, t.ty, t.dims
                    ))
                })?;
            Ok(Slice {
                ty: t.ty,
                rows: 1,
                cols: len,
                bytes: bytes as u64,
            })
        };
        let mut entries = Vec::with_capacity(layers.len());
        for &layer in &layers {
            let ts = Part::ALL.map(|p| tensor(layer, p));
            let [g, u, d] = ts;
            let ts = [g?, u?, d?];
            let parts = [slice(ts[0])?, slice(ts[1])?, slice(ts[2])?];
            let biases = match Part::ALL.map(|p| gguf.tensor(&bias_name(layer, p))) {
                [None, None, None] => None,
                [Some(g), Some(u), Some(d)] => Some(LayerBiases {
                    parts: [
                        bias_row(g, parts[0].rows)?,
                        bias_row(u, parts[1].rows)?,
                        bias_row(d, parts[2].rows)?,
                    ],
                    offsets: [g, u, d].map(|t| gguf.data_offset + t.offset),
                }),
                _ => {
                    return Err(err(format!(
                        "layer {layer} has some expert bias tensors but not all three ({})",
                        bias_name(layer, Part::Gate)
                    )))
                }
            };
            entries.push(LayerExperts {
                layer,
                parts,
                offsets: ts.map(|t| gguf.data_offset + t.offset),
                biases,
            });
        }
        let last = layers.last().map_or(0, |l| l + 1);
        let block_count = gguf
            .get("general.architecture")
            .and_then(|v| v.as_str())
            .and_then(|a| gguf.get(&format!("{a}.block_count")))
            .and_then(|v| v.as_u64())
            .and_then(|n| usize::try_from(n).ok());
        Ok(ExpertLayout {
            n_layer: block_count.unwrap_or(last).max(last),
            n_expert: usize::try_from(n_expert).map_err(|_| err(format!("{n_expert} experts overflow usize")))?,
            layers: entries,
        })
    }

    /// Layer `layer`'s experts, if it has any.
    pub fn layer(&self, layer: usize) -> Option<&LayerExperts> {
        let i = self.layers.binary_search_by_key(&layer, |l| l.layer).ok()?;
        Some(&self.layers[i])
    }

    /// Expert `e` of `layer`'s gate, up and down bytes in `gguf` (the file this layout was read from).
    pub fn expert_bytes<'f>(&self, gguf: &'f GgufFile, layer: usize, e: usize) -> Option<[&'f [u8]; 3]> {
        let l = self.layer(layer).filter(|_| e < self.n_expert)?;
        let part = |p: Part| {
            let (offset, len) = l.range(e, p);
            gguf.bytes(usize::try_from(offset).ok()?, usize::try_from(len).ok()?)
        };
        Some([part(Part::Gate)?, part(Part::Up)?, part(Part::Down)?])
    }

    /// Expert `e` of `layer`'s gate, up and down bias rows in `gguf`, if the model has expert biases.
    pub fn bias_bytes<'f>(&self, gguf: &'f GgufFile, layer: usize, e: usize) -> Option<[&'f [u8]; 3]> {
        let b = self.layer(layer).filter(|_| e < self.n_expert)?.biases.as_ref()?;
        let part = |p: Part| {
            let (offset, len) = b.range(e, p);
            gguf.bytes(usize::try_from(offset).ok()?, usize::try_from(len).ok()?)
        };
        Some([part(Part::Gate)?, part(Part::Up)?, part(Part::Down)?])
    }

    /// Expert `e` of `layer`'s digest in `gguf`.
    pub fn digest(&self, gguf: &GgufFile, layer: usize, e: usize) -> Option<Digest> {
        self.expert_bytes(gguf, layer, e).map(digest_of)
    }

    /// The digest of everything a shard carries of expert `e` of `layer`: gate ‖ up ‖ down, then its gate,
    /// up and down bias rows if the model has them. One digest per expert, not a second one for the
    /// biases, so that the digests a backbone's assignment gives a node vouch for the biases too with no
    /// change to the assignment. A store's records hold the matrices only (the biases stay with the
    /// model's dense weights), so their digests stay [`Self::digest`]; without biases the two are equal.
    pub fn carried_digest(&self, gguf: &GgufFile, layer: usize, e: usize) -> Option<Digest> {
        let matrices = self.expert_bytes(gguf, layer, e)?;
        let biases = match self.layer(layer)?.biases {
            Some(_) => Some(self.bias_bytes(gguf, layer, e)?),
            None => None,
        };
        Some(digest_of(matrices.into_iter().chain(biases.into_iter().flatten())))
    }

    /// Gate + up + down bytes of every expert of every layer.
    pub fn expert_bytes_total(&self) -> u64 {
        self.layers
            .iter()
            .map(|l| l.record_bytes() * self.n_expert as u64)
            .sum()
    }
}

/// BLAKE3 of `parts` one after another: gate ‖ up ‖ down (‖ the bias rows, for a shard's digest).
pub fn digest_of<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> Digest {
    let mut h = blake3::Hasher::new();
    for p in parts {
        h.update(p);
    }
    *h.finalize().as_bytes()
}

/// Dense (non-expert) and expert bytes of a GGUF file's tensors.
pub fn dense_and_expert_bytes(f: &GgufFile) -> (u64, u64) {
    f.tensors.iter().fold((0, 0), |(d, e), t| {
        if is_expert_tensor(&t.name) {
            (d, e + t.size)
        } else {
            (d + t.size, e)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn fixture(name: &str) -> GgufFile {
        GgufFile::open(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../tests/fixtures")
                .join(name),
        )
        .unwrap()
    }

    /// The layout finds every layer's experts, and an expert's bytes are its slice of each stacked tensor.
    #[test]
    fn experts_are_slices_of_the_stacked_tensors() {
        let f = fixture("qwen3moe/q8_0.gguf");
        let l = ExpertLayout::of(&f).unwrap();
        assert_eq!((l.n_layer, l.n_expert, l.layers.len()), (2, 8, 2));
        for entry in &l.layers {
            for part in Part::ALL {
                let t = f.tensor(&weight_name(entry.layer, part)).unwrap();
                let whole = f.tensor_data(t);
                let per = entry.part(part).bytes as usize;
                assert_eq!(per * l.n_expert, whole.len());
                let [g, u, d] = l.expert_bytes(&f, entry.layer, 5).unwrap();
                let got = [g, u, d][part as usize];
                assert_eq!(got, &whole[5 * per..6 * per]);
            }
        }
        assert!(l.expert_bytes(&f, 0, 8).is_none() && l.expert_bytes(&f, 7, 0).is_none());
        // The digest covers the three parts in order.
        let [g, u, d] = l.expert_bytes(&f, 1, 3).unwrap();
        let joined: Vec<u8> = [g, u, d].concat();
        assert_eq!(l.digest(&f, 1, 3).unwrap(), *blake3::hash(&joined).as_bytes());
        assert_ne!(l.digest(&f, 1, 3), l.digest(&f, 1, 4));
    }

    /// gpt-oss's bias rows are slices of the stacked bias tensors; a shard's digest covers them, and is
    /// the store's digest for a model without biases.
    #[test]
    fn bias_rows_are_slices_and_a_shard_digest_covers_them() {
        let f = fixture("gpt-oss/q8_0.gguf");
        let l = ExpertLayout::of(&f).unwrap();
        for entry in &l.layers {
            let b = entry.biases.as_ref().unwrap();
            for part in Part::ALL {
                let t = f.tensor(&bias_name(entry.layer, part)).unwrap();
                let whole = f.tensor_data(t);
                let per = b.parts[part as usize].bytes as usize;
                assert_eq!(b.parts[part as usize].cols, entry.part(part).rows);
                let rows = l.bias_bytes(&f, entry.layer, 6).unwrap();
                assert_eq!(rows[part as usize], &whole[6 * per..7 * per]);
            }
        }
        let [g, u, d] = l.expert_bytes(&f, 1, 3).unwrap();
        let [bg, bu, bd] = l.bias_bytes(&f, 1, 3).unwrap();
        let joined: Vec<u8> = [g, u, d, bg, bu, bd].concat();
        assert_eq!(l.carried_digest(&f, 1, 3).unwrap(), *blake3::hash(&joined).as_bytes());
        assert_ne!(l.carried_digest(&f, 1, 3), l.digest(&f, 1, 3));
        let q = fixture("qwen3moe/q8_0.gguf");
        let lq = ExpertLayout::of(&q).unwrap();
        assert!(lq.bias_bytes(&q, 1, 3).is_none());
        assert_eq!(lq.carried_digest(&q, 1, 3), lq.digest(&q, 1, 3));
    }

    /// DeepSeek's first layers are dense: no entry, and the layer count still covers them.
    #[test]
    fn dense_layers_have_no_entry() {
        let f = fixture("deepseek3/q8_0.gguf");
        let l = ExpertLayout::of(&f).unwrap();
        assert!(l.layer(0).is_none() && l.layer(1).is_some());
        assert_eq!(l.n_layer, l.layers.len() + 1);
        let (dense, experts) = dense_and_expert_bytes(&f);
        assert!(dense > 0 && experts >= l.expert_bytes_total());
    }
}
