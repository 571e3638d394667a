//! How a GGUF file holds a mixture-of-experts model's experts — the one place that knows it.
//!
//! llama.cpp stacks a layer's experts along the outermost axis of three tensors,
//! `blk.L.ffn_{gate,up,down}_exps.weight` (`[cols, rows, n_expert]`), so expert `e` of a layer is one
//! contiguous byte range of each: a slice of an expert is a byte copy, never a requantisation. This crate
//! names those tensors ([`names`]), finds each (layer, expert) matrix's bytes and hashes them
//! ([`ExpertLayout`]), identifies the file a model came from ([`ModelIdentity`]), and lays matrices out
//! for the SIMD kernels ([`regroup`]). The resident weights, both layouts of the expert store and the
//! cluster's shards all go through it, so they agree on every byte and digest.

mod identity;
mod layout;
pub mod names;
pub mod regroup;

pub use identity::ModelIdentity;
pub use layout::{
    dense_and_expert_bytes, digest_of, Digest, ExpertLayout, LayerBiases, LayerExperts, LayoutError, Slice,
};
pub use names::Part;
