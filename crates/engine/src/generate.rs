//! Generation: prefill the prompt, then sample token by token until an end-of-generation token, the
//! requested count or the context's end, streaming text as it becomes valid UTF-8.

use std::time::{Duration, Instant};

use crate::model::{Model, Outputs};
use crate::sampler::{Sampler, SamplerOptions};
use crate::trace::Trace;
use crate::{EngineError, Result};

#[derive(Clone, Debug)]
pub struct GenerateOptions {
    pub max_tokens: usize,
    pub sampler: SamplerOptions,
    /// Context size of the KV cache (prompt + generated tokens).
    pub n_ctx: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    EndOfGeneration,
    MaxTokens,
}

#[derive(Clone, Debug)]
pub struct Generation {
    pub prompt_tokens: usize,
    pub tokens: Vec<u32>,
    pub stop: StopReason,
    pub prompt_time: Duration,
    pub gen_time: Duration,
}

impl Model {
    /// Generate from `prompt` ids, calling `on_text` with each piece of decoded text.
    pub fn generate(&self, prompt: &[u32], opts: &GenerateOptions, on_text: impl FnMut(&str)) -> Result<Generation> {
        self.generate_traced(prompt, opts, None, on_text)
    }

    /// [`Model::generate`], recording every step into `trace` when one is given.
    pub fn generate_traced(
        &self,
        prompt: &[u32],
        opts: &GenerateOptions,
        mut trace: Option<&mut Trace>,
        mut on_text: impl FnMut(&str),
    ) -> Result<Generation> {
        if prompt.is_empty() {
            return Err(EngineError::Request("the prompt has no tokens".into()));
        }
        opts.sampler.check().map_err(EngineError::Request)?;
        let need = prompt.len().saturating_add(opts.max_tokens);
        if prompt.len() >= opts.n_ctx {
            return Err(EngineError::ContextFull { ctx: opts.n_ctx, need });
        }
        let mut seq = self.new_sequence(opts.n_ctx.min(need));
        let mut sampler = Sampler::new(opts.sampler.clone());
        let mut history = prompt.to_vec();
        let mut stream = self.tokenizer.stream();

        let t0 = Instant::now();
        let mut logits = self.forward_traced(prompt, 0, &mut seq, Outputs::Last, trace.as_deref_mut())?;
        let prompt_time = t0.elapsed();

        let t1 = Instant::now();
        let mut out = Vec::new();
        let mut stop = StopReason::MaxTokens;
        while out.len() < opts.max_tokens {
            let next = sampler.sample(logits, &history);
            if let Some(t) = trace.as_deref_mut() {
                t.token(next);
                t.next_step();
            }
            if self.tokenizer.is_eog(next) {
                stop = StopReason::EndOfGeneration;
                break;
            }
            out.push(next);
            history.push(next);
            on_text(&stream.push(next));
            if out.len() == opts.max_tokens {
                break;
            }
            if history.len() >= seq.n_ctx() {
                // Hand over the text generated so far (including a held-back partial character) first.
                on_text(&stream.finish());
                return Err(EngineError::ContextFull {
                    ctx: seq.n_ctx(),
                    need: history.len() + 1,
                });
            }
            logits = self.forward_traced(
                &[next],
                history.len() - 1,
                &mut seq,
                Outputs::Last,
                trace.as_deref_mut(),
            )?;
        }
        on_text(&stream.finish());
        Ok(Generation {
            prompt_tokens: prompt.len(),
            tokens: out,
            stop,
            prompt_time,
            gen_time: t1.elapsed(),
        })
    }
}
