//! `titan bench`: prompt processing and decode speed measured the way llama-bench measures them (a
//! prompt of N tokens processed as one batch; N tokens decoded one at a time from an empty context, each
//! fed the token sampled from the last), so the two can be compared on the same file.

use std::collections::BTreeMap;
use std::time::Instant;

use crate::model::{Model, Outputs};
use crate::sampler::{Sampler, SamplerOptions};
use crate::samples::counters;
use crate::stats::{StatsSnapshot, PHASES};
use crate::weights::Residency;
use crate::Result;

mod speculative;
pub use speculative::{bench_speculative, SpecBenchOptions, SpecRow};

#[derive(Clone, Debug)]
pub struct BenchOptions {
    pub prompt_tokens: usize,
    pub gen_tokens: usize,
    pub repetitions: usize,
}

#[derive(Clone, Debug)]
pub struct BenchReport {
    /// One figure per repetition.
    pub prompt_tok_s: Vec<f64>,
    pub decode_tok_s: Vec<f64>,
    /// The same over the second half of each decode only: with experts streamed, the cache has warmed up
    /// by then, so this is the steady state a long generation sees.
    pub decode_steady_tok_s: Vec<f64>,
    /// Tokens those second halves hold, over all repetitions.
    pub steady_tokens: usize,
    /// What the expert source counted over those second halves (its unlabelled counters, by name:
    /// `expert_cache_hits_total`, `expert_cache_read_bytes_total`… when experts stream), empty for a
    /// source that counts nothing.
    pub steady_counters: BTreeMap<&'static str, f64>,
    /// Weight bytes read per decoded token.
    pub decode_bytes_per_token: f64,
    /// Share of decode time per phase (attention, router, experts, head).
    pub decode_phases: Vec<(&'static str, f64)>,
    /// Share of prompt-processing time per phase.
    pub prompt_phases: Vec<(&'static str, f64)>,
    pub peak_rss_bytes: u64,
}

pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => 0.0,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

/// Deterministic token ids spread over the vocabulary (llama-bench also uses arbitrary tokens).
pub(crate) fn prompt(n: usize, vocab: usize) -> Vec<u32> {
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % vocab as u64) as u32
        })
        .collect()
}

pub fn bench(model: &Model, o: &BenchOptions) -> Result<BenchReport> {
    let vocab = model.config.n_vocab;
    let tokens = prompt(o.prompt_tokens.max(1), vocab);
    // Warm-up, as llama-bench's: the whole prompt once and one decode step, which starts the thread pool
    // and sizes (and faults in) every working buffer for the batches measured below. Resident weights used
    // in place are read in first, as llama.cpp's loader reads its mapping (streamed experts are not: reading
    // the whole file is exactly what the store avoids): a file used in place, MXFP4 experts for one, would
    // otherwise fault its pages in from disk during the passes measured (a 14 GiB DeepSeek-V4 file after
    // another process had taken the page cache: 2.6-6 tok/s, then 9-11 once in memory).
    if model.weights.residency() == Residency::All {
        model.weights.populate_in_place();
    }
    // One sequence for the whole bench, each repetition restarting it at position 0, as llama-bench keeps
    // one context and clears its memory: a fresh sequence per repetition made the first one fault in its
    // cache and working buffers again (10–20% slower prompts on the 2-core EPYC VM than the repetitions
    // after it, whose buffers the allocator recycled).
    let mut seq = model.new_sequence(tokens.len().max(o.gen_tokens) + 1);
    model.forward(&tokens, 0, &mut seq, Outputs::Last)?;
    model.forward(&tokens[..1], tokens.len(), &mut seq, Outputs::Last)?;

    let (mut prompt_tok_s, mut decode_tok_s, mut decode_steady_tok_s) = (Vec::new(), Vec::new(), Vec::new());
    let counted = || {
        let mut all = Vec::new();
        model.experts.samples(&mut all);
        counters(&all)
    };
    let mut steady: BTreeMap<&'static str, f64> = BTreeMap::new();
    let (mut prompt, mut decode) = (StatsSnapshot::default(), StatsSnapshot::default());
    for _ in 0..o.repetitions.max(1) {
        if o.prompt_tokens > 0 {
            let before = model.stats.snapshot();
            let t = Instant::now();
            model.forward(&tokens, 0, &mut seq, Outputs::Last)?;
            prompt_tok_s.push(tokens.len() as f64 / t.elapsed().as_secs_f64());
            prompt.add(&model.stats.snapshot().since(&before));
        }
        if o.gen_tokens > 0 {
            let before = model.stats.snapshot();
            let mut next = tokens[0];
            // Each next token is sampled at temperature 1, as in generation, not the argmax: greedy decoding
            // of a synthetic model soon loops over a few tokens, and so over a few experts, which would
            // flatter a streamed model's cache. (llama-bench feeds random tokens, to the same end.)
            let mut sampler = Sampler::new(SamplerOptions {
                temperature: 1.0,
                top_k: 0,
                top_p: 1.0,
                min_p: 0.0,
                repeat_penalty: 1.0,
                repeat_last_n: 0,
                seed: 1,
                ..Default::default()
            });
            let half = o.gen_tokens / 2;
            // The tokens fed so far: the sampler draws by position.
            let mut history = Vec::with_capacity(o.gen_tokens + 1);
            let t = Instant::now();
            let (mut t_half, mut at_half) = (t, BTreeMap::new());
            for pos in 0..o.gen_tokens {
                if pos == half {
                    (t_half, at_half) = (Instant::now(), counted());
                }
                history.push(next);
                next = sampler.sample(model.forward(&[next], pos, &mut seq, Outputs::Last)?, &history);
            }
            decode_tok_s.push(o.gen_tokens as f64 / t.elapsed().as_secs_f64());
            decode_steady_tok_s.push((o.gen_tokens - half) as f64 / t_half.elapsed().as_secs_f64());
            for (name, end) in counted() {
                *steady.entry(name).or_default() += end - at_half.get(name).copied().unwrap_or(0.0);
            }
            decode.add(&model.stats.snapshot().since(&before));
        }
    }
    let shares = |s: &StatsSnapshot| {
        let total: f64 = s.phase.iter().map(|d| d.as_secs_f64()).sum();
        PHASES
            .iter()
            .map(|p| (p.name(), s.phase[*p as usize].as_secs_f64() / total.max(1e-12)))
            .collect()
    };
    let decoded = (o.gen_tokens * o.repetitions.max(1)).max(1) as f64;
    Ok(BenchReport {
        prompt_tok_s,
        decode_tok_s,
        steady_tokens: (o.gen_tokens - o.gen_tokens / 2) * decode_steady_tok_s.len(),
        decode_steady_tok_s,
        steady_counters: steady,
        decode_bytes_per_token: decode.weight_bytes as f64 / decoded,
        decode_phases: shares(&decode),
        prompt_phases: shares(&prompt),
        peak_rss_bytes: peak_rss_bytes(),
    })
}

/// Peak resident set size of this process (VmHWM), 0 where /proc is not available.
pub fn peak_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

#[cfg(test)]
mod tests {
    #[test]
    fn median_of_odd_and_even() {
        assert_eq!(super::median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(super::median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
