//! `titan perplexity`: the perplexity of a text file, computed as llama.cpp's `llama-perplexity` computes it.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use titan_engine::perplexity::MIN_CHUNK;
use titan_store::KvPlan;

use crate::args::{check_context, ModelArgs};

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
    if a.ctx_size < MIN_CHUNK {
        bail!(
            "-c {}: the second half of each chunk is scored, each token against the next, so a chunk of {} scores \
             none; the smallest -c is {MIN_CHUNK}",
            a.ctx_size,
            a.ctx_size
        );
    }
    let model = a.model.load(KvPlan::positions(a.ctx_size))?;
    let text = std::fs::read_to_string(&a.file).with_context(|| format!("reading {}", a.file.display()))?;
    // As llama-perplexity: special tokens added as the vocabulary asks, control-token text kept as text.
    let tokens = model.tokenizer.encode(&text, true, false);
    check_context(&model, a.ctx_size, a.ctx_size, false).context("--ctx-size")?;
    if tokens.len() < a.ctx_size {
        bail!(
            "{}: the text has {} tokens, fewer than one chunk of -c {}; give a smaller -c or a longer text",
            a.file.display(),
            tokens.len(),
            a.ctx_size
        );
    }
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
    if let Some(s) = model.experts.summary() {
        eprint!("{s}");
    }
    Ok(())
}
