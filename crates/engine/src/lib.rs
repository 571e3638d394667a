//! The engine: a GGUF MoE model's forward pass, its KV cache, sampling and generation.
//!
//! Data path, top to bottom: [`Model::load`] reads the config ([`config`]) and maps the weights
//! ([`weights`]); [`Model::forward`] runs each layer as a short list of named steps (attention in
//! [`attention`], routing and experts in [`moe`], the experts' weights reached only through [`experts`]);
//! [`generate`] drives it token by token with a [`sampler::Sampler`].

pub mod attention;
pub mod bench;
pub mod compressed;
pub mod config;
pub mod delta_net;
pub mod draft;
pub mod experts;
pub mod generate;
pub mod hyper;
pub mod latent;
mod memory;
pub mod model;
pub mod moe;
pub mod ops;
pub mod perplexity;
pub mod profile;
pub mod rows;
pub mod sampler;
pub mod samples;
pub mod scratch;
pub mod stats;
pub mod vocab;
pub mod weights;

pub use config::{Arch, Config};
pub use generate::{GenerateOptions, Generation, Speculation, StopReason};
pub use model::{Batch, Model, Outputs, Sequence, Span};
pub use sampler::{Sampler, SamplerOptions};

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Gguf(#[from] titan_gguf::GgufError),
    #[error("{path}: {what}")]
    Model { path: String, what: String },
    #[error(transparent)]
    Kernel(#[from] titan_kernels::KernelError),
    #[error(transparent)]
    Tokenizer(#[from] titan_tokenizer::TokenizerError),
    /// A failure of an expert source outside the engine (a store's read, say), in its own words.
    #[error(transparent)]
    Experts(Box<dyn std::error::Error + Send + Sync>),
    #[error("context of {ctx} tokens exceeded: {need} needed")]
    ContextFull { ctx: usize, need: usize },
    #[error("expert {expert} of layer {layer}: {what}")]
    Expert { layer: usize, expert: u32, what: String },
    #[error("token id {id} is outside the vocabulary (size {vocab})")]
    BadToken { id: u32, vocab: usize },
    /// A caller's request that cannot be run as given (no tokens, a sampler value out of range, a context
    /// larger than the model's or than memory).
    #[error("{0}")]
    Request(String),
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;
pub mod trace;
