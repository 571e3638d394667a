//! Drafts from the model's own multi-token-prediction block (`model/mtp.rs`): after each step the block
//! catches up on the positions that step made final, from the main model's states of their predecessors;
//! then it drafts greedily, one position further each time, each draft taking the block's own output as
//! its state (as llama.cpp drafts with it). The block's cache then holds drafts' rows past the last final
//! position; the next catch-up writes over them.

use super::{Drafter, StepRows};
use crate::model::{Model, MtpState};
use crate::sampler::argmax;
use crate::{EngineError, Result};

pub struct MtpDrafter<'m> {
    model: &'m Model,
    st: MtpState,
    /// Positions whose rows in the block's cache are final: 0..filled.
    filled: usize,
    /// The main model's state at position `filled - 1` (zeros at 0): what the row at `filled` takes.
    before: Vec<f32>,
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
            states: Vec::new(),
        })
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
            self.filled = 0;
            self.before.fill(0.0);
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
                self.states.extend_from_slice(&self.before);
            }
            let from = start.saturating_sub(1).max(pos0) - pos0;
            self.states.extend_from_slice(&rows.states[from * d..(n - 1) * d]);
            self.model
                .mtp_fill(&mut self.st, &rows.tokens[start - pos0..], &self.states, start)?;
        }
        self.filled = pos0 + n;
        self.before.copy_from_slice(&rows.states[(n - 1) * d..n * d]);
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
        if max == 0 || at != self.filled {
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
