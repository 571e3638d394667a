//! `titan run`: generate text from a prompt, streamed to stdout; speed on stderr.

use std::io::Write;

use anyhow::Result;
use titan_engine::StopReason;

use crate::args::{tokens_at_most, with_hint, ModelArgs, SamplingArgs, SpecArgs, SpecKind};
use titan_store::KvPlan;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The prompt text.
    #[arg(short = 'p', long)]
    prompt: String,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    spec: SpecArgs,
}

pub fn run(a: Args) -> Result<()> {
    let model = a.model.load(KvPlan {
        mtp: a.spec.kind() == SpecKind::Mtp,
        ..a.sampling.kv_plan(tokens_at_most(&a.prompt))
    })?;
    let prompt = model.tokenizer.encode(&a.prompt, true, true);
    let opts = a.sampling.options(&model, prompt.len())?;
    let mut drafts = a.spec.load()?;
    let mut drafter = drafts.drafter(&model, opts.n_ctx)?;
    let mut stdout = std::io::stdout().lock();
    let g = model
        .generate_with(&prompt, &opts, a.spec.speculation(&mut drafter), None, |text| {
            let _ = stdout.write_all(text.as_bytes());
            let _ = stdout.flush();
        })
        .map_err(with_hint)?;
    let _ = writeln!(stdout);
    let rate = |n: usize, t: std::time::Duration| n as f64 / t.as_secs_f64().max(1e-9);
    eprintln!(
        "prompt: {} tokens, {:.2} tok/s | generation: {} tokens, {:.2} tok/s{}{}",
        g.prompt_tokens,
        rate(g.prompt_tokens, g.prompt_time),
        g.tokens.len(),
        rate(g.tokens.len().saturating_sub(1), g.gen_time),
        if g.stop == StopReason::EndOfGeneration {
            " (end of generation)"
        } else {
            ""
        },
        match g.spec.drafted {
            0 => String::new(),
            _ => format!(" | {}", crate::output::speculation(&g)),
        }
    );
    if let Some(s) = model.experts.summary() {
        eprint!("{s}");
    }
    Ok(())
}
