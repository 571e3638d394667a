//! Turning logits into the next token: logit bias, repetition penalty, frequency and presence penalties,
//! top-k, top-p, min-p, temperature, then a draw from a seeded generator (the order llama.cpp's default
//! sampler chain uses). Temperature 0 is greedy. Given the same options (the seed among them) and the same
//! logits, a sampler draws the same tokens.
//!
//! The draw for the token that follows `history` uses value `history.len()` of the seed's random stream,
//! whatever was drawn before: a token depends on (seed, position, logits) only, so a speculative step that
//! samples several positions of one forward pass draws exactly what plain decoding draws there
//! (docs/speculative.md).

use std::collections::BTreeMap;

use titan_kernels::splitmix::SplitMix64;

#[derive(Clone, Debug)]
pub struct SamplerOptions {
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
    pub min_p: f32,
    pub repeat_penalty: f32,
    /// How many recent tokens the repetition penalty looks at.
    pub repeat_last_n: usize,
    /// OpenAI's `frequency_penalty`: subtracted from a token's logit once for every time this sampler has
    /// chosen it before.
    pub frequency_penalty: f32,
    /// OpenAI's `presence_penalty`: subtracted once from the logit of every token this sampler has chosen.
    pub presence_penalty: f32,
    /// Added to a token's logit before anything else (OpenAI's `logit_bias`, in [-100, 100]); a bias of
    /// [`BAN`] or less takes the token out of the draw altogether. Ids past the logits are ignored.
    pub logit_bias: Vec<(u32, f32)>,
    pub seed: u64,
}

/// A logit bias this low bans its token (its logit becomes -∞), whatever the other logits are: OpenAI
/// documents -100 as a ban, and a plain -100 would not be one for a model whose logits span more.
pub const BAN: f32 = -100.0;

impl Default for SamplerOptions {
    fn default() -> Self {
        SamplerOptions {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            logit_bias: Vec::new(),
            seed: 0,
        }
    }
}

impl SamplerOptions {
    pub fn greedy() -> Self {
        SamplerOptions {
            temperature: 0.0,
            ..Default::default()
        }
    }

    /// Every value in its meaningful range (named as in the OpenAI and llama-server request fields).
    pub fn check(&self) -> Result<(), String> {
        let checks = [
            (
                "temperature",
                self.temperature,
                self.temperature >= 0.0,
                "0 or more (0 is greedy)",
            ),
            ("top_p", self.top_p, self.top_p > 0.0 && self.top_p <= 1.0, "in (0, 1]"),
            ("min_p", self.min_p, (0.0..=1.0).contains(&self.min_p), "in [0, 1]"),
            (
                "repeat_penalty",
                self.repeat_penalty,
                self.repeat_penalty > 0.0,
                "greater than 0 (1 is off)",
            ),
            (
                "frequency_penalty",
                self.frequency_penalty,
                (-2.0..=2.0).contains(&self.frequency_penalty),
                "in [-2, 2]",
            ),
            (
                "presence_penalty",
                self.presence_penalty,
                (-2.0..=2.0).contains(&self.presence_penalty),
                "in [-2, 2]",
            ),
        ];
        for (name, value, ok, range) in checks {
            if !(value.is_finite() && ok) {
                return Err(format!("{name} is {value}; it must be {range}"));
            }
        }
        for &(id, bias) in &self.logit_bias {
            if !(bias.is_finite() && (-100.0..=100.0).contains(&bias)) {
                return Err(format!("logit_bias of token {id} is {bias}; it must be in [-100, 100]"));
            }
        }
        Ok(())
    }

    /// Whether the sampler changes the logits before it filters them.
    fn adjusts(&self) -> bool {
        self.repeat_penalty != 1.0
            || self.frequency_penalty != 0.0
            || self.presence_penalty != 0.0
            || !self.logit_bias.is_empty()
    }
}

pub struct Sampler {
    opts: SamplerOptions,
    /// How many times this sampler has chosen each token (for the frequency and presence penalties; kept
    /// only when one of them is on).
    chosen: BTreeMap<u32, u32>,
    /// Working space: the logits after bias and penalties, the candidates as [`rank_key`]s, and their
    /// weights in the draw.
    adjusted: Vec<f32>,
    keys: Vec<u64>,
    weights: Vec<f32>,
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

/// Token `id` with `logit` as one integer whose ascending order is the rank order: highest logit first
/// (in `f32::total_cmp`'s order), ties by the lowest id. Sorting and selecting then compare plain
/// integers, which for a whole vocabulary is many times faster than comparing (logit, id) pairs.
fn rank_key(id: u32, logit: f32) -> u64 {
    // Flip a negative float's bits and set a positive one's sign bit: unsigned order is then total_cmp's.
    let b = logit.to_bits();
    let ascending = if b >> 31 == 1 { !b } else { b | 1 << 31 };
    u64::from(!ascending) << 32 | u64::from(id)
}

impl Sampler {
    pub fn new(opts: SamplerOptions) -> Sampler {
        Sampler {
            opts,
            chosen: BTreeMap::new(),
            adjusted: Vec::new(),
            keys: Vec::new(),
            weights: Vec::new(),
        }
    }

    /// Pick the next token from `logits`, given the tokens so far (`history`: for the repetition penalty,
    /// and its length is the position whose random value is drawn). The frequency and presence penalties
    /// count this sampler's own earlier picks: the generated tokens.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        self.sample_among(logits, history, None)
    }

    /// As [`sample`](Self::sample), but only among the tokens set in `allowed`: bit `t % 32` of word
    /// `t / 32` for token `t`, tokens past its end excluded (a grammar's mask over the vocabulary). The
    /// others weigh nothing, as if banned, before the penalties and filters; the chosen token is an allowed
    /// one unless every allowed token is banned by the bias too.
    pub fn sample_allowed(&mut self, logits: &[f32], history: &[u32], allowed: &[u32]) -> u32 {
        self.sample_among(logits, history, Some(allowed))
    }

    fn sample_among(&mut self, logits: &[f32], history: &[u32], allowed: Option<&[u32]>) -> u32 {
        let token = self.pick(logits, history, allowed);
        if self.opts.frequency_penalty != 0.0 || self.opts.presence_penalty != 0.0 {
            *self.chosen.entry(token).or_default() += 1;
        }
        token
    }

    /// `logits` with the mask, the bias and the penalties applied, into `self.adjusted`.
    fn adjust(&mut self, logits: &[f32], history: &[u32], allowed: Option<&[u32]>) {
        let o = &self.opts;
        let l = &mut self.adjusted;
        l.clear();
        l.extend_from_slice(logits);
        if let Some(allowed) = allowed {
            // A word at a time: a grammar's mask is mostly whole words of nothing (or of everything).
            for (i, chunk) in l.chunks_mut(32).enumerate() {
                let word = allowed.get(i).copied().unwrap_or(0);
                if word == u32::MAX {
                    continue;
                }
                if word == 0 {
                    chunk.fill(f32::NEG_INFINITY);
                    continue;
                }
                for (b, x) in chunk.iter_mut().enumerate() {
                    if word >> b & 1 == 0 {
                        *x = f32::NEG_INFINITY;
                    }
                }
            }
        }
        // As llama.cpp: the bias first, then the repetition penalty, then frequency and presence.
        for &(id, bias) in &o.logit_bias {
            if let Some(x) = l.get_mut(id as usize) {
                *x = if bias <= BAN { f32::NEG_INFINITY } else { *x + bias };
            }
        }
        if o.repeat_penalty != 1.0 {
            let recent = &history[history.len().saturating_sub(o.repeat_last_n)..];
            let mut seen = std::collections::HashSet::new();
            for &t in recent {
                if seen.insert(t) {
                    if let Some(x) = l.get_mut(t as usize) {
                        // As llama.cpp: shrink positive logits, push negative ones further down.
                        *x = if *x > 0.0 {
                            *x / o.repeat_penalty
                        } else {
                            *x * o.repeat_penalty
                        };
                    }
                }
            }
        }
        for (&t, &n) in &self.chosen {
            if let Some(x) = l.get_mut(t as usize) {
                *x -= n as f32 * o.frequency_penalty + o.presence_penalty;
            }
        }
    }

    fn pick(&mut self, logits: &[f32], history: &[u32], allowed: Option<&[u32]>) -> u32 {
        let adjusts = self.opts.adjusts() || allowed.is_some();
        if adjusts {
            self.adjust(logits, history, allowed);
        }
        let Sampler {
            opts: o,
            adjusted,
            keys: c,
            weights,
            ..
        } = self;
        let logits = if adjusts { &adjusted[..] } else { logits };
        if o.temperature <= 0.0 || logits.is_empty() {
            return argmax(logits);
        }

        c.clear();
        c.extend(logits.iter().enumerate().map(|(i, &l)| rank_key(i as u32, l)));
        let logit = |k: u64| logits[k as u32 as usize];
        let id = |k: u64| k as u32;
        // The filters walk the candidates in rank order. Without any, a draw over the whole vocabulary in
        // id order follows the same distribution, and the vocabulary is not sorted at all.
        let ranked = o.top_k > 0 || o.top_p < 1.0 || o.min_p > 0.0;
        if o.top_k > 0 && o.top_k < c.len() {
            c.select_nth_unstable(o.top_k - 1);
            c.truncate(o.top_k);
        }
        let max = if ranked {
            c.sort_unstable();
            logit(c[0])
        } else {
            logits.iter().copied().fold(f32::NEG_INFINITY, f32::max)
        };
        if max == f32::NEG_INFINITY {
            // Every token banned: there is nothing to draw from, and the weights below would be NaN.
            return argmax(logits);
        }
        if o.top_p < 1.0 || o.min_p > 0.0 {
            // Probabilities (at temperature 1) for the top-p and min-p filters.
            let probs = &mut *weights;
            probs.clear();
            probs.extend(c.iter().map(|&k| logit(k) - max));
            titan_kernels::exp_in_place(probs);
            let s: f32 = probs.iter().sum();
            probs.iter_mut().for_each(|p| *p /= s);
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
        }
        // Temperature, softmax over the survivors, one draw.
        weights.clear();
        weights.extend(c.iter().map(|&k| (logit(k) - max) / o.temperature));
        titan_kernels::exp_in_place(weights);
        let total: f32 = weights.iter().sum();
        let mut r = SplitMix64::nth_f32(o.seed, history.len() as u64) * total;
        for (&k, &wt) in c.iter().zip(weights.iter()) {
            if r < wt {
                return id(k);
            }
            r -= wt;
        }
        // Rounding left `r` past the last weight: the last candidate that weighs anything (a banned or
        // masked one weighs nothing, and is never drawn).
        c.iter()
            .zip(weights.iter())
            .rev()
            .find(|&(_, &wt)| wt > 0.0)
            .map_or(id(c[0]), |(&k, _)| id(k))
    }
}

/// A chosen token's log-probability and the `top` most likely tokens' (highest first, ties by the lowest
/// id), all under the model's own distribution: softmax of the logits as the model gave them, before any
/// bias, penalty, filter or temperature (as llama-server reports them).
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    pub token: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

/// [`TokenLogprobs`] of `token` under `logits`, with the `top` most likely tokens. The normaliser is summed
/// in f64, in id order.
pub fn logprobs(logits: &[f32], token: u32, top: usize) -> TokenLogprobs {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let log_sum = logits.iter().map(|&l| ((l - max) as f64).exp()).sum::<f64>().ln() as f32;
    let logprob = |t: u32| (logits[t as usize] - max) - log_sum;
    let mut keys: Vec<u64> = logits.iter().enumerate().map(|(i, &l)| rank_key(i as u32, l)).collect();
    let top = top.min(keys.len());
    if top > 0 && top < keys.len() {
        keys.select_nth_unstable(top - 1);
    }
    keys.truncate(top);
    keys.sort_unstable();
    TokenLogprobs {
        token,
        logprob: logprob(token),
        top: keys.iter().map(|&k| (k as u32, logprob(k as u32))).collect(),
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
        assert_eq!(
            bad(SamplerOptions {
                temperature: f32::NAN,
                ..d()
            }),
            "temperature is NaN; it must be 0 or more (0 is greedy)"
        );
        assert_eq!(
            bad(SamplerOptions {
                temperature: -0.5,
                ..d()
            }),
            "temperature is -0.5; it must be 0 or more (0 is greedy)"
        );
        assert_eq!(
            bad(SamplerOptions { top_p: 0.0, ..d() }),
            "top_p is 0; it must be in (0, 1]"
        );
        assert_eq!(
            bad(SamplerOptions {
                min_p: f32::INFINITY,
                ..d()
            }),
            "min_p is inf; it must be in [0, 1]"
        );
        assert_eq!(
            bad(SamplerOptions {
                repeat_penalty: -1.0,
                ..d()
            }),
            "repeat_penalty is -1; it must be greater than 0 (1 is off)"
        );
    }

    /// A history of `n` tokens: its length is the position drawn for (the tokens matter only to the
    /// repetition penalty, off in the tests that use this).
    fn past(n: usize) -> Vec<u32> {
        vec![0; n]
    }

    #[test]
    fn greedy_takes_the_first_maximum() {
        let mut s = Sampler::new(SamplerOptions::greedy());
        assert_eq!(s.sample(&[0.0, 3.0, 3.0, 1.0], &[]), 1);
    }

    #[test]
    fn top_k_one_is_greedy_at_any_temperature() {
        let mut s = Sampler::new(SamplerOptions {
            temperature: 5.0,
            top_k: 1,
            ..Default::default()
        });
        for _ in 0..20 {
            assert_eq!(s.sample(&[0.0, 1.0, 2.0, 1.9], &[]), 2);
        }
    }

    #[test]
    fn same_seed_same_draws_and_distribution_follows_logits() {
        let logits = [0.0f32, 1.0, 2.0];
        let opts = SamplerOptions {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            ..Default::default()
        };
        let draw = |seed| {
            let mut s = Sampler::new(SamplerOptions { seed, ..opts.clone() });
            (0..3000).map(|i| s.sample(&logits, &past(i))).collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
        let d = draw(7);
        let freq = |t| d.iter().filter(|&&x| x == t).count() as f32 / d.len() as f32;
        // softmax([0,1,2]) = [0.090, 0.245, 0.665]
        assert!(
            (freq(2) - 0.665).abs() < 0.04 && (freq(0) - 0.090).abs() < 0.03,
            "{} {}",
            freq(0),
            freq(2)
        );
    }

    #[test]
    fn rank_keys_order_as_logits_descending_then_ids_ascending() {
        let mut rng = SplitMix64(5);
        let mut logits: Vec<f32> = (0..500).map(|_| (rng.next_f32() - 0.5) * 20.0).collect();
        logits.extend([
            0.0,
            -0.0,
            1.5,
            1.5,
            -1.5,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MIN_POSITIVE,
            -f32::MIN_POSITIVE,
        ]);
        let mut by_pairs: Vec<(u32, f32)> = logits.iter().enumerate().map(|(i, &l)| (i as u32, l)).collect();
        by_pairs.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut by_keys: Vec<u64> = logits.iter().enumerate().map(|(i, &l)| rank_key(i as u32, l)).collect();
        by_keys.sort_unstable();
        assert_eq!(
            by_keys.iter().map(|&k| k as u32).collect::<Vec<_>>(),
            by_pairs.iter().map(|p| p.0).collect::<Vec<_>>()
        );
    }

    /// The filters as first written: every candidate sorted by (logit descending, id ascending), then top-k,
    /// top-p, min-p and the draw in that order. The sampler must draw exactly what this draws.
    fn reference_draw(o: &SamplerOptions, rng: &mut SplitMix64, logits: &[f32]) -> u32 {
        let mut c: Vec<(u32, f32)> = logits.iter().enumerate().map(|(i, &l)| (i as u32, l)).collect();
        c.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if o.top_k > 0 {
            c.truncate(o.top_k);
        }
        let max = c[0].1;
        let e: Vec<f32> = c.iter().map(|&(_, l)| crate::ops::exp(l - max)).collect();
        let s: f32 = e.iter().sum();
        let probs: Vec<f32> = e.into_iter().map(|x| x / s).collect();
        if o.top_p < 1.0 {
            let mut cum = 0.0;
            let keep = probs.iter().position(|p| {
                cum += p;
                cum >= o.top_p
            });
            c.truncate(keep.map_or(c.len(), |i| i + 1).max(1));
        }
        if o.min_p > 0.0 {
            let keep = probs
                .iter()
                .take(c.len())
                .take_while(|&&p| p >= probs[0] * o.min_p)
                .count();
            c.truncate(keep.max(1));
        }
        let w: Vec<f32> = c
            .iter()
            .map(|&(_, l)| crate::ops::exp((l - max) / o.temperature))
            .collect();
        let mut r = rng.next_f32() * w.iter().sum::<f32>();
        for (&(id, _), &wt) in c.iter().zip(&w) {
            if r < wt {
                return id;
            }
            r -= wt;
        }
        c.last().unwrap().0
    }

    #[test]
    fn filtered_draws_are_the_sorted_references_draws() {
        let mut gen = SplitMix64(11);
        let vocab = 3000;
        let d = SamplerOptions::default;
        let cases = [
            d(),
            SamplerOptions { top_k: 0, ..d() },
            SamplerOptions {
                top_k: 0,
                min_p: 0.0,
                ..d()
            },
            SamplerOptions {
                top_k: 5,
                top_p: 1.0,
                min_p: 0.0,
                temperature: 1.3,
                ..d()
            },
            SamplerOptions {
                top_k: vocab + 10,
                ..d()
            },
        ];
        for (n, o) in cases.into_iter().enumerate() {
            let o = SamplerOptions { seed: n as u64, ..o };
            let (mut s, mut reference) = (Sampler::new(o.clone()), SplitMix64(o.seed));
            for i in 0..50 {
                // Logits with ties, as a quantised model's often have.
                let logits: Vec<f32> = (0..vocab)
                    .map(|_| ((gen.next_f32() * 40.0).round() - 20.0) / 4.0)
                    .collect();
                assert_eq!(
                    s.sample(&logits, &past(i)),
                    reference_draw(&o, &mut reference, &logits),
                    "case {n}: {o:?}"
                );
            }
        }
    }

    #[test]
    fn repetition_penalty_changes_the_greedy_choice() {
        let mut s = Sampler::new(SamplerOptions {
            repeat_penalty: 2.0,
            ..SamplerOptions::greedy()
        });
        assert_eq!(s.sample(&[1.0, 1.5], &[1]), 0);
    }

    #[test]
    fn logit_bias_forces_and_bans_tokens() {
        let logits = [3.0f32, 1.0, 2.0, -4.0];
        let biased = |bias: Vec<(u32, f32)>, temperature| {
            let mut s = Sampler::new(SamplerOptions {
                logit_bias: bias,
                temperature,
                seed: 9,
                ..Default::default()
            });
            (0..50).map(|i| s.sample(&logits, &past(i))).collect::<Vec<_>>()
        };
        // +100 makes the lowest logit the choice, greedy or drawn.
        assert!(biased(vec![(3, 100.0)], 0.0).iter().all(|&t| t == 3));
        assert!(biased(vec![(3, 100.0)], 1.0).iter().all(|&t| t == 3));
        // -100 bans: never drawn even at a high temperature, and greedy takes the next best.
        assert!(biased(vec![(0, -100.0)], 0.0).iter().all(|&t| t == 2));
        assert!(biased(vec![(0, -100.0), (2, -100.0)], 50.0)
            .iter()
            .all(|&t| t == 1 || t == 3));
        // A small bias adds to the logit: 1 + 1.5 > 2, below 3.
        assert!(biased(vec![(1, 1.5)], 0.0).iter().all(|&t| t == 0));
        assert!(biased(vec![(0, -1.0), (1, 1.5)], 0.0).iter().all(|&t| t == 1));
        // Ids past the vocabulary change nothing; every token banned still gives a token.
        assert!(biased(vec![(99, 100.0)], 0.0).iter().all(|&t| t == 0));
        let all: Vec<(u32, f32)> = (0..4).map(|t| (t, -100.0)).collect();
        assert_eq!(biased(all.clone(), 1.0), biased(all, 1.0));
    }

    #[test]
    fn a_mask_keeps_the_draw_among_its_tokens() {
        // 70 tokens, the highest logits outside the mask; allowed: 5, 33 and 64 (three words, the last short).
        let logits: Vec<f32> = (0..70)
            .map(|t| if t % 2 == 0 { 5.0 } else { t as f32 / 70.0 })
            .collect();
        let mut allowed = vec![0u32; 3];
        for t in [5u32, 33, 64] {
            allowed[t as usize / 32] |= 1 << (t % 32);
        }
        // 64 has an even id (a high logit) but is allowed: greedy takes it.
        let mut greedy = Sampler::new(SamplerOptions::greedy());
        assert_eq!(greedy.sample_allowed(&logits, &[], &allowed), 64);
        allowed[2] = 0;
        assert_eq!(greedy.sample_allowed(&logits, &[], &allowed), 33);
        // Drawn at a high temperature, with and without filters: only 5 and 33, both of them.
        for (top_k, min_p) in [(40, 0.05), (0, 0.0)] {
            let mut s = Sampler::new(SamplerOptions {
                temperature: 20.0,
                top_k,
                min_p,
                seed: 3,
                ..Default::default()
            });
            let d: Vec<u32> = (0..200)
                .map(|i| s.sample_allowed(&logits, &past(i), &allowed))
                .collect();
            assert!(d.iter().all(|&t| t == 5 || t == 33), "{d:?}");
            assert!(d.contains(&5) && d.contains(&33));
        }
        // A mask shorter than the vocabulary excludes the tokens past it.
        assert_eq!(greedy.sample_allowed(&logits, &[], &allowed[..1]), 5);
    }

    /// OpenAI's definition: logit[j] − count[j] × frequency_penalty − (count[j] > 0) × presence_penalty, the
    /// counts over the tokens generated so far (not the prompt).
    fn penalised_greedy(logits: &[f32], steps: usize, frequency: f32, presence: f32) -> Vec<u32> {
        let mut counts = vec![0u32; logits.len()];
        let mut out = Vec::new();
        for _ in 0..steps {
            let l: Vec<f32> = logits
                .iter()
                .zip(&counts)
                .map(|(&l, &c)| l - c as f32 * frequency - if c > 0 { presence } else { 0.0 })
                .collect();
            let t = argmax(&l);
            counts[t as usize] += 1;
            out.push(t);
        }
        out
    }

    #[test]
    fn frequency_and_presence_penalties_follow_openais_definition() {
        let logits = [2.0f32, 1.6, 1.0, 0.1];
        for (frequency, presence) in [(0.0, 0.0), (0.5, 0.0), (0.0, 0.5), (0.3, 0.2), (2.0, 2.0), (-0.5, 0.0)] {
            let mut s = Sampler::new(SamplerOptions {
                frequency_penalty: frequency,
                presence_penalty: presence,
                ..SamplerOptions::greedy()
            });
            // The prompt (history) does not count: only the sampler's own picks do.
            let prompt = [0u32, 0, 0, 1];
            let got: Vec<u32> = (0..12).map(|_| s.sample(&logits, &prompt)).collect();
            assert_eq!(
                got,
                penalised_greedy(&logits, 12, frequency, presence),
                "frequency {frequency}, presence {presence}"
            );
        }
        // The two penalties differ: frequency keeps pushing a repeated token down, presence only once.
        assert_eq!(penalised_greedy(&logits, 4, 0.5, 0.0), [0, 1, 0, 1]);
        assert_eq!(penalised_greedy(&logits, 4, 0.0, 0.5), [0, 1, 0, 0]);
    }

    #[test]
    fn penalised_and_biased_draws_repeat_with_their_seed() {
        let mut gen = SplitMix64(3);
        let steps: Vec<Vec<f32>> = (0..40)
            .map(|_| (0..200).map(|_| gen.next_f32() * 8.0).collect())
            .collect();
        let draw = |seed| {
            let mut s = Sampler::new(SamplerOptions {
                temperature: 1.0,
                frequency_penalty: 0.7,
                presence_penalty: 0.4,
                logit_bias: vec![(5, 3.0), (6, -100.0)],
                seed,
                ..Default::default()
            });
            steps
                .iter()
                .enumerate()
                .map(|(i, l)| s.sample(l, &past(i)))
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(1), draw(1));
        assert_ne!(draw(1), draw(2));
        assert!(!draw(1).contains(&6));
    }

    #[test]
    fn penalties_and_biases_out_of_range_are_named() {
        let d = SamplerOptions::default;
        assert_eq!(
            SamplerOptions {
                frequency_penalty: 2.5,
                ..d()
            }
            .check()
            .unwrap_err(),
            "frequency_penalty is 2.5; it must be in [-2, 2]"
        );
        assert_eq!(
            SamplerOptions {
                presence_penalty: f32::NAN,
                ..d()
            }
            .check()
            .unwrap_err(),
            "presence_penalty is NaN; it must be in [-2, 2]"
        );
        assert_eq!(
            SamplerOptions {
                logit_bias: vec![(7, -101.0)],
                ..d()
            }
            .check()
            .unwrap_err(),
            "logit_bias of token 7 is -101; it must be in [-100, 100]"
        );
    }

    #[test]
    fn logprobs_sum_to_one_and_rank_the_top_tokens() {
        let logits = [1.0f32, 3.0, 2.0, 3.0, -1.0];
        let total: f32 = (0..5).map(|t| logprobs(&logits, t, 0).logprob.exp()).sum();
        assert!((total - 1.0).abs() < 1e-6, "{total}");
        let l = logprobs(&logits, 2, 3);
        // Highest first, the tie between 1 and 3 broken by the lower id.
        assert_eq!(l.top.iter().map(|t| t.0).collect::<Vec<_>>(), [1, 3, 2]);
        assert_eq!(l.top[2].1, l.logprob);
        assert!(l.top.windows(2).all(|w| w[0].1 >= w[1].1));
        assert_eq!(logprobs(&logits, 0, 10).top.len(), 5);
        assert!(logprobs(&logits, 0, 0).top.is_empty());
    }

    #[test]
    fn min_p_drops_unlikely_tokens() {
        let opts = SamplerOptions {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.5,
            seed: 1,
            ..Default::default()
        };
        let mut s = Sampler::new(opts);
        for i in 0..200 {
            assert_ne!(s.sample(&[5.0, 4.9, 0.0], &past(i)), 2);
        }
    }
}
