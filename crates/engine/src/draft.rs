//! Drafts for speculative decoding: guesses of the next few tokens, verified as rows of one forward step
//! ([`crate::generate`]). A guess is only ever a proposal: a drafted token is kept only where it equals the
//! token the sampler chooses at its position, so drafts change how many steps a generation takes, never
//! its bytes (docs/speculative.md).

mod model;
mod mtp;
mod ngram;
mod replay;

pub use model::ModelDrafter;
pub use mtp::MtpDrafter;
pub use ngram::NgramDrafter;
pub use replay::ReplayDrafter;

use crate::Result;

/// Where drafts come from.
pub trait Drafter {
    /// Up to `max` tokens that may follow `history` (the prompt and every token chosen so far), into `out`
    /// (cleared first). Fewer, or none, when the drafter has no good guess.
    fn draft(&mut self, history: &[u32], max: usize, out: &mut Vec<u32>) -> Result<()>;

    /// Whether [`Drafter::observe`] wants to see each step (computing its states costs a norm per row).
    fn wants_states(&self) -> bool {
        false
    }

    /// The rows the last forward step made final, before [`Drafter::draft`] is asked for the next step's
    /// drafts (only where [`Drafter::wants_states`]).
    fn observe(&mut self, _rows: &StepRows<'_>) -> Result<()> {
        Ok(())
    }
}

/// The rows of a forward step that are final: the tokens at positions pos0.. that the step ran and the
/// history keeps (not the rejected drafts after them), with the main model's normalised final state of each
/// (`Model::final_states`).
pub struct StepRows<'a> {
    pub tokens: &'a [u32],
    pub pos0: usize,
    pub states: &'a [f32],
}

/// How many tokens to draft next: the number that makes the most tokens per second, given the recent
/// share of drafts that were right (α) and what a step costs by its rows. With each draft right with
/// chance α, a step of k drafts yields 1 + α + … + α^k tokens on average, and costs one row's time plus k
/// further rows'; both costs are measured as the generation runs, since they differ by orders of magnitude
/// between a model in memory on few cores (a further row costs nearly what the first does: its experts are
/// other experts), one streamed from disk and a cluster (where one more row costs almost nothing).
#[derive(Clone, Debug)]
pub struct DraftLength {
    min: usize,
    max: usize,
    /// Drafts compared with the sampled token, and the right ones among them, recent ones weighing most.
    tested: f64,
    right: f64,
    /// Seconds of a step of one row, and of each further row, recently.
    one_row: Option<f64>,
    per_row: Option<f64>,
    /// Steps since the last of one row: one now and then keeps its cost known.
    since_one_row: usize,
    /// Steps since the last with drafts: a draft now and then keeps α known.
    since_draft: usize,
}

/// Before anything is measured: drafts right as often as not, a further row at a quarter of the first.
const PRIOR_TESTED: f64 = 2.0;
const PRIOR_RIGHT: f64 = 1.0;
const PRIOR_ROW_SHARE: f64 = 0.25;
/// The weight of what came before in each running figure.
const DECAY: f64 = 0.8;
/// At most this many steps between two of one row, and between two with drafts.
const ONE_ROW_EVERY: usize = 64;
const DRAFT_EVERY: usize = 32;

impl DraftLength {
    /// Between `min` and `max` drafts a step (`min == max`: always that many).
    pub fn new(min: usize, max: usize) -> DraftLength {
        DraftLength {
            min: min.min(max),
            max,
            tested: 0.0,
            right: 0.0,
            one_row: None,
            per_row: None,
            since_one_row: 0,
            since_draft: 0,
        }
    }

    /// The share of drafts right, recently.
    pub fn alpha(&self) -> f64 {
        (self.right + PRIOR_RIGHT) / (self.tested + PRIOR_TESTED)
    }

    pub fn get(&self) -> usize {
        self.best().max(self.min)
    }

    fn best(&self) -> usize {
        if self.max == 0 || self.one_row.is_none() || self.since_one_row >= ONE_ROW_EVERY {
            return 0;
        }
        let alpha = self.alpha();
        let share = match (self.one_row, self.per_row) {
            (Some(a), Some(b)) if a > 0.0 => b.max(0.0) / a,
            _ => PRIOR_ROW_SHARE,
        };
        let (mut best, mut best_rate) = (0, 1.0);
        let (mut tokens, mut p) = (1.0, 1.0);
        for k in 1..=self.max {
            p *= alpha;
            tokens += p;
            let rate = tokens / (1.0 + share * k as f64);
            if rate > best_rate {
                (best, best_rate) = (k, rate);
            }
        }
        if best == 0 && self.since_draft >= DRAFT_EVERY {
            return 1;
        }
        best
    }

    /// A step of `rows` rows took `seconds` (its drafting included), and kept `accepted` of its `drafted`
    /// drafts.
    pub fn update(&mut self, rows: usize, drafted: usize, accepted: usize, seconds: f64) {
        self.since_draft = if drafted > 0 { 0 } else { self.since_draft + 1 };
        if drafted > 0 {
            // The drafts compared: those kept and the first one that was not (the rest were never tested).
            let tested = accepted + usize::from(accepted < drafted);
            self.tested = self.tested * DECAY + tested as f64;
            self.right = self.right * DECAY + accepted as f64;
        }
        let ema = |old: Option<f64>, new: f64| Some(old.map_or(new, |o| o * DECAY + new * (1.0 - DECAY)));
        if rows <= 1 {
            self.one_row = ema(self.one_row, seconds);
            self.since_one_row = 0;
        } else {
            self.since_one_row += 1;
            if let Some(a) = self.one_row {
                self.per_row = ema(self.per_row, (seconds - a) / (rows - 1) as f64);
            }
        }
    }
}

/// What speculation did over a generation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecStats {
    /// Forward steps after the prompt's.
    pub steps: usize,
    /// Tokens drafted, and those of them kept.
    pub drafted: usize,
    pub accepted: usize,
}

impl SpecStats {
    /// The share of drafted tokens kept (0 when nothing was drafted).
    pub fn acceptance(&self) -> f64 {
        self.accepted as f64 / self.drafted.max(1) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Steps of one row take 10 ms, each further row `row_ms`; every draft is right with `alpha`.
    fn settle(alpha: f64, row_ms: f64) -> usize {
        let mut l = DraftLength::new(0, 8);
        assert_eq!(l.get(), 0, "the first step measures one row");
        l.update(1, 0, 0, 0.010);
        for i in 0..200 {
            let k = l.get();
            if k == 0 {
                l.update(1, 0, 0, 0.010);
                continue;
            }
            // Right drafts in a fixed pattern with the chosen share, as the drafter's guesses would be.
            let accepted = (0..k)
                .take_while(|j| ((i * 7 + j) % 100) as f64 / 100.0 < alpha)
                .count();
            l.update(k + 1, k, accepted, 0.010 + row_ms / 1000.0 * k as f64);
        }
        l.get()
    }

    #[test]
    fn the_length_follows_acceptance_and_the_cost_of_a_row() {
        // Cheap rows (a cluster, a disk): draft far ahead when drafts are mostly right.
        assert!(settle(0.9, 0.5) >= 6, "{}", settle(0.9, 0.5));
        // Rows nearly as dear as a step (experts in memory on few cores): a short draft, or none.
        assert!(settle(0.9, 4.5) <= 3, "{}", settle(0.9, 4.5));
        assert!(settle(0.1, 4.5) <= 1, "none, but for a probe now and then");
        assert!(settle(0.5, 0.5) >= 1);
    }

    #[test]
    fn a_step_of_one_row_now_and_then() {
        let mut l = DraftLength::new(0, 4);
        l.update(1, 0, 0, 0.01);
        for _ in 0..ONE_ROW_EVERY {
            assert!(l.get() > 0);
            l.update(5, 4, 4, 0.012);
        }
        assert_eq!(l.get(), 0);
        l.update(1, 0, 0, 0.01);
        assert_eq!(l.get(), 4);
        let mut fixed = DraftLength::new(3, 3);
        assert_eq!(fixed.get(), 3);
        fixed.update(4, 3, 0, 1.0);
        assert_eq!(fixed.get(), 3);
    }
}
