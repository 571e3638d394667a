//! `manifest.json`: what a store holds and which model it was made from, and the scan of a GGUF's stacked
//! expert tensors that both conversion and opening compare against.

use std::path::Path;

use serde::{Deserialize, Serialize};
use titan_gguf::{GgufFile, TensorInfo};
use titan_kernels::GgmlType;

use crate::StoreError;

/// Bumped whenever the layout of `experts.bin` or the manifest changes incompatibly.
pub const FORMAT_VERSION: u32 = 1;
/// The `format` field, so a stray JSON file is not mistaken for a manifest.
const FORMAT_NAME: &str = "titan-expert-store";

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub version: u32,
    /// Every record starts at a multiple of this and is zero-padded to it.
    pub alignment: u64,
    pub source: SourceIdentity,
    pub architecture: Option<String>,
    pub n_layer: usize,
    pub n_expert: usize,
    /// The MoE layers, ascending; dense layers (e.g. DeepSeek's first) have no entry and no records.
    pub layers: Vec<LayerEntry>,
    /// One per (MoE layer, expert), layer-major, at ascending offsets.
    pub records: Vec<RecordEntry>,
}

/// Which GGUF a store was made from. The file name is for messages only (a moved or renamed model is still
/// the same model); the size and the digest of the header — which holds every tensor's name, shape, type
/// and offset and all metadata — are compared. Hashing the header instead of the whole file keeps `open`
/// instant; the per-record digests cover the expert bytes themselves.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceIdentity {
    pub file_name: String,
    pub file_size: u64,
    pub header_blake3: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerEntry {
    pub layer: usize,
    pub gate: TensorSpec,
    pub up: TensorSpec,
    pub down: TensorSpec,
}

/// One expert's slice of a stacked tensor: `rows` rows of `cols` elements, `bytes` bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorSpec {
    #[serde(rename = "type")]
    pub ty: String,
    pub rows: usize,
    pub cols: usize,
    pub bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordEntry {
    pub layer: usize,
    pub expert: usize,
    /// Offset in `experts.bin`, a multiple of the alignment.
    pub offset: u64,
    /// gate + up + down bytes, without the padding.
    pub length: u64,
    /// BLAKE3 of the `length` record bytes, lowercase hex.
    pub blake3: String,
}

impl LayerEntry {
    pub fn record_length(&self) -> u64 {
        // Saturating: a crafted manifest's sizes must not overflow; no real record comes near u64::MAX.
        self.gate
            .bytes
            .saturating_add(self.up.bytes)
            .saturating_add(self.down.bytes)
    }
}

impl TensorSpec {
    /// The GGML type named by `ty`, if TITAN knows it.
    pub fn ggml_type(&self) -> Option<GgmlType> {
        GgmlType::ALL.into_iter().find(|t| t.name() == self.ty)
    }
}

impl Manifest {
    pub(crate) fn new(
        gguf: &GgufFile,
        layout: ExpertLayout,
        alignment: u64,
        records: Vec<RecordEntry>,
    ) -> Result<Manifest, StoreError> {
        Ok(Manifest {
            format: FORMAT_NAME.to_string(),
            version: FORMAT_VERSION,
            alignment,
            source: SourceIdentity::of(gguf)?,
            architecture: gguf
                .get("general.architecture")
                .and_then(|v| v.as_str())
                .map(str::to_owned),
            n_layer: layout.n_layer,
            n_expert: layout.n_expert,
            layers: layout.layers,
            records,
        })
    }

    /// Read and parse `path`, checking the format name and version (nothing about the model yet).
    pub fn load(path: &Path) -> Result<Manifest, StoreError> {
        let text = std::fs::read(path).map_err(|source| StoreError::ManifestMissing {
            path: path.to_path_buf(),
            source,
        })?;
        let m: Manifest = serde_json::from_slice(&text).map_err(|e| StoreError::ManifestParse {
            path: path.to_path_buf(),
            what: e.to_string(),
        })?;
        if m.format != FORMAT_NAME {
            let what = format!("format is {:?}, not {FORMAT_NAME:?}", m.format);
            return Err(StoreError::ManifestParse {
                path: path.to_path_buf(),
                what,
            });
        }
        if m.version != FORMAT_VERSION {
            return Err(StoreError::Version {
                path: path.to_path_buf(),
                found: m.version,
                supported: FORMAT_VERSION,
            });
        }
        Ok(m)
    }

    pub(crate) fn to_json(&self) -> serde_json::Result<Vec<u8>> {
        serde_json::to_vec_pretty(self)
    }
}

impl SourceIdentity {
    pub fn of(gguf: &GgufFile) -> Result<SourceIdentity, StoreError> {
        let path = gguf.path();
        let header = usize::try_from(gguf.data_offset)
            .ok()
            .and_then(|len| gguf.bytes(0, len))
            .ok_or_else(|| StoreError::Model {
                path: path.to_path_buf(),
                what: "header extends past the end of the file".into(),
            })?;
        Ok(SourceIdentity {
            file_name: path
                .file_name()
                .map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned()),
            file_size: gguf.file_len(),
            header_blake3: blake3::hash(header).to_hex().to_string(),
        })
    }

    /// Same model: the name may differ (a renamed copy), the size and header may not.
    pub fn matches(&self, other: &SourceIdentity) -> bool {
        self.file_size == other.file_size && self.header_blake3 == other.header_blake3
    }
}

/// The stacked expert tensors of a model: what a store made from it must hold.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct ExpertLayout {
    pub n_layer: usize,
    pub n_expert: usize,
    pub layers: Vec<LayerEntry>,
}

/// The three stacked tensors of one layer, as found in the GGUF.
pub(crate) struct LayerTensors<'a> {
    pub layer: usize,
    pub gate: &'a TensorInfo,
    pub up: &'a TensorInfo,
    pub down: &'a TensorInfo,
}

const PARTS: [&str; 3] = ["gate", "up", "down"];

/// Find `blk.{L}.ffn_{gate,up,down}_exps.weight` for every layer that has any of them.
pub(crate) fn expert_tensors(gguf: &GgufFile) -> Result<Vec<LayerTensors<'_>>, StoreError> {
    let mut layers: Vec<usize> = gguf
        .tensors
        .iter()
        .filter_map(|t| {
            let rest = t.name.strip_prefix("blk.")?;
            let (layer, part) = rest.split_once('.')?;
            let is_expert = PARTS.iter().any(|p| part == format!("ffn_{p}_exps.weight"));
            if is_expert {
                layer.parse().ok()
            } else {
                None
            }
        })
        .collect();
    layers.sort_unstable();
    layers.dedup();
    let model_err = |what: String| StoreError::Model {
        path: gguf.path().to_path_buf(),
        what,
    };
    layers
        .into_iter()
        .map(|layer| {
            let find = |part: &str| {
                let name = format!("blk.{layer}.ffn_{part}_exps.weight");
                gguf.tensor(&name)
                    .ok_or_else(|| model_err(format!("layer {layer} has some expert tensors but no {name}")))
            };
            Ok(LayerTensors {
                layer,
                gate: find("gate")?,
                up: find("up")?,
                down: find("down")?,
            })
        })
        .collect()
}

impl ExpertLayout {
    pub(crate) fn of(gguf: &GgufFile, tensors: &[LayerTensors<'_>]) -> Result<ExpertLayout, StoreError> {
        let model_err = |what: String| StoreError::Model {
            path: gguf.path().to_path_buf(),
            what,
        };
        let Some(first) = tensors.first() else {
            return Err(StoreError::NoExperts {
                path: gguf.path().to_path_buf(),
            });
        };
        let n_expert = first.gate.dims.get(2).copied().unwrap_or(0);
        let mut layers = Vec::with_capacity(tensors.len());
        for lt in tensors {
            let spec = |t: &TensorInfo| -> Result<TensorSpec, StoreError> {
                let [cols, rows, n] = t.dims[..] else {
                    return Err(model_err(format!(
                        "{} has dims {:?}; expected [cols, rows, n_expert]",
                        t.name, t.dims
                    )));
                };
                if n != n_expert || n == 0 {
                    return Err(model_err(format!(
                        "{} has {n} experts; expected {n_expert} as in {}",
                        t.name, first.gate.name
                    )));
                }
                let (cols, rows) = (to_usize(cols), to_usize(rows));
                let bytes = cols
                    .zip(rows)
                    .and_then(|(c, r)| t.ty.row_bytes(c)?.checked_mul(r))
                    .filter(|b| (*b as u64).checked_mul(n) == Some(t.size))
                    .ok_or_else(|| {
                        model_err(format!(
                            "{} ({} {:?}) is not n_expert whole expert slices",
                            t.name, t.ty, t.dims
                        ))
                    })?;
                Ok(TensorSpec {
                    ty: t.ty.name().to_string(),
                    rows: rows.unwrap_or(0),
                    cols: cols.unwrap_or(0),
                    bytes: bytes as u64,
                })
            };
            layers.push(LayerEntry {
                layer: lt.layer,
                gate: spec(lt.gate)?,
                up: spec(lt.up)?,
                down: spec(lt.down)?,
            });
        }
        let last = tensors.last().map_or(0, |t| t.layer) + 1;
        let arch = gguf.get("general.architecture").and_then(|v| v.as_str());
        let block_count = arch
            .and_then(|a| gguf.get(&format!("{a}.block_count")))
            .and_then(|v| v.as_u64());
        let n_layer = block_count.and_then(to_usize).unwrap_or(last).max(last);
        let n_expert = to_usize(n_expert).ok_or_else(|| model_err(format!("{n_expert} experts overflow usize")))?;
        Ok(ExpertLayout {
            n_layer,
            n_expert,
            layers,
        })
    }
}

fn to_usize(x: u64) -> Option<usize> {
    usize::try_from(x).ok()
}
