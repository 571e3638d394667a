//! `titan profile`: which experts a run routes to, per layer (for `--pin` and `--replicate-hot`).

use std::path::PathBuf;

use anyhow::Result;

use crate::args::{with_hint, ModelArgs, PromptArgs, SamplingArgs};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    prompt: PromptArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Output profile (JSON).
    #[arg(short = 'o', long)]
    output: PathBuf,
}

pub fn run(a: Args) -> Result<()> {
    a.model.check_output(&a.output)?;
    let model = a.model.load(a.sampling.kv_plan(a.prompt.tokens_at_most()))?;
    let prompt = a.prompt.tokens(&model)?;
    let opts = a.sampling.options(&model, prompt.len())?;
    let report = model.profile_routing(&prompt, &opts).map_err(with_hint)?;
    report.profile.save(&a.output)?;
    let (n_layer, n_expert, k) = (model.config.n_layer, model.config.n_expert, model.config.n_expert_used);
    eprintln!(
        "wrote the routing profile of {} tokens to {}",
        report.tokens,
        a.output.display()
    );
    println!("layer  experts used  hottest expert's share  overlap of consecutive tokens");
    let (mut used_sum, mut overlap_sum) = (0.0, 0.0);
    for (l, r) in report.layers.iter().enumerate() {
        println!(
            "{l:>5}  {:>5} of {n_expert:<5}  {:>21.1}%  {:>29.2}",
            r.used,
            r.hottest_share * 100.0,
            r.overlap
        );
        (used_sum, overlap_sum) = (used_sum + r.used as f64, overlap_sum + r.overlap);
    }
    println!(
        "mean   {:>5.1} of {n_expert:<5}  {:>22}  {:>29.2} (independent uniform choice: {:.2})",
        used_sum / n_layer as f64,
        "",
        overlap_sum / n_layer as f64,
        k as f64 / n_expert as f64
    );
    Ok(())
}
