//! Perplexity as llama.cpp's `llama-perplexity` computes it, so the figures compare: the text's tokens in
//! `floor(n / n_ctx)` chunks of `n_ctx`, each evaluated from an empty cache with its first token replaced
//! by BOS when the vocabulary starts texts with one; only the second half of each chunk is scored (the
//! logits at positions `n_ctx/2 .. n_ctx-1` against the next tokens, a log-softmax in f64).

use crate::model::{Model, Outputs};
use crate::Result;

/// The negative log-likelihood of each chunk and how many tokens it scored.
#[derive(Debug, Default)]
pub struct Perplexity {
    pub n_ctx: usize,
    pub chunks: Vec<(f64, usize)>,
}

impl Perplexity {
    /// exp(mean NLL) over the first `n` chunks.
    pub fn after(&self, n: usize) -> f64 {
        let (nll, count) = self.chunks[..n].iter().fold((0.0, 0), |(a, c), &(x, k)| (a + x, c + k));
        (nll / count.max(1) as f64).exp()
    }

    /// Over every chunk.
    pub fn value(&self) -> f64 {
        self.after(self.chunks.len())
    }

    /// Of chunk `i` alone.
    pub fn chunk(&self, i: usize) -> f64 {
        let (nll, count) = self.chunks[i];
        (nll / count as f64).exp()
    }
}

/// The smallest chunk that scores a token: positions `n_ctx/2 .. n_ctx-1` are scored, none below 3.
pub const MIN_CHUNK: usize = 3;

/// Perplexity of `model` on `tokens`; `progress(chunks done, chunks, running perplexity)` after each chunk.
/// Errors if a chunk of `n_ctx` tokens scores none (`n_ctx` below [`MIN_CHUNK`]), or the text is shorter
/// than one chunk.
pub fn perplexity(
    model: &Model,
    tokens: &[u32],
    n_ctx: usize,
    mut progress: impl FnMut(usize, usize, f64),
) -> Result<Perplexity> {
    if n_ctx < MIN_CHUNK {
        return Err(crate::EngineError::Request(format!(
            "a chunk of {n_ctx} tokens scores none (the second half of a chunk is scored, each token against the \
             next): chunks need at least {MIN_CHUNK} tokens"
        )));
    }
    let n_chunk = tokens.len() / n_ctx;
    if n_chunk == 0 {
        return Err(crate::EngineError::Request(format!(
            "the text has {} tokens, fewer than one chunk of {n_ctx}",
            tokens.len()
        )));
    }
    let v = model.config.n_vocab;
    let first = n_ctx / 2;
    let mut seq = model.new_sequence(n_ctx);
    let mut chunk = vec![0u32; n_ctx];
    let mut out = Perplexity {
        n_ctx,
        chunks: Vec::with_capacity(n_chunk),
    };
    for i in 0..n_chunk {
        let text = &tokens[i * n_ctx..(i + 1) * n_ctx];
        chunk.copy_from_slice(text);
        if let Some(bos) = model.tokenizer.added_bos() {
            chunk[0] = bos;
        }
        let logits = model.forward(&chunk, 0, &mut seq, Outputs::All)?;
        let mut nll = 0f64;
        for pos in first..n_ctx - 1 {
            let row = &logits[pos * v..(pos + 1) * v];
            let max = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
            let sum: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
            nll += max + sum.ln() - row[text[pos + 1] as usize] as f64;
        }
        out.chunks.push((nll, n_ctx - 1 - first));
        progress(i + 1, n_chunk, out.value());
    }
    Ok(out)
}
