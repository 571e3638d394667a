//! A draft model: a smaller model with the same vocabulary guesses the next tokens greedily, one cheap
//! step each. It keeps its own sequence in step with the history it is shown, computing only what is new.

use super::Drafter;
use crate::model::{Model, Outputs, Sequence};
use crate::sampler::argmax;
use crate::{EngineError, Result};

pub struct ModelDrafter<'m> {
    model: &'m Model,
    seq: Sequence,
    /// The tokens whose positions `seq` holds.
    cached: Vec<u32>,
    /// The target's logits: a draft past them is no token of its (a padded vocabulary's extra rows).
    vocab: usize,
}

impl<'m> ModelDrafter<'m> {
    /// Drafts from `draft` for a generation of `target`, over a context of `n_ctx` positions. The two must
    /// share a vocabulary, token for token: a draft is a token id of the target's.
    pub fn new(draft: &'m Model, target: &Model, n_ctx: usize) -> Result<ModelDrafter<'m>> {
        let (a, b) = (&draft.tokenizer, &target.tokenizer);
        let same = a.vocab_size() == b.vocab_size()
            && (0..a.vocab_size() as u32).all(|t| a.token_bytes(t) == b.token_bytes(t));
        if !same {
            return Err(EngineError::Request(format!(
                "the draft model's vocabulary ({} tokens) is not the model's ({} tokens): a draft model must share it token for token",
                a.vocab_size(),
                b.vocab_size()
            )));
        }
        Ok(ModelDrafter {
            model: draft,
            seq: draft.new_sequence(n_ctx),
            cached: Vec::new(),
            vocab: target.config.n_vocab,
        })
    }
}

impl Drafter for ModelDrafter<'_> {
    fn draft(&mut self, history: &[u32], max: usize, out: &mut Vec<u32>) -> Result<()> {
        out.clear();
        let max = max.min(self.seq.n_ctx().saturating_sub(history.len()));
        if max == 0 || history.is_empty() {
            return Ok(());
        }
        // Keep what the history still shares with what was computed (the last token is always fed again:
        // its logits give the first draft), as far as the sequence can go back.
        let shared = self.cached.iter().zip(history).take_while(|(a, b)| a == b).count();
        let keep = self.seq.reusable(shared.min(history.len() - 1));
        self.seq.truncate(keep)?;
        self.cached.truncate(keep);
        let mut t = argmax(
            self.model
                .forward(&history[keep..], keep, &mut self.seq, Outputs::Last)?,
        );
        self.cached.extend_from_slice(&history[keep..]);
        // The next call most likely keeps the whole history: a recurrent state can come back here.
        self.seq.checkpoint();
        loop {
            if t as usize >= self.vocab {
                return Ok(());
            }
            out.push(t);
            if out.len() == max {
                return Ok(());
            }
            let logits = self
                .model
                .forward(&[t], self.cached.len(), &mut self.seq, Outputs::Last)?;
            self.cached.push(t);
            t = argmax(logits);
        }
    }
}
