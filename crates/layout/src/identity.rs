//! Which GGUF file a store, an index, a shard or a cluster node's model came from.

use serde::{Deserialize, Serialize};
use titan_gguf::GgufFile;

use crate::LayoutError;

/// A model file's identity: its size and the BLAKE3 of its header, which holds every tensor's name,
/// shape, type and offset and all metadata. The name is for messages only (a renamed copy is the same
/// model). Hashing the header rather than the file keeps identifying instant; what the experts' bytes
/// are is the business of the per-expert digests ([`crate::ExpertLayout::digest`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelIdentity {
    pub file_name: String,
    pub file_size: u64,
    /// Lowercase hex.
    pub header_blake3: String,
}

impl ModelIdentity {
    pub fn of(gguf: &GgufFile) -> Result<ModelIdentity, LayoutError> {
        let path = gguf.path();
        let header = usize::try_from(gguf.data_offset)
            .ok()
            .and_then(|len| gguf.bytes(0, len))
            .ok_or_else(|| LayoutError::Model {
                path: path.to_path_buf(),
                what: "header extends past the end of the file".into(),
            })?;
        Ok(ModelIdentity {
            file_name: path
                .file_name()
                .map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned()),
            file_size: gguf.file_len(),
            header_blake3: blake3::hash(header).to_hex().to_string(),
        })
    }

    /// The same model: the name may differ, the size and header may not.
    pub fn matches(&self, other: &ModelIdentity) -> bool {
        self.file_size == other.file_size && self.header_blake3 == other.header_blake3
    }
}

/// "123456 bytes, header 3f2a…": what nodes compare and traces record.
impl std::fmt::Display for ModelIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} bytes, header {}", self.file_size, self.header_blake3)
    }
}
