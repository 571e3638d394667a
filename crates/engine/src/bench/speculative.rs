//! What speculative decoding does at a given acceptance rate: decode speed, steps, bytes and experts per
//! produced token, against plain decoding of the same text in the same run. Random-weight models accept
//! real drafts by chance only, so the drafts are the plain run's own continuation with a chosen share of
//! its tokens replaced ([`ReplayDrafter`]); every speculative run must give the plain run's tokens.

use std::collections::BTreeMap;

use crate::draft::{Drafter, ReplayDrafter, SpecStats};
use crate::generate::{GenerateOptions, Generation, Speculation};
use crate::model::{Model, Outputs};
use crate::sampler::SamplerOptions;
use crate::samples::counters;
use crate::stats::StatsSnapshot;
use crate::{EngineError, Result};

#[derive(Clone, Debug)]
pub struct SpecBenchOptions {
    pub prompt_tokens: usize,
    pub gen_tokens: usize,
    pub repetitions: usize,
    /// Acceptance rates to measure (each against plain decoding).
    pub rates: Vec<f64>,
    pub min_drafts: usize,
    pub max_drafts: usize,
}

/// One rate's (or plain decoding's) figures over every repetition.
#[derive(Clone, Debug, Default)]
pub struct SpecRow {
    /// None: plain decoding.
    pub rate: Option<f64>,
    /// Decode speed per repetition, and its ratio to plain decoding's in the same repetition.
    pub tok_s: Vec<f64>,
    pub speedup: Vec<f64>,
    pub tokens: usize,
    pub spec: SpecStats,
    /// Weight bytes and routed experts (per layer pass) computed, over all repetitions.
    pub weight_bytes: u64,
    pub experts_run: u64,
    /// What the expert source counted (bytes read from disk when experts stream).
    pub counters: BTreeMap<&'static str, f64>,
}

pub fn bench_speculative(model: &Model, o: &SpecBenchOptions) -> Result<Vec<SpecRow>> {
    let prompt = super::prompt(o.prompt_tokens.max(1), model.config.n_vocab);
    let opts = GenerateOptions {
        max_tokens: o.gen_tokens,
        n_ctx: prompt.len() + o.gen_tokens + 1,
        // Sampled at temperature 1, as `bench` samples: greedy decoding of random weights soon loops.
        sampler: SamplerOptions {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 1,
            ..Default::default()
        },
    };
    let mut rows: Vec<SpecRow> = std::iter::once(None)
        .chain(o.rates.iter().copied().map(Some))
        .map(|rate| SpecRow {
            rate,
            ..Default::default()
        })
        .collect();
    // Warm-up: buffers sized, and a streamed model's cache as after a generation of this text.
    let plain = model.generate(&prompt, &opts, |_| {})?;
    let before = model.stats.snapshot();
    model.forward(&prompt, 0, &mut model.new_sequence(prompt.len()), Outputs::Last)?;
    let prompt_step = model.stats.snapshot().since(&before);
    let text: Vec<u32> = prompt.iter().chain(&plain.tokens).copied().collect();
    for rep in 0..o.repetitions.max(1) {
        let mut plain_rate = 0.0;
        for row in &mut rows {
            let mut replay = row
                .rate
                .map(|r| ReplayDrafter::new(text.clone(), r, model.config.n_vocab, rep as u64));
            let spec = replay.as_mut().map(|d| Speculation {
                drafter: d as &mut dyn Drafter,
                min_drafts: o.min_drafts,
                max_drafts: o.max_drafts,
            });
            let g = measure(model, &prompt, &opts, spec, &prompt_step, row)?;
            if g.tokens != plain.tokens {
                return Err(EngineError::Request(format!(
                    "speculative decoding at rate {:?} changed the output (a bug: it must never)",
                    row.rate
                )));
            }
            let rate = g.tokens.len() as f64 / g.gen_time.as_secs_f64();
            if row.rate.is_none() {
                plain_rate = rate;
            }
            row.tok_s.push(rate);
            row.speedup.push(rate / plain_rate);
        }
    }
    Ok(rows)
}

/// One generation, its counts added to `row`.
fn measure(
    model: &Model,
    prompt: &[u32],
    opts: &GenerateOptions,
    spec: Option<Speculation<'_>>,
    prompt_step: &StatsSnapshot,
    row: &mut SpecRow,
) -> Result<Generation> {
    let counted = || {
        let mut all = Vec::new();
        model.experts.samples(&mut all);
        counters(&all)
    };
    let (before, counted_before) = (model.stats.snapshot(), counted());
    let g = model.generate_with(prompt, opts, spec, None, |_| {})?;
    let mut d = model.stats.snapshot().since(&before);
    // Decode steps only: the prompt's step computes the same experts in every run.
    d.weight_bytes -= prompt_step.weight_bytes;
    d.experts_run -= prompt_step.experts_run;
    row.tokens += g.tokens.len();
    row.spec.steps += g.spec.steps;
    row.spec.drafted += g.spec.drafted;
    row.spec.accepted += g.spec.accepted;
    row.weight_bytes += d.weight_bytes;
    row.experts_run += d.experts_run;
    for (name, end) in counted() {
        *row.counters.entry(name).or_default() += end - counted_before.get(name).copied().unwrap_or(0.0);
    }
    Ok(g)
}
