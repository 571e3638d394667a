//! The multi-token-prediction (MTP) block of a model that has one: from the main model's final state at
//! position p − 1 and the token at p, it predicts the token after p (`weights::MtpHead` and the block at
//! `layers[n_layer]`). It never takes part in the main pass; it gives drafts for speculative decoding
//! (`draft::MtpDrafter`), each one step further than the main model has run.
//!
//! As llama.cpp runs Qwen3-Next's: the row at position p normalises the token's embedding (`enorm`) and the
//! state (`hnorm`), projects the two together (`eh_proj`), runs the block with its own KV cache, and ends
//! with `shared_head_norm` and the LM head. The state before position 0 is zeros; a draft after a draft
//! takes the block's own normalised output as its state.

use std::ops::Range;

use titan_kernels::{matmul, Activations};

use super::{Batch, Model, Outputs, Part, Scratch, Sequence};
use crate::attention::KvCache;
use crate::memory::Memory;
use crate::ops::rms_norm;
use crate::{EngineError, Result};

/// What the MTP block keeps of a text between calls: its KV cache, and its working buffers.
pub struct MtpState {
    mem: Memory,
    scratch: Scratch,
    /// Each row's normalised output (the next draft's state), from the last call.
    states: Vec<f32>,
    /// Each row's [enorm(embedding) ‖ hnorm(state)], and that quantised.
    joined: Vec<f32>,
    acts: Activations,
}

impl MtpState {
    /// Positions its cache holds.
    pub fn n_ctx(&self) -> usize {
        self.mem.kv.n_ctx()
    }

    /// The normalised output of each row of the last [`Model::mtp_forward`]: a further draft's state.
    pub fn states(&self) -> &[f32] {
        &self.states
    }
}

impl Model {
    /// Whether the model has an MTP block that TITAN runs (see `weights::MtpHead::load`).
    pub fn has_mtp(&self) -> bool {
        self.weights.mtp.is_some()
    }

    /// An empty MTP cache for positions 0..n_ctx, or why there can be none.
    pub fn mtp_state(&self, n_ctx: usize) -> Result<MtpState> {
        let c = &self.config;
        if !self.has_mtp() {
            let held = crate::weights::MtpHead::held(&self.weights.file, c);
            let what = match c.n_nextn {
                0 => "this model file has no multi-token-prediction block (converted with --no-mtp, or the model has none)".to_string(),
                n if !held => format!("this model file counts {n} multi-token-prediction block(s) but does not hold them (converted with --no-mtp)"),
                n => format!("this file's {n} multi-token-prediction block(s) are of a kind TITAN does not run yet ({}; it runs those of qwen3next, qwen35moe and glm4moe)", c.arch_name),
            };
            return Err(EngineError::Request(what));
        }
        // One attention layer, the MTP block's, at its index after the main blocks.
        let mut attends = vec![false; c.n_layer + 1];
        attends[c.n_layer] = true;
        Ok(MtpState {
            mem: Memory::new(KvCache::new(&attends, n_ctx, c.kv_dim(), true), Vec::new(), Vec::new()),
            scratch: Scratch::default(),
            states: Vec::new(),
            joined: Vec::new(),
            acts: Activations::default(),
        })
    }

    /// The MTP block over `tokens` at positions pos0.., each with its state (a row of `states`: the main
    /// model's normalised final state of the position before, zeros before position 0, or a draft's own
    /// from [`MtpState::states`]). Writes those positions of its cache; returns each row's logits, for the
    /// token after the row's own.
    pub fn mtp_forward<'s>(
        &self,
        st: &'s mut MtpState,
        tokens: &[u32],
        states: &[f32],
        pos0: usize,
    ) -> Result<&'s [f32]> {
        self.mtp_rows(st, tokens, states, pos0, true)?;
        Ok(&st.scratch.logits)
    }

    /// [`Model::mtp_forward`]'s cache rows alone: what a later row attends to is each row's keys and values,
    /// so neither the block's feed-forward nor the head runs (a catch-up on positions already decided).
    pub fn mtp_fill(&self, st: &mut MtpState, tokens: &[u32], states: &[f32], pos0: usize) -> Result<()> {
        self.mtp_rows(st, tokens, states, pos0, false)
    }

    fn mtp_rows(&self, st: &mut MtpState, tokens: &[u32], states: &[f32], pos0: usize, whole: bool) -> Result<()> {
        let (c, w) = (&self.config, &self.weights);
        let head = w
            .mtp
            .as_ref()
            .ok_or_else(|| EngineError::Request("this model has no MTP block".into()))?;
        let (n, d) = (tokens.len(), c.n_embd);
        if n == 0 || states.len() != n * d {
            return Err(EngineError::Request(format!(
                "the MTP block was given {n} tokens and {} states of {d}",
                states.len() / d.max(1)
            )));
        }
        if pos0 + n > st.mem.kv.n_ctx() {
            return Err(EngineError::ContextFull {
                ctx: st.mem.kv.n_ctx(),
                need: pos0 + n,
            });
        }
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= c.n_vocab) {
            return Err(EngineError::BadToken {
                id: t,
                vocab: c.n_vocab,
            });
        }
        let s = &mut st.scratch;
        s.size_for(c, n);
        // [enorm(embedding) ‖ hnorm(state)] per row, then eh_proj into the residual stream.
        st.joined.resize(n * 2 * d, 0.0);
        let embd = w.view(&head.embd);
        for ((row, &t), h) in st
            .joined
            .chunks_exact_mut(2 * d)
            .zip(tokens)
            .zip(states.chunks_exact(d))
        {
            let (e, hn) = row.split_at_mut(d);
            embd.dequantize_row(t as usize, e);
            rms_norm(e, &head.enorm, c.rms_eps);
            hn.copy_from_slice(h);
            rms_norm(hn, &head.hnorm, c.rms_eps);
        }
        st.acts.quantize(head.eh_proj.ty.act_type(), &st.joined, n, 2 * d)?;
        matmul(&w.view(&head.eh_proj), &st.acts, &mut s.x)?;
        self.angles(pos0..pos0 + n, s);
        let mut part = [Part {
            tokens,
            pos0,
            mem: &mut st.mem,
            outputs: Outputs::All,
        }];
        if !whole {
            return self.mix(c.n_layer, &mut part, s, None);
        }
        self.layer(c.n_layer, &mut part, s, None)?;
        // shared_head_norm, then the LM head.
        st.states.clear();
        st.states.extend_from_slice(&s.x);
        rms_norm(&mut st.states, &head.head_norm, c.rms_eps);
        st.acts.quantize(head.head.ty.act_type(), &st.states, n, d)?;
        s.logits.resize(n * c.n_vocab, 0.0);
        matmul(&w.view(&head.head), &st.acts, &mut s.logits)?;
        Ok(())
    }

    /// The main model's normalised final state (`output_norm`, the LM head's input) of the last call's
    /// rows `rows` of `seq`, appended to `out`: what the MTP block takes for the positions after them.
    pub fn final_states(&self, seq: &Sequence, rows: Range<usize>, out: &mut Vec<f32>) {
        self.states_of(&seq.scratch, rows, out);
    }

    /// [`Model::final_states`] of the last [`Model::forward_batch`] through `batch`, its rows counted over all
    /// its spans in order.
    pub fn batch_final_states(&self, batch: &Batch, rows: Range<usize>, out: &mut Vec<f32>) {
        self.states_of(&batch.scratch, rows, out);
    }

    fn states_of(&self, s: &Scratch, rows: Range<usize>, out: &mut Vec<f32>) {
        let d = self.config.n_embd;
        let at = out.len();
        out.extend_from_slice(&s.x[rows.start * d..rows.end * d]);
        rms_norm(&mut out[at..], &self.weights.output_norm, self.config.rms_eps);
    }
}
