//! GGUF, the model file format llama.cpp writes: a zero-copy reader over a memory map and a writer.
//!
//! Layout (versions 2 and 3, little-endian): magic `GGUF`, version, tensor count, metadata count, the
//! metadata key/values, the tensor infos (name, dims, type, offset), padding to the alignment, then the
//! tensor data. Every count and offset read from the file is checked before it is used, so a damaged file
//! is an error naming the file and the cause, never a panic or an out-of-bounds view.

mod reader;
mod value;
mod writer;

pub use reader::{GgufFile, TensorInfo};
pub use value::{Value, ValueType};
pub use writer::GgufWriter;

/// The default alignment of the tensor data section when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
pub(crate) const MAGIC: &[u8; 4] = b"GGUF";

/// Every message names the file; an I/O error is printed in the message and not also returned as
/// [`source`](std::error::Error::source) (so a chain of causes names it once).
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("{path}: {error}")]
    Io { path: String, error: std::io::Error },
    /// A directory where a model file is meant (mapping one fails with a bare "No such device").
    #[error("{path} is a directory, not a GGUF file")]
    Directory { path: String },
    #[error("{path}: not a GGUF file (magic {found:?}, expected \"GGUF\")")]
    BadMagic { path: String, found: String },
    #[error("{path}: unsupported GGUF version {version} (supported: 2, 3)")]
    BadVersion { path: String, version: u32 },
    #[error("{path}: file is truncated: {what} at offset {offset} needs {need} bytes, file has {len}")]
    Truncated {
        path: String,
        what: String,
        offset: u64,
        need: u64,
        len: u64,
    },
    #[error("{path}: {what}")]
    Invalid { path: String, what: String },
    #[error("{path}: tensor {name:?} has unsupported type id {type_id}")]
    UnsupportedType { path: String, name: String, type_id: u32 },
    #[error("{path}: tensor {name:?} (offset {offset}, {size} bytes) points past the end of the file ({len} bytes)")]
    TensorOutOfBounds {
        path: String,
        name: String,
        offset: u64,
        size: u64,
        len: u64,
    },
    #[error("{path}: metadata key {key:?}: {what}")]
    Metadata { path: String, key: String, what: String },
}
