//! Drafts from the model's own multi-token-prediction block (`model/mtp.rs`): after each step the block
//! catches up on the positions that step made final, from the main model's states of their predecessors;
//! then it drafts greedily, one position further each time, each draft taking the block's own output as
//! its state (as llama.cpp drafts with it). The block's cache then holds drafts' rows past the last final
//! position; the next catch-up writes over them.
//!
//! A drafter outlives its text where a server's prompt cache keeps the main sequence for the next request
//! ([`MtpDrafter::resumable`], [`MtpDrafter::resume`]): the block's row at p depends only on the tokens up to
//! p and the main model's state at p − 1, so the rows of a shared prefix stay valid; what a new text needs
//! besides them is the main state just before where it continues.

use super::{Drafter, StepRows};
use crate::model::{Model, MtpState};
use crate::sampler::argmax;
use crate::{EngineError, Result};

pub struct MtpDrafter<'m> {
    model: &'m Model,
    st: MtpState,
    /// Positions whose rows in the block's cache are final: 0..filled.
    filled: usize,
    /// The main model's state at position `before_at - 1` (zeros at 0): what the row at `before_at` takes;
    /// `before_at` is none while that state is unknown (a text resumed before a row it holds).
    before: Vec<f32>,
    before_at: Option<usize>,
    /// `before` as it was at a marked position (a prompt's end), for a later text to continue from.
    mark: Option<(usize, Vec<f32>)>,
    /// The rows of one catch-up: each position's predecessor's state; while drafting, the last draft's.
    states: Vec<f32>,
}

impl<'m> MtpDrafter<'m> {
    /// Drafts for a generation of `model` over `n_ctx` positions, or why its file cannot give them.
    pub fn new(model: &'m Model, n_ctx: usize) -> Result<MtpDrafter<'m>> {
        Ok(MtpDrafter {
            model,
            st: model.mtp_state(n_ctx)?,
            filled: 0,
            before: vec![0.0; model.config.n_embd],
            before_at: Some(0),
            mark: None,
            states: Vec::new(),
        })
    }

    /// Remember where the text stands now (the main sequence's checkpoint at a prompt's end), so that a
    /// later text that shares it can continue from there ([`MtpDrafter::resume`]); replaces the mark before.
    pub fn mark(&mut self) {
        let Some(at) = self.before_at else {
            return;
        };
        let mut kept = self.mark.take().map(|(_, s)| s).unwrap_or_default();
        kept.clear();
        kept.extend_from_slice(&self.before);
        self.mark = Some((at, kept));
    }

    /// Where a new text whose first `n` tokens are this one's can continue, given `main(k)`: the most of the
    /// first k positions the main sequence can keep (`Sequence::reusable`). The main sequence is cut there
    /// and the new text's next step starts there: at a position whose predecessor's state the drafter
    /// holds (where it stands, or its mark), or one before a row it holds (the step then computes that
    /// state again, for one row more).
    pub fn resumable(&self, n: usize, main: impl Fn(usize) -> usize) -> usize {
        let known = [self.before_at, self.mark.as_ref().map(|m| m.0)];
        let at_known = known
            .into_iter()
            .flatten()
            .filter(|&p| p <= n && main(p) == p)
            .max()
            .unwrap_or(0);
        // Rows 0..=c are this text's and the new one's when c < n and c < filled.
        let before_row = match n.min(self.filled) {
            0 => 0,
            m => main(m - 1),
        };
        at_known.max(before_row)
    }

    /// Continue a new text at `c`, a position [`MtpDrafter::resumable`] gave: the next
    /// [`Drafter::observe`] shows the main model's rows from `c` on.
    pub fn resume(&mut self, c: usize) {
        if c == 0 {
            self.filled = 0;
            self.before_at = Some(0);
            self.before.fill(0.0);
        } else if Some(c) == self.before_at {
            self.filled = c;
        } else if let Some((_, s)) = self.mark.as_ref().filter(|m| m.0 == c) {
            self.before.copy_from_slice(s);
            self.before_at = Some(c);
            self.filled = c;
        } else {
            debug_assert!(c < self.filled, "resume at {c} with rows up to {}", self.filled);
            // The row at c is kept; the step's first row gives the state it takes for the row at c + 1.
            self.filled = c + 1;
            self.before_at = None;
        }
        if self.mark.as_ref().is_some_and(|m| m.0 > c) {
            self.mark = None;
        }
    }
}

impl Drafter for MtpDrafter<'_> {
    fn wants_states(&self) -> bool {
        true
    }

    fn observe(&mut self, rows: &StepRows<'_>) -> Result<()> {
        let d = self.model.config.n_embd;
        let (pos0, n) = (rows.pos0, rows.tokens.len());
        if pos0 == 0 {
            // A new text.
            self.resume(0);
        }
        if pos0 > self.filled {
            return Err(EngineError::Request(format!(
                "the MTP drafter was shown positions from {pos0} on, but holds rows only up to {}",
                self.filled
            )));
        }
        if n == 0 {
            return Ok(());
        }
        let start = self.filled.max(pos0);
        if start < pos0 + n {
            // Position p takes the state of p - 1: the one kept from before, or this step's row.
            self.states.clear();
            if start == pos0 {
                if self.before_at != Some(pos0) {
                    return Err(EngineError::Request(format!(
                        "the MTP drafter does not hold the main state before position {pos0}"
                    )));
                }
                self.states.extend_from_slice(&self.before);
            }
            let from = start.saturating_sub(1).max(pos0) - pos0;
            self.states.extend_from_slice(&rows.states[from * d..(n - 1) * d]);
            self.model
                .mtp_fill(&mut self.st, &rows.tokens[start - pos0..], &self.states, start)?;
        }
        self.filled = pos0 + n;
        self.before.copy_from_slice(&rows.states[(n - 1) * d..n * d]);
        self.before_at = Some(pos0 + n);
        Ok(())
    }

    fn draft(&mut self, history: &[u32], max: usize, out: &mut Vec<u32>) -> Result<()> {
        out.clear();
        let Some((&last, _)) = history.split_last() else {
            return Ok(());
        };
        let at = history.len() - 1;
        let max = max.min(self.st.n_ctx().saturating_sub(at));
        // Only right after a catch-up to this position: the row for the last token needs its predecessor's state.
        if max == 0 || at != self.filled || self.before_at != Some(at) {
            return Ok(());
        }
        let vocab = self.model.config.n_vocab;
        let mut t = argmax(self.model.mtp_forward(&mut self.st, &[last], &self.before, at)?);
        // Both of that row's inputs are final: it stays in the cache.
        self.filled = at + 1;
        while (t as usize) < vocab {
            out.push(t);
            if out.len() == max {
                break;
            }
            self.states.clear();
            self.states.extend_from_slice(self.st.states());
            t = argmax(
                self.model
                    .mtp_forward(&mut self.st, &[t], &self.states, at + out.len())?,
            );
        }
        Ok(())
    }
}
