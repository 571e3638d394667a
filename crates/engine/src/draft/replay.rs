//! Drafts with a chosen acceptance rate, for measuring what speculation does at a given rate: a recorded
//! continuation of the prompt, with a chosen share of its tokens replaced by wrong ones. Random-weight
//! models accept real drafts by chance only; this one measures the mechanics (`titan bench --spec-rate`).

use titan_kernels::splitmix::SplitMix64;

use super::Drafter;
use crate::Result;

pub struct ReplayDrafter {
    /// The recorded text: prompt and continuation, as the generation being drafted for produces them.
    text: Vec<u32>,
    /// The chance that a drafted token is the recorded one.
    rate: f64,
    vocab: u32,
    seed: u64,
}

impl ReplayDrafter {
    pub fn new(text: Vec<u32>, rate: f64, vocab: usize, seed: u64) -> ReplayDrafter {
        ReplayDrafter {
            text,
            rate,
            vocab: vocab as u32,
            seed,
        }
    }
}

impl Drafter for ReplayDrafter {
    fn draft(&mut self, history: &[u32], max: usize, out: &mut Vec<u32>) -> Result<()> {
        out.clear();
        // Off the record (the generation left it), nothing to draft.
        if !self.text.starts_with(history) {
            return Ok(());
        }
        for (pos, &t) in self.text.iter().enumerate().skip(history.len()).take(max) {
            // Keyed by position: the same draft at the same place, however the steps fell.
            let r = SplitMix64::nth_u64(self.seed, pos as u64);
            let right = (r >> 11) as f64 / (1u64 << 53) as f64 <= self.rate;
            out.push(if right {
                t
            } else {
                (t + 1 + (r as u32 % (self.vocab - 1))) % self.vocab
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drafts_the_record_at_the_chosen_rate() {
        let text: Vec<u32> = (0..2000).map(|i| i % 50).collect();
        let mut out = Vec::new();
        ReplayDrafter::new(text.clone(), 1.0, 50, 1)
            .draft(&text[..10], 5, &mut out)
            .unwrap();
        assert_eq!(out, [10, 11, 12, 13, 14]);
        let mut d = ReplayDrafter::new(text.clone(), 0.6, 50, 1);
        d.draft(&text[..1], 1999, &mut out).unwrap();
        let right = out.iter().zip(&text[1..]).filter(|(a, b)| a == b).count();
        assert!((1100..1300).contains(&right), "{right} of 1999");
        assert!(out.iter().all(|&t| t < 50));
        // A history that left the record gets nothing.
        d.draft(&[3, 3], 4, &mut out).unwrap();
        assert!(out.is_empty());
    }
}
