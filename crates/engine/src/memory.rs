//! What a sequence keeps of its past between forward calls, and how far back it can be cut, so that a new
//! text sharing a prefix with the old one computes only the rest (the server's prompt cache).
//!
//! A KV cache can be cut anywhere: a position's keys and values depend only on the tokens up to it, and a
//! query at position p reads positions 0..=p only, each written before it is read. A recurrent state
//! (Gated DeltaNet) cannot: it folds every position into one matrix per head, and nothing of an earlier
//! position can be taken back out of it. It can only be restored from a copy kept at that position, so a
//! sequence with one keeps two copies ([`Memory::checkpoint`]): the one the server takes at the end of each
//! prompt (the position the next turn of a conversation most surely shares), and the one taken before each
//! speculative step, for when its drafts are rejected.

use crate::attention::KvCache;
use crate::compressed::LayerState;
use crate::delta_net::DeltaState;
use crate::{EngineError, Result};

/// Keys and values of the attention layers, the recurrent state of the linear-attention layers (one per
/// layer, empty for attention layers; none at all in a model without linear attention).
pub(crate) struct Memory {
    pub kv: KvCache,
    pub delta: Vec<DeltaState>,
    /// DeepSeek-V4's compressed entries per layer (none on its uncompressed layers, and in other models).
    /// Cut like a KV cache: see `compressed`.
    pub compressed: Vec<Option<LayerState>>,
    /// Positions computed so far: the next call continues here (or anywhere before it, after
    /// [`Memory::truncate`]). `usize::MAX` while a call runs, and after one that failed.
    pub next: usize,
    /// Copies of the recurrent state, each with the position it was taken at: the one kept for a later
    /// text ([`Copy::Kept`]) and the one a speculative step may come back to ([`Copy::Step`]).
    saved: [Vec<DeltaState>; 2],
    saved_at: [Option<usize>; 2],
}

/// Which copy of the recurrent state a [`Memory::checkpoint`] takes. Two, so that speculation's copy before
/// each step does not replace the one the prompt cache keeps at the end of a prompt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Copy {
    /// Kept until replaced: the server takes it at the end of each prompt.
    Kept,
    /// Taken before a step whose drafts may be rejected.
    Step,
}

impl Memory {
    pub fn new(kv: KvCache, delta: Vec<DeltaState>, compressed: Vec<Option<LayerState>>) -> Memory {
        Memory {
            kv,
            delta,
            compressed,
            next: 0,
            saved: [Vec::new(), Vec::new()],
            saved_at: [None, None],
        }
    }

    /// A call at position 0 starts a new text: the recurrent state starts from zero and the copies, of the
    /// old text, are dropped.
    pub fn restart(&mut self) {
        self.delta.iter_mut().for_each(DeltaState::reset);
        self.saved_at = [None, None];
    }

    /// Keep a copy of the recurrent state where the sequence stands, replacing the one of that kind kept
    /// before. Nothing to keep in a model without linear attention.
    pub fn checkpoint(&mut self, copy: Copy) {
        if self.delta.is_empty() || self.next == usize::MAX {
            return;
        }
        // Element by element, so that the copy's buffers, once allocated, are reused.
        self.saved[copy as usize].clone_from(&self.delta);
        self.saved_at[copy as usize] = Some(self.next);
    }

    /// The most positions, at most `n`, that [`Memory::truncate`] can keep: `n` itself, or no more than
    /// have been computed, for a KV cache; with a recurrent state, only where it stands or where a copy
    /// was kept (else 0: start over).
    pub fn reusable(&self, n: usize) -> usize {
        if self.next == usize::MAX {
            return 0;
        }
        let n = n.min(self.next);
        if self.delta.is_empty() || n == self.next {
            return n;
        }
        self.saved_at
            .iter()
            .flatten()
            .copied()
            .filter(|&at| at <= n)
            .max()
            .unwrap_or(0)
    }

    /// Keep the first `n` positions: the next call continues at `n`. `n` must be [`Memory::reusable`].
    pub fn truncate(&mut self, n: usize) -> Result<()> {
        if self.reusable(n) != n {
            return Err(EngineError::Request(match self.next {
                usize::MAX => format!("this sequence cannot keep {n} positions: its last step failed"),
                next if n > next => format!("this sequence cannot keep {n} positions: it has computed {next}"),
                next => {
                    let mut at: Vec<usize> = self.saved_at.iter().flatten().copied().collect();
                    at.sort_unstable();
                    let copies = match at[..] {
                        [] => String::new(),
                        [a] => format!(" and has a copy at {a}"),
                        [a, b] => format!(" and has copies at {a} and {b}"),
                        _ => unreachable!("two copies at most"),
                    };
                    format!("this model's linear-attention state cannot go back to position {n}: it stands at {next}{copies}")
                }
            }));
        }
        if !self.delta.is_empty() && n < self.next {
            if n == 0 {
                self.delta.iter_mut().for_each(DeltaState::reset);
            } else {
                let i = self
                    .saved_at
                    .iter()
                    .position(|&at| at == Some(n))
                    .expect("reusable found it");
                self.delta.clone_from(&self.saved[i]);
            }
        }
        // A copy past the cut belongs to positions the next calls overwrite.
        for at in &mut self.saved_at {
            if at.is_some_and(|at| at > n) {
                *at = None;
            }
        }
        self.next = n;
        Ok(())
    }
}
