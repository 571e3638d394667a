//! `manifest.json`: what a store holds and which model it was made from.

use std::path::Path;

use serde::{Deserialize, Serialize};
use titan_gguf::GgufFile;
use titan_kernels::GgmlType;
use titan_layout::{ExpertLayout, LayerExperts, ModelIdentity, Part, Slice};

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
    pub source: ModelIdentity,
    pub architecture: Option<String>,
    pub n_layer: usize,
    pub n_expert: usize,
    /// The MoE layers, ascending; dense layers (e.g. DeepSeek's first) have no entry and no records.
    pub layers: Vec<LayerEntry>,
    /// One per (MoE layer, expert), layer-major, at ascending offsets.
    pub records: Vec<RecordEntry>,
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
    /// A layer's entry as the model lays its experts out.
    pub fn of(l: &LayerExperts) -> LayerEntry {
        let spec = |s: &Slice| TensorSpec {
            ty: s.ty.name().to_string(),
            rows: s.rows,
            cols: s.cols,
            bytes: s.bytes,
        };
        LayerEntry {
            layer: l.layer,
            gate: spec(l.part(Part::Gate)),
            up: spec(l.part(Part::Up)),
            down: spec(l.part(Part::Down)),
        }
    }

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
        layout: &ExpertLayout,
        alignment: u64,
        records: Vec<RecordEntry>,
    ) -> Result<Manifest, StoreError> {
        Ok(Manifest {
            format: FORMAT_NAME.to_string(),
            version: FORMAT_VERSION,
            alignment,
            source: ModelIdentity::of(gguf)?,
            architecture: gguf
                .get("general.architecture")
                .and_then(|v| v.as_str())
                .map(str::to_owned),
            n_layer: layout.n_layer,
            n_expert: layout.n_expert,
            layers: layout.layers.iter().map(LayerEntry::of).collect(),
            records,
        })
    }

    /// Read and parse `path`, checking the format name and version (nothing about the model yet).
    pub fn load(path: &Path) -> Result<Manifest, StoreError> {
        let text = std::fs::read(path).map_err(|error| StoreError::ManifestMissing {
            path: path.to_path_buf(),
            error,
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
