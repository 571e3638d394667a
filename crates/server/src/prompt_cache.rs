//! The prompt cache: a slot keeps its sequence's cache, and the tokens it holds, after its request ends;
//! a new request goes to the free slot that holds the longest prefix of its prompt and computes only the
//! rest. A position's keys and values (or a recurrent state) are the same bits whichever request computed
//! them, and the rest is computed as it would be after them (`forward_batch`'s contract), so the answer is
//! byte for byte the one a cold slot gives. A slot that drafts with the model's MTP block keeps that
//! block's cache with its sequence, and is cut where both can continue (`MtpDrafter::resumable`).

use std::cmp::Reverse;

use titan_engine::draft::MtpDrafter;
use titan_engine::Sequence;

/// What a slot keeps from one request to the next: its sequence, and its MTP drafter (the block's own
/// cache) when the server drafts with one.
pub struct SlotCache<'m> {
    pub seq: Sequence,
    pub mtp: Option<MtpDrafter<'m>>,
}

impl SlotCache<'_> {
    /// The most of the first `n` positions that a request sharing them can keep.
    fn reusable(&self, n: usize) -> usize {
        match &self.mtp {
            None => self.seq.reusable(n),
            Some(m) => m.resumable(n, |k| self.seq.reusable(k)),
        }
    }

    /// Keep the first `n` positions, as [`SlotCache::reusable`] allows.
    fn truncate(&mut self, n: usize) {
        self.seq.truncate(n).expect("a sequence can be cut where reusable says");
        if let Some(m) = &mut self.mtp {
            m.resume(n);
        }
    }
}

/// The slots not serving a request.
pub struct PromptCache<'m> {
    free: Vec<Free<'m>>,
    /// Slots freed so far: the stamp of the last one, by which the least recently used is found.
    frees: u64,
    /// Off: every request starts at position 0 (a freed sequence still serves the next request: its KV cache
    /// is allocated and written once, a cost at long contexts).
    enabled: bool,
}

struct Free<'m> {
    cache: SlotCache<'m>,
    /// The tokens at the positions its cache holds.
    tokens: Vec<u32>,
    /// When it was freed (see `frees`).
    freed: u64,
}

impl<'m> PromptCache<'m> {
    pub fn new(enabled: bool) -> PromptCache<'m> {
        PromptCache {
            free: Vec::new(),
            frees: 0,
            enabled,
        }
    }

    /// Free slots that hold a sequence (the others have never been used).
    pub fn held(&self) -> usize {
        self.free.len()
    }

    /// A slot for a request of `prompt` (not empty), and how many of its first tokens the slot's cache
    /// holds already: the free slot that can reuse the most of it, the least recently used among equals;
    /// a new one from `fresh` if `unused` (a slot never used is free too, and the least recently used of
    /// all). At most all but the prompt's last token are reused: its logits are needed.
    pub fn take<E>(
        &mut self,
        prompt: &[u32],
        unused: bool,
        fresh: impl FnOnce() -> Result<SlotCache<'m>, E>,
    ) -> Result<(SlotCache<'m>, usize), E> {
        if !self.enabled {
            return match self.free.pop() {
                Some(mut f) => {
                    f.cache.truncate(0);
                    Ok((f.cache, 0))
                }
                None => Ok((fresh()?, 0)),
            };
        }
        let most = prompt.len().saturating_sub(1);
        // What a slot can reuse is where its sequence can be cut (SlotCache::reusable): a recurrent state
        // only at a checkpoint, so a slot with a longer common prefix may serve less of it.
        let best = self
            .free
            .iter()
            .enumerate()
            .map(|(i, f)| {
                (
                    f.cache.reusable(common_prefix(&f.tokens, prompt).min(most)),
                    Reverse(f.freed),
                    i,
                )
            })
            .max();
        match best {
            Some((n, _, i)) if n > 0 || !unused => {
                let mut f = self.free.swap_remove(i);
                f.cache.truncate(n);
                Ok((f.cache, n))
            }
            _ => Ok((fresh()?, 0)),
        }
    }

    /// A slot freed: its cache, which holds `tokens` at positions 0.. (none after a failed step).
    pub fn put(&mut self, cache: SlotCache<'m>, mut tokens: Vec<u32>) {
        if !self.enabled {
            tokens.clear();
        }
        self.frees += 1;
        self.free.push(Free {
            cache,
            tokens,
            freed: self.frees,
        });
    }
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use titan_engine::{Model, Outputs};

    fn model(rel: &str) -> Model {
        Model::load(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../tests/fixtures")
                .join(rel),
        )
        .unwrap()
    }

    /// A free slot whose cache holds `tokens`, computed, and checkpointed after `prompt` of them, as the
    /// scheduler does at the end of a prompt.
    fn put(cache: &mut PromptCache<'_>, model: &Model, tokens: &[u32], prompt: usize) {
        let mut seq = model.new_sequence(64);
        model.forward(&tokens[..prompt], 0, &mut seq, Outputs::Last).unwrap();
        seq.checkpoint();
        if prompt < tokens.len() {
            model
                .forward(&tokens[prompt..], prompt, &mut seq, Outputs::Last)
                .unwrap();
        }
        cache.put(SlotCache { seq, mtp: None }, tokens.to_vec());
    }

    /// How many of `prompt`'s tokens the slot it gets holds.
    fn take(cache: &mut PromptCache<'_>, model: &Model, prompt: &[u32], unused: bool) -> usize {
        let fresh = || {
            Ok::<_, ()>(SlotCache {
                seq: model.new_sequence(64),
                mtp: None,
            })
        };
        cache.take(prompt, unused, fresh).unwrap().1
    }

    /// The longest common prefix wins, then the least recently used; a never-used slot is taken before a
    /// used one that shares nothing; the prompt's last token is always left to compute.
    #[test]
    fn a_request_goes_to_the_slot_with_the_longest_prefix() {
        let m = model("qwen3moe/q8_0.gguf");
        let mut cache = PromptCache::new(true);
        put(&mut cache, &m, &[1, 2, 3, 4, 5], 5);
        put(&mut cache, &m, &[1, 2, 3, 9], 4);
        put(&mut cache, &m, &[1, 2, 3, 4, 7], 5);
        let n = take(&mut cache, &m, &[1, 2, 3, 4, 5, 6], false);
        assert_eq!(n, 5);
        assert_eq!(cache.held(), 2);
        // [1 2 3 9] and [1 2 3 4 7] both give 3 of [1 2 3 8]: the older one, [1 2 3 9], is taken.
        let n = take(&mut cache, &m, &[1, 2, 3, 8], false);
        assert_eq!(n, 3);
        assert_eq!(cache.free[0].tokens, [1, 2, 3, 4, 7]);
        // All of [1 2 3 4 7] is held, but its last token's logits must be computed.
        let n = take(&mut cache, &m, &[1, 2, 3, 4, 7], true);
        assert_eq!(n, 4);
        put(&mut cache, &m, &[5, 6], 2);
        // Nothing shared: a never-used slot if there is one, else the least recently used.
        let n = take(&mut cache, &m, &[8, 9], true);
        assert_eq!((n, cache.held()), (0, 1));
        let n = take(&mut cache, &m, &[8, 9], false);
        assert_eq!((n, cache.held()), (0, 0));
    }

    /// With linear attention, a slot is worth what its state can be cut back to: where it stands or its
    /// checkpoint, not the longest common prefix.
    #[test]
    fn a_recurrent_slot_reuses_only_up_to_its_checkpoint() {
        let m = model("qwen35moe/q8_0.gguf");
        let mut cache = PromptCache::new(true);
        put(&mut cache, &m, &[1, 2, 3, 4, 5, 6], 2);
        put(&mut cache, &m, &[1, 2, 3, 4, 7], 4);
        let n = take(&mut cache, &m, &[1, 2, 3, 4, 5, 9], false);
        assert_eq!(
            n, 4,
            "the second slot's checkpoint at 4, not the first's 5 common tokens"
        );
        let n = take(&mut cache, &m, &[1, 2, 3, 4, 5, 6, 1], false);
        assert_eq!(n, 6, "the first slot stands at 6");
        put(&mut cache, &m, &[1, 2, 3, 4], 4);
        let n = take(&mut cache, &m, &[1, 2, 3, 7], false);
        assert_eq!(n, 0, "no checkpoint at or before 3");
    }

    #[test]
    fn off_it_reuses_nothing() {
        let m = model("qwen3moe/q8_0.gguf");
        let mut cache = PromptCache::new(false);
        put(&mut cache, &m, &[1, 2, 3], 3);
        let n = take(&mut cache, &m, &[1, 2, 3, 4], false);
        assert_eq!((n, cache.held()), (0, 0));
    }
}
