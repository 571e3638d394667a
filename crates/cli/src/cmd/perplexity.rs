//! `titan perplexity`: the perplexity of a text file, computed as llama.cpp's `llama-perplexity` computes it.

use std::path::PathBuf;

use anyhow::{Context, Result};
use titan_store::plan::mem_available;
use titan_store::KvPlan;

use crate::args::ModelArgs;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The text file.
    #[arg(short = 'f', long = "file")]
    file: PathBuf,
    /// Tokens per chunk (llama-perplexity's -c): each chunk starts from an empty cache, and its second half
    /// is scored.
    #[arg(short = 'c', long = "ctx-size", default_value_t = 512)]
    ctx_size: usize,
}

pub fn run(a: Args) -> Result<()> {
    let model = a.model.load(KvPlan::positions(a.ctx_size))?;
    let text = std::fs::read_to_string(&a.file).with_context(|| format!("reading {}", a.file.display()))?;
    // As llama-perplexity: special tokens added as the vocabulary asks, control-token text kept as text.
    let tokens = model.tokenizer.encode(&text, true, false);
    model
        .check_context(a.ctx_size, mem_available().unwrap_or(u64::MAX), false)
        .context("--ctx-size")?;
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template("perplexity [{bar:40}] chunk {pos}/{len} eta {eta} {msg}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    let t = std::time::Instant::now();
    let p = titan_engine::perplexity::perplexity(&model, &tokens, a.ctx_size, |done, total, running| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
        bar.set_message(format!("running {running:.4}"));
    })?;
    bar.finish_and_clear();
    let chunks: Vec<String> = (1..=p.chunks.len())
        .map(|i| format!("[{i}]{:.4}", p.after(i)))
        .collect();
    println!("{}", chunks.join(","));
    println!(
        "perplexity: {:.4} over {} chunks of {} tokens ({} tokens scored, {} in the file), {:.1} s",
        p.value(),
        p.chunks.len(),
        a.ctx_size,
        p.chunks.iter().map(|c| c.1).sum::<usize>(),
        tokens.len(),
        t.elapsed().as_secs_f64()
    );
    Ok(())
}
