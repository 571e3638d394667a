//! `titan logits`: the logits of every prompt position, as a float32 .npy of shape [positions, vocab].

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use titan_engine::Outputs;
use titan_store::KvPlan;

use crate::args::{check_context, ModelArgs, PromptArgs};
use crate::npy;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    prompt: PromptArgs,
    /// Output .npy path.
    #[arg(short = 'o', long)]
    output: PathBuf,
}

pub fn run(a: Args) -> Result<()> {
    a.model.check_output(&a.output)?;
    let model = a.model.load(KvPlan::positions(a.prompt.tokens_at_most()))?;
    let tokens = a.prompt.tokens(&model)?;
    check_context(&model, tokens.len(), tokens.len(), false).context("the prompt")?;
    let mut seq = model.new_sequence(tokens.len());
    let logits = model.forward(&tokens, 0, &mut seq, Outputs::All)?;
    let file = std::fs::File::create(&a.output).with_context(|| format!("creating {}", a.output.display()))?;
    let mut f = std::io::BufWriter::new(file);
    npy::write_f32(&mut f, &[tokens.len(), model.config.n_vocab], logits)
        .and_then(|_| f.flush())
        .with_context(|| format!("writing {}", a.output.display()))?;
    eprintln!(
        "wrote {} × {} logits to {}",
        tokens.len(),
        model.config.n_vocab,
        a.output.display()
    );
    Ok(())
}
