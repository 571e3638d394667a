//! llama-server's `GET /props`, as far as its fields apply here: the default generation settings, the
//! slots, the context, the model and its chat template. Built once, as none of it changes while serving.

use std::path::Path;

use serde_json::{json, Value};
use titan_engine::{Model, SamplerOptions};

/// What `/props` reports.
pub struct Props<'a> {
    pub model: &'a Model,
    /// The model id clients name (`--alias`, or the file's name).
    pub name: &'a str,
    pub path: &'a Path,
    pub ctx_size: usize,
    pub slots: usize,
    /// The chat template's source (the `--chat-template` file's, else the model's), if there is one.
    pub chat_template: Option<&'a str>,
    pub bos: &'a str,
    pub eos: &'a str,
}

pub fn props(p: &Props<'_>) -> Value {
    let d = SamplerOptions::default();
    json!({
        "default_generation_settings": {
            "params": {
                // None: each request without a seed gets a random one, which its response gives back.
                "seed": null,
                "temperature": d.temperature,
                "top_k": d.top_k,
                "top_p": d.top_p,
                "min_p": d.min_p,
                "repeat_last_n": d.repeat_last_n,
                "repeat_penalty": d.repeat_penalty,
                "presence_penalty": d.presence_penalty,
                "frequency_penalty": d.frequency_penalty,
                // As llama-server: no limit but the context's room.
                "max_tokens": -1,
                "n_predict": -1,
                "stream": false,
                "n_probs": 0,
                "samplers": ["logit_bias", "penalties", "top_k", "top_p", "min_p", "temperature"],
            },
            "n_ctx": p.ctx_size,
        },
        "total_slots": p.slots,
        "model_alias": p.name,
        "model_path": p.path.display().to_string(),
        "n_vocab": p.model.config.n_vocab,
        "chat_template": p.chat_template.unwrap_or_default(),
        "bos_token": p.bos,
        "eos_token": p.eos,
        "build_info": concat!("titan-", env!("CARGO_PKG_VERSION")),
    })
}
