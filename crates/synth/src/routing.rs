//! How a model routes, measured by running it: a seeded, sampled generation through TITAN's engine,
//! recording each layer's top-k expert ids per token (the trace's `topk_ids` decisions).
//!
//! Per layer: how many distinct experts the tokens used, and the mean overlap `|E_t ∩ E_{t-1}| / k`
//! between consecutive tokens. A trained model uses most of a layer's experts over a few hundred
//! tokens and consecutive tokens share roughly a third of theirs; collapsed routing shows up as few
//! experts and overlaps near 1.

use std::fmt;
use std::path::Path;
use std::time::{Duration, Instant};

use titan_engine::sampler::{Sampler, SamplerOptions};
use titan_engine::trace::Trace;
use titan_engine::{Model, Outputs};

use crate::blocks::splitmix;
use crate::SynthError;

#[derive(Clone, Debug, PartialEq)]
pub struct LayerRouting {
    pub layer: usize,
    /// Distinct experts chosen by any token.
    pub experts_used: usize,
    /// Mean over consecutive token pairs of |E_t ∩ E_{t-1}| / k.
    pub mean_overlap: f64,
}

#[derive(Clone, Debug)]
pub struct RoutingReport {
    pub n_expert: usize,
    pub k: usize,
    /// Tokens whose routing was recorded (the prompt's last, then each generated one but the last).
    pub tokens: usize,
    pub layers: Vec<LayerRouting>,
    /// The prompt token and the sampled ones.
    pub token_ids: Vec<u32>,
    /// The generated text (filler words of the stand-in vocabulary).
    pub text: String,
    pub elapsed: Duration,
}

impl RoutingReport {
    pub fn mean_experts_used(&self) -> f64 {
        self.layers.iter().map(|l| l.experts_used as f64).sum::<f64>() / self.layers.len().max(1) as f64
    }

    pub fn min_experts_used(&self) -> usize {
        self.layers.iter().map(|l| l.experts_used).min().unwrap_or(0)
    }

    pub fn mean_overlap(&self) -> f64 {
        self.layers.iter().map(|l| l.mean_overlap).sum::<f64>() / self.layers.len().max(1) as f64
    }

    pub fn max_overlap(&self) -> f64 {
        self.layers.iter().map(|l| l.mean_overlap).fold(0.0, f64::max)
    }

    /// Experts a layer would use if every token drew its k experts uniformly at random.
    pub fn random_experts_used(&self) -> f64 {
        let (n, draws) = (self.n_expert as f64, self.tokens as f64);
        n * (1.0 - (1.0 - self.k as f64 / n).powf(draws))
    }
}

impl fmt::Display for RoutingReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "routing over {} sampled tokens ({} experts, top-{}):",
            self.tokens, self.n_expert, self.k
        )?;
        writeln!(f, "  layer  experts used  overlap(t, t-1)")?;
        for l in &self.layers {
            writeln!(
                f,
                "  {:>5}  {:>5} / {:<5} {:>8.2}",
                l.layer, l.experts_used, self.n_expert, l.mean_overlap
            )?;
        }
        write!(
            f,
            "summary: experts used per layer {:.1} of {} on average (min {}; uniform random routing: {:.1}), \
             consecutive-token overlap {:.2} on average (max {:.2}; random: {:.2})",
            self.mean_experts_used(),
            self.n_expert,
            self.min_experts_used(),
            self.random_experts_used(),
            self.mean_overlap(),
            self.max_overlap(),
            self.k as f64 / self.n_expert as f64
        )
    }
}

/// Generate `tokens` tokens from a one-token prompt (temperature 1, no truncation, seeded) with
/// TITAN's engine on the model at `model_path`, and report each layer's routing. End-of-generation
/// tokens are never sampled, so the run always has `tokens` steps.
pub fn routing_report(model_path: &Path, tokens: usize, seed: u64) -> Result<RoutingReport, SynthError> {
    let t0 = Instant::now();
    let model = Model::load(model_path)?;
    let c = &model.config;
    let (n_expert, k, n_layer) = (c.n_expert, c.n_expert_used, c.n_layer);
    let eog: Vec<usize> = (0..c.n_vocab as u32)
        .filter(|&t| model.tokenizer.is_eog(t))
        .map(|t| t as usize)
        .collect();

    let mut sampler = Sampler::new(SamplerOptions {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        repeat_penalty: 1.0,
        repeat_last_n: 0,
        seed,
        ..Default::default()
    });
    let mut token = (splitmix(seed) % c.n_vocab as u64) as u32;
    while eog.contains(&(token as usize)) {
        token = (token + 1) % c.n_vocab as u32;
    }
    let mut history = vec![token];
    let mut seq = model.new_sequence(tokens.max(1) + 1);
    // ids[layer][step] = that step's top-k experts, ascending
    let mut ids: Vec<Vec<Vec<u32>>> = vec![Vec::with_capacity(tokens); n_layer];
    for pos in 0..tokens.max(1) {
        let mut trace = Trace::default();
        let mut logits = model
            .forward_traced(&[token], pos, &mut seq, Outputs::Last, Some(&mut trace))?
            .to_vec();
        for r in trace.records.iter().filter(|r| r.name.ends_with(".topk_ids")) {
            let layer: usize = r
                .name
                .split('.')
                .nth(1)
                .and_then(|l| l.strip_prefix('l'))
                .and_then(|l| l.parse().ok())
                .unwrap_or(usize::MAX);
            if let Some(steps) = ids.get_mut(layer) {
                steps.push(r.u32s().collect());
            }
        }
        for &t in &eog {
            logits[t] = f32::NEG_INFINITY;
        }
        token = sampler.sample(&logits, &history);
        history.push(token);
    }

    // Dense layers (DeepSeek's first) route nothing and are left out.
    let layers = ids
        .iter()
        .enumerate()
        .filter(|(_, steps)| !steps.is_empty())
        .map(|(layer, steps)| {
            let mut used = vec![false; n_expert];
            for e in steps.iter().flatten() {
                used[*e as usize] = true;
            }
            let pairs: Vec<f64> = steps
                .windows(2)
                .map(|w| w[1].iter().filter(|e| w[0].contains(e)).count() as f64 / k as f64)
                .collect();
            LayerRouting {
                layer,
                experts_used: used.iter().filter(|&&u| u).count(),
                mean_overlap: pairs.iter().sum::<f64>() / pairs.len().max(1) as f64,
            }
        })
        .collect();
    let text = model.tokenizer.decode(&history[1..]).unwrap_or_default();
    Ok(RoutingReport {
        n_expert,
        k,
        tokens: tokens.max(1),
        layers,
        token_ids: history,
        text,
        elapsed: t0.elapsed(),
    })
}
