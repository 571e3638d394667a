//! `titan trace`: a run's internals, per step and layer, recorded into a trace file.

use std::path::PathBuf;

use anyhow::Result;
use titan_layout::ModelIdentity;

use crate::args::{with_hint, ModelArgs, PromptArgs, SamplingArgs, SpecArgs, SpecKind};
use titan_store::KvPlan;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    prompt: PromptArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    spec: SpecArgs,
    /// Output trace path.
    #[arg(short = 'o', long)]
    output: PathBuf,
}

pub fn run(a: Args) -> Result<()> {
    a.model.check_output(&a.output)?;
    let model = a.model.load(KvPlan {
        mtp: a.spec.kind() == SpecKind::Mtp,
        ..a.sampling.kv_plan(a.prompt.tokens_at_most())
    })?;
    let prompt = a.prompt.tokens(&model)?;
    let opts = a.sampling.options(&model, prompt.len())?;
    let id = ModelIdentity::of(&model.weights.file)?;
    let identity = serde_json::json!({
        "file": id.file_name,
        "bytes": id.file_size,
        "header_blake3": id.header_blake3,
        "architecture": model.config.arch_name,
    });
    let options = serde_json::json!({
        "prompt_tokens": prompt,
        "n_predict": opts.max_tokens,
        "temperature": opts.sampler.temperature,
        "top_k": opts.sampler.top_k,
        "top_p": opts.sampler.top_p,
        "min_p": opts.sampler.min_p,
        "repeat_penalty": opts.sampler.repeat_penalty,
        "seed": opts.sampler.seed,
        "threads": rayon::current_num_threads(),
        "isa": titan_kernels::isa().name(),
    });
    let mut drafts = a.spec.load()?;
    let mut drafter = drafts.drafter(&model, opts.n_ctx)?;
    let mut t = titan_engine::trace::Trace::new(identity, options);
    let g = model
        .generate_with(&prompt, &opts, a.spec.speculation(&mut drafter), Some(&mut t), |_| {})
        .map_err(with_hint)?;
    t.write(&a.output)?;
    eprintln!(
        "wrote {} records ({} steps, {} generated tokens) to {}",
        t.records.len(),
        g.tokens.len() + 1,
        g.tokens.len(),
        a.output.display()
    );
    if g.spec.drafted > 0 {
        eprintln!("{}", crate::output::speculation(&g));
    }
    Ok(())
}
