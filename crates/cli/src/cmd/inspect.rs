//! `titan inspect`: what a GGUF model is: architecture, dimensions, experts, tensor types, bytes.

use std::path::PathBuf;

use anyhow::Result;
use titan_gguf::GgufFile;

use crate::output::human;

#[derive(clap::Args)]
pub struct Args {
    model: PathBuf,
}

pub fn run(a: Args) -> Result<()> {
    let f = GgufFile::open(&a.model)?;
    let c = titan_engine::Config::from_gguf(&f)?;
    println!(
        "file:          {} (GGUF v{}, {} tensors, {} bytes)",
        a.model.display(),
        f.version,
        f.tensors.len(),
        f.file_len()
    );
    if let Some(name) = f.get_str("general.name")? {
        println!("name:          {name}");
    }
    println!("architecture:  {} ({:?})", c.arch_name, c.arch);
    println!("layers:        {}", c.n_layer);
    if c.n_nextn > 0 {
        let what = match (titan_engine::weights::MtpHead::held(&f, &c), c.runs_mtp()) {
            (true, true) => "in the file; drafts with --spec mtp",
            (true, false) => "in the file; not run",
            (false, _) => "counted but not in the file",
        };
        println!("MTP layers:    {} after the main ones (nextn), {what}", c.n_nextn);
    }
    println!("embedding:     {}", c.n_embd);
    println!(
        "heads:         {} query, {} key/value, head size {}",
        c.n_head, c.n_head_kv, c.head_dim
    );
    if let Some(s) = &c.delta_net {
        let n = c.n_layer - c.n_attention_layers();
        println!(
            "linear attn:   {n} of {} layers, {} key / {} value heads of {}, {}-tap convolution",
            c.n_layer, s.n_k_heads, s.n_v_heads, s.head_dim, s.conv_kernel
        );
    }
    if c.dense_lead == c.n_layer {
        println!(
            "experts:       none (a dense feed-forward of {} in every layer)",
            c.dense_ff
        );
    } else {
        println!(
            "experts:       {} per layer, {} used per token, expert FFN {}",
            c.n_expert, c.n_expert_used, c.expert_ff
        );
    }
    if c.dense_lead > 0 && c.dense_lead < c.n_layer {
        println!("dense layers:  the first {}, feed-forward {}", c.dense_lead, c.dense_ff);
    }
    if c.moe_every > 1 {
        let dense = (0..c.n_layer).filter(|&il| !c.is_moe(il)).count();
        println!(
            "dense layers:  {dense} of {} (one layer in {} has experts), feed-forward {}",
            c.n_layer, c.moe_every, c.dense_ff
        );
    }
    if c.chunked.iter().any(|&b| b) || c.nope.iter().any(|&b| b) {
        let count = |v: &[bool]| v.iter().filter(|&&b| b).count();
        println!(
            "attention:     chunks of {} on {} layers, no RoPE on {}",
            c.chunk,
            count(&c.chunked),
            count(&c.nope)
        );
    }
    if let Some(v) = &c.v4 {
        let on = |r: usize| v.ratios.iter().filter(|&&x| x == r).count();
        println!(
            "attention:     a window of {} on every layer; compressed entries of 4 (indexer: {} heads of {}, top {}) on {}, of 128 on {}, of {} layers",
            v.window,
            v.idx_heads,
            v.idx_dim,
            v.idx_top_k,
            on(4),
            on(128),
            c.n_layer
        );
        println!(
            "streams:       {} hyper-connection streams; experts chosen by the token in the first {} layer(s)",
            v.hc, v.hash_layers
        );
    }
    if c.shared_ff > 0 {
        println!("shared expert: FFN {}", c.shared_ff);
    }
    println!(
        "vocabulary:    {} tokens ({})",
        c.n_vocab,
        f.get_str("tokenizer.ggml.model")?.unwrap_or("none")
    );
    println!("context:       {} (training)", c.n_ctx_train);
    let mut types: std::collections::BTreeMap<&str, (usize, u64)> = Default::default();
    for t in &f.tensors {
        let e = types.entry(t.ty.name()).or_default();
        e.0 += 1;
        e.1 += t.size;
    }
    let (dense, expert) = titan_layout::dense_and_expert_bytes(&f);
    let types: Vec<String> = types
        .iter()
        .map(|(n, (count, bytes))| format!("{n} ×{count} ({})", human(*bytes)))
        .collect();
    println!("tensor types:  {}", types.join(", "));
    // Every layer with experts in the file, MTP layers included, as the expert bytes count them.
    let moe_layers = titan_layout::ExpertLayout::of(&f).map_or(0, |l| l.layers.len());
    match moe_layers * c.n_expert {
        0 => println!("weights:       {} dense, no experts", human(dense)),
        n => println!(
            "weights:       {} dense, {} experts ({} per expert per layer)",
            human(dense),
            human(expert),
            human(expert / n as u64)
        ),
    }
    Ok(())
}
