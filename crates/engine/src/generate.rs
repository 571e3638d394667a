//! Generation: prefill the prompt, then sample token by token until an end-of-generation token, the
//! requested count or the context's end, streaming text as it becomes valid UTF-8.

use std::time::{Duration, Instant};

use crate::draft::{DraftLength, Drafter, SpecStats, StepRows};
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
    /// Steps, drafts and accepted drafts (no drafts without speculation).
    pub spec: SpecStats,
}

/// Speculative decoding: drafts to verify in each decode step, and how many per step (chosen between
/// the two bounds by [`DraftLength`]).
pub struct Speculation<'d> {
    pub drafter: &'d mut dyn Drafter,
    pub min_drafts: usize,
    pub max_drafts: usize,
}

impl Model {
    /// Generate from `prompt` ids, calling `on_text` with each piece of decoded text.
    pub fn generate(&self, prompt: &[u32], opts: &GenerateOptions, on_text: impl FnMut(&str)) -> Result<Generation> {
        self.generate_with(prompt, opts, None, None, on_text)
    }

    /// [`Model::generate`], recording every step into `trace` when one is given.
    pub fn generate_traced(
        &self,
        prompt: &[u32],
        opts: &GenerateOptions,
        trace: Option<&mut Trace>,
        on_text: impl FnMut(&str),
    ) -> Result<Generation> {
        self.generate_with(prompt, opts, None, trace, on_text)
    }

    /// [`Model::generate_traced`], verifying drafts when `spec` gives a drafter: each decode step runs the
    /// token just chosen and the drafts after it as rows of one forward pass, and samples row after row for
    /// as long as the sampled token is the draft the next row was computed for. Every row's logits are
    /// those a step of its own would give (the forward pass is row-independent) and the sampler draws by
    /// position, so the tokens — and the trace, written one step per token kept — are those of plain
    /// decoding, whatever was drafted.
    pub fn generate_with(
        &self,
        prompt: &[u32],
        opts: &GenerateOptions,
        mut spec: Option<Speculation<'_>>,
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
        let mut length = spec
            .as_ref()
            .map_or(DraftLength::new(0, 0), |s| DraftLength::new(s.min_drafts, s.max_drafts));
        let mut stats = SpecStats::default();
        // A decode step's records, before they are written one step per kept row.
        let mut rows_trace = Trace::default();
        // The main model's final states of a step's kept rows, for a drafter that learns from them.
        let mut states = Vec::new();

        // Each step feeds `fed` at positions pos0..: tokens chosen but not yet in the cache, then `drafts`.
        let (mut fed, mut pos0, mut drafts) = (prompt.to_vec(), 0, Vec::new());
        let (mut out, mut stop) = (Vec::new(), StopReason::MaxTokens);
        let (t0, mut prompt_time) = (Instant::now(), None);
        // When this step began: its drafting and its forward pass are its cost.
        let mut step_start = t0;
        'steps: loop {
            // The prompt's step wants the last row's logits and is traced as it is; a decode step wants
            // every row's, and is traced row by row below.
            let prompt_step = prompt_time.is_none();
            let outputs = if prompt_step { Outputs::Last } else { Outputs::All };
            let step_trace = match &mut trace {
                Some(t) if prompt_step => Some(&mut **t),
                Some(_) => Some(&mut rows_trace),
                None => None,
            };
            let logits = self.forward_traced(&fed, pos0, &mut seq, outputs, step_trace)?;
            let step_seconds = step_start.elapsed().as_secs_f64();
            if prompt_step {
                prompt_time = Some(t0.elapsed());
            } else {
                stats.steps += 1;
            }
            let v = self.config.n_vocab;
            let first = logits.len() / v - 1 - drafts.len();
            stats.drafted += drafts.len();
            let mut accepted = 0;
            for (i, row) in logits[first * v..].chunks_exact(v).enumerate() {
                let next = sampler.sample(row, &history);
                if let Some(t) = trace.as_deref_mut() {
                    if !prompt_step {
                        t.append_row(&rows_trace, first + i);
                    }
                    t.token(next);
                    t.next_step();
                }
                if self.tokenizer.is_eog(next) {
                    stop = StopReason::EndOfGeneration;
                    break 'steps;
                }
                out.push(next);
                history.push(next);
                on_text(&stream.push(next));
                // The next row was computed for this draft: it is this token's step.
                let kept = drafts.get(i) == Some(&next);
                accepted += usize::from(kept);
                stats.accepted += usize::from(kept);
                if out.len() == opts.max_tokens {
                    break 'steps;
                }
                if !kept {
                    break;
                }
            }
            rows_trace.records.clear();
            length.update(fed.len(), drafts.len(), accepted, step_seconds);
            if let Some(s) = spec.as_mut().filter(|s| s.drafter.wants_states()) {
                // The rows up to the first rejected draft, whose tokens the history keeps.
                let kept = fed.len().min(history.len() - 1 - pos0);
                states.clear();
                self.final_states(&seq, 0..kept, &mut states);
                let rows = StepRows {
                    tokens: &fed[..kept],
                    pos0,
                    states: &states,
                };
                s.drafter.observe(&rows)?;
            }

            // Cut the rows of rejected drafts: keep every chosen token but the last, which the next step
            // feeds (a recurrent state goes back to its copy, and the next step feeds again what follows it).
            let keep = seq.reusable(history.len() - 1);
            seq.truncate(keep)?;
            if history.len() >= seq.n_ctx() {
                // Hand over the text generated so far (including a held-back partial character) first.
                on_text(&stream.finish());
                return Err(EngineError::ContextFull {
                    ctx: seq.n_ctx(),
                    need: history.len() + 1,
                });
            }
            drafts.clear();
            step_start = Instant::now();
            if let Some(s) = spec.as_mut() {
                // Enough rows for the tokens still wanted, and no position past the context.
                let room = (opts.max_tokens - out.len() - 1).min(seq.n_ctx() - history.len());
                s.drafter.draft(&history, length.get().min(room), &mut drafts)?;
                drafts.truncate(room);
                if !drafts.is_empty() {
                    seq.checkpoint_step();
                }
            }
            fed.clear();
            fed.extend_from_slice(&history[keep..]);
            fed.extend_from_slice(&drafts);
            pos0 = keep;
        }
        on_text(&stream.finish());
        let prompt_time = prompt_time.unwrap_or_default();
        Ok(Generation {
            prompt_tokens: prompt.len(),
            tokens: out,
            stop,
            prompt_time,
            gen_time: t0.elapsed().saturating_sub(prompt_time),
            spec: stats,
        })
    }
}
