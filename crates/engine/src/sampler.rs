//! Turning logits into the next token: repetition penalty, top-k, top-p, min-p, temperature, then a draw
//! from a seeded generator (the order llama.cpp's default sampler chain uses). Temperature 0 is greedy.

#[derive(Clone, Debug)]
pub struct SamplerOptions {
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
    pub min_p: f32,
    pub repeat_penalty: f32,
    /// How many recent tokens the repetition penalty looks at.
    pub repeat_last_n: usize,
    pub seed: u64,
}

impl Default for SamplerOptions {
    fn default() -> Self {
        SamplerOptions { temperature: 0.8, top_k: 40, top_p: 0.95, min_p: 0.05, repeat_penalty: 1.0, repeat_last_n: 64, seed: 0 }
    }
}

impl SamplerOptions {
    pub fn greedy() -> Self {
        SamplerOptions { temperature: 0.0, ..Default::default() }
    }

    /// Every value in its meaningful range (named as in the OpenAI and llama-server request fields).
    pub fn check(&self) -> Result<(), String> {
        let checks = [
            ("temperature", self.temperature, self.temperature >= 0.0, "0 or more (0 is greedy)"),
            ("top_p", self.top_p, self.top_p > 0.0 && self.top_p <= 1.0, "in (0, 1]"),
            ("min_p", self.min_p, (0.0..=1.0).contains(&self.min_p), "in [0, 1]"),
            ("repeat_penalty", self.repeat_penalty, self.repeat_penalty > 0.0, "greater than 0 (1 is off)"),
        ];
        for (name, value, ok, range) in checks {
            if !(value.is_finite() && ok) {
                return Err(format!("{name} is {value}; it must be {range}"));
            }
        }
        Ok(())
    }
}

pub struct Sampler {
    opts: SamplerOptions,
    rng: SplitMix64,
    candidates: Vec<(u32, f32)>,
}

/// Highest logit, ties broken by the lowest token id.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

impl Sampler {
    pub fn new(opts: SamplerOptions) -> Sampler {
        Sampler { rng: SplitMix64(opts.seed), opts, candidates: Vec::new() }
    }

    /// Pick the next token from `logits`, given the tokens so far (`history`, for the repetition penalty).
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        let o = &self.opts;
        let mut penalised;
        let logits = if o.repeat_penalty != 1.0 {
            penalised = logits.to_vec();
            let recent = &history[history.len().saturating_sub(o.repeat_last_n)..];
            let mut seen = std::collections::HashSet::new();
            for &t in recent {
                if seen.insert(t) {
                    if let Some(l) = penalised.get_mut(t as usize) {
                        // As llama.cpp: shrink positive logits, push negative ones further down.
                        *l = if *l > 0.0 { *l / o.repeat_penalty } else { *l * o.repeat_penalty };
                    }
                }
            }
            &penalised[..]
        } else {
            logits
        };
        if o.temperature <= 0.0 {
            return argmax(logits);
        }

        let c = &mut self.candidates;
        c.clear();
        c.extend(logits.iter().enumerate().map(|(i, &l)| (i as u32, l)));
        c.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if o.top_k > 0 {
            c.truncate(o.top_k);
        }
        // Probabilities (at temperature 1) for the top-p and min-p filters.
        let max = c[0].1;
        let probs: Vec<f32> = {
            let e: Vec<f32> = c.iter().map(|&(_, l)| crate::ops::exp(l - max)).collect();
            let s: f32 = e.iter().sum();
            e.into_iter().map(|x| x / s).collect()
        };
        if o.top_p < 1.0 {
            let mut cum = 0.0;
            let mut keep = c.len();
            for (i, p) in probs.iter().enumerate() {
                cum += p;
                if cum >= o.top_p {
                    keep = i + 1;
                    break;
                }
            }
            c.truncate(keep.max(1));
        }
        if o.min_p > 0.0 {
            let floor = probs[0] * o.min_p;
            let keep = probs.iter().take(c.len()).take_while(|&&p| p >= floor).count();
            c.truncate(keep.max(1));
        }
        // Temperature, softmax over the survivors, one draw.
        let weights: Vec<f32> = c.iter().map(|&(_, l)| crate::ops::exp((l - max) / o.temperature)).collect();
        let total: f32 = weights.iter().sum();
        let mut r = self.rng.next_f32() * total;
        for (&(id, _), &wt) in c.iter().zip(&weights) {
            if r < wt {
                return id;
            }
            r -= wt;
        }
        c.last().map(|&(id, _)| id).unwrap_or(0)
    }
}

/// A small, well-known generator (SplitMix64): seeded runs are reproducible on every platform.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_out_of_range_are_named() {
        assert_eq!(SamplerOptions::default().check(), Ok(()));
        assert_eq!(SamplerOptions::greedy().check(), Ok(()));
        let bad = |o: SamplerOptions| o.check().unwrap_err();
        let d = SamplerOptions::default;
        assert_eq!(bad(SamplerOptions { temperature: f32::NAN, ..d() }), "temperature is NaN; it must be 0 or more (0 is greedy)");
        assert_eq!(bad(SamplerOptions { temperature: -0.5, ..d() }), "temperature is -0.5; it must be 0 or more (0 is greedy)");
        assert_eq!(bad(SamplerOptions { top_p: 0.0, ..d() }), "top_p is 0; it must be in (0, 1]");
        assert_eq!(bad(SamplerOptions { min_p: f32::INFINITY, ..d() }), "min_p is inf; it must be in [0, 1]");
        assert_eq!(bad(SamplerOptions { repeat_penalty: -1.0, ..d() }), "repeat_penalty is -1; it must be greater than 0 (1 is off)");
    }

    #[test]
    fn greedy_takes_the_first_maximum() {
        let mut s = Sampler::new(SamplerOptions::greedy());
        assert_eq!(s.sample(&[0.0, 3.0, 3.0, 1.0], &[]), 1);
    }

    #[test]
    fn top_k_one_is_greedy_at_any_temperature() {
        let mut s = Sampler::new(SamplerOptions { temperature: 5.0, top_k: 1, ..Default::default() });
        for _ in 0..20 {
            assert_eq!(s.sample(&[0.0, 1.0, 2.0, 1.9], &[]), 2);
        }
    }

    #[test]
    fn same_seed_same_draws_and_distribution_follows_logits() {
        let logits = [0.0f32, 1.0, 2.0];
        let opts = SamplerOptions { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0, ..Default::default() };
        let draw = |seed| {
            let mut s = Sampler::new(SamplerOptions { seed, ..opts.clone() });
            (0..3000).map(|_| s.sample(&logits, &[])).collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        let d = draw(7);
        let freq = |t| d.iter().filter(|&&x| x == t).count() as f32 / d.len() as f32;
        // softmax([0,1,2]) = [0.090, 0.245, 0.665]
        assert!((freq(2) - 0.665).abs() < 0.04 && (freq(0) - 0.090).abs() < 0.03, "{} {}", freq(0), freq(2));
    }

    #[test]
    fn repetition_penalty_changes_the_greedy_choice() {
        let mut s = Sampler::new(SamplerOptions { repeat_penalty: 2.0, ..SamplerOptions::greedy() });
        assert_eq!(s.sample(&[1.0, 1.5], &[1]), 0);
    }

    #[test]
    fn min_p_drops_unlikely_tokens() {
        let opts = SamplerOptions { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.5, seed: 1, ..Default::default() };
        let mut s = Sampler::new(opts);
        for _ in 0..200 {
            assert_ne!(s.sample(&[5.0, 4.9, 0.0], &[]), 2);
        }
    }
}
