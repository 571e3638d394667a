//! `titan synth`: a GGUF with a real model's dimensions and calibrated random weights.

use std::path::PathBuf;

use anyhow::{Context, Result};

use crate::output::{human, progress_bar};

#[derive(clap::Args)]
pub struct Args {
    /// Which model's dimensions: olmoe-1b-7b, qwen3-30b-a3b, qwen1.5-moe-a2.7b, mixtral-8x7b, qwen3.6-35b-a3b,
    /// qwen3.5-122b-a10b, gpt-oss-20b, deepseek-v2-lite, glm-4.5-air, minimax-m2, llama-4-scout, deepseek-v4-flash.
    #[arg(long)]
    preset: String,
    /// Tensor type of the file: q4_0, q8_0, q4_k_m, q6_k, f16, mxfp4 (experts MXFP4, the rest F16, as the
    /// converter writes gpt-oss), mxfp4_moe (llama-quantize's: experts MXFP4, the rest Q8_0).
    #[arg(long = "type")]
    ty: String,
    #[arg(short = 'o', long)]
    output: PathBuf,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Fewer layers than the real model (for quick experiments).
    #[arg(long)]
    layers: Option<usize>,
    /// Tokens of the routing check run on the written file (0 skips it).
    #[arg(long = "routing-tokens", default_value_t = 128)]
    routing_tokens: usize,
}

pub fn run(a: Args) -> Result<()> {
    let preset = titan_synth::preset(&a.preset).with_context(|| {
        let names: Vec<_> = titan_synth::presets().iter().map(|p| p.name).collect();
        format!("unknown preset {:?}: use one of {}", a.preset, names.join(", "))
    })?;
    let ty: titan_synth::FileType = a.ty.parse().map_err(anyhow::Error::msg)?;
    titan_store::check_output(&a.output, &[], titan_store::OutputKind::File)?;
    let mut opts = titan_synth::SynthOptions::new(preset.clone(), ty);
    opts.seed = a.seed;
    opts.layers = a.layers;
    let bar = progress_bar(0, "writing");
    let info = titan_synth::synth(&opts, &a.output, &mut |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    })?;
    bar.finish_and_clear();
    eprintln!(
        "wrote {} ({}, {} {}, {} tensors) in {:.1} s",
        a.output.display(),
        human(info.bytes),
        preset.name,
        ty,
        info.tensors,
        info.elapsed.as_secs_f64()
    );
    if a.routing_tokens > 0 {
        eprintln!(
            "routing check: sampling {} tokens with TITAN on the written file…",
            a.routing_tokens
        );
        print!("{}", titan_synth::routing_report(&a.output, a.routing_tokens, a.seed)?);
    }
    Ok(())
}
