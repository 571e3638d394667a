//! The expert store and the expert cache: how TITAN runs MoE models larger than RAM.
//!
//! `convert` copies every (layer, expert) of a GGUF's stacked expert tensors into one record of
//! `experts.bin` — gate ‖ up ‖ down bytes, a byte copy, each record aligned so it can be read whole with
//! O_DIRECT — and writes `manifest.json` with offsets, shapes, types, the source model's identity and a
//! BLAKE3 digest per record. The GGUF is never modified and stays the source of the dense weights.
//!
//! `write_index` makes the other layout, with no second copy: an index file beside the model of where each
//! expert's gate, up and down bytes already are in the GGUF, with the same per-expert digests; the store
//! then reads those three ranges straight out of the model.
//!
//! `Store` opens and checks a store of either layout against the model and reads records with positional
//! reads into aligned buffers, checking digests. `ExpertCache` keeps a bounded set of records resident,
//! reads a layer's misses in parallel on a pool of I/O threads, prefetches, pins, and counts everything;
//! [`StreamedExperts`] puts it behind the engine's expert seam. [`plan`] decides whether a model streams
//! at all, and with what budget, from the memory there is, and loads it so.

mod aligned;
mod cache;
mod convert;
mod error;
mod index;
mod manifest;
mod output;
pub mod plan;
mod pool;
mod reader;
mod record;
mod stream;
#[cfg(test)]
mod testutil;
mod units;

pub use aligned::AlignedBuf;
pub use cache::{Budget, CacheOptions, CacheStats, Counters, ExpertCache, Policy, Ready};
pub use convert::{convert, ConvertOptions};
pub use error::StoreError;
pub use index::{write_index, Index, INDEX_VERSION};
pub use manifest::{LayerEntry, Manifest, RecordEntry, TensorSpec, FORMAT_VERSION};
pub use output::{check_output, OutputKind};
pub use plan::{load_experts, load_model, BudgetChoice, ExpertChoice, KvPlan, ReadMode, StreamPlan};
pub use reader::{Layout, RecordSource, Store, StoreOptions, VerifyReport};
pub use record::{ExpertRecord, ExpertTensor};
pub use stream::StreamedExperts;
pub use units::{human_bytes, parse_size};

/// The file holding the records, inside a store directory.
pub const EXPERTS_FILE: &str = "experts.bin";
/// The manifest, inside a store directory; written last, so its presence marks a finished conversion.
pub const MANIFEST_FILE: &str = "manifest.json";
/// The default record alignment: the page size, and a multiple of every common logical block size.
pub const DEFAULT_ALIGNMENT: u64 = 4096;
/// The smallest alignment accepted: O_DIRECT needs at least the device's logical block size (512 or 4096).
pub const MIN_ALIGNMENT: u64 = 512;
