//! Byte-level BPE (GPT-2 style), as llama.cpp's `llm_tokenizer_bpe_session`.
//!
//! Each pre-tokenized word is byte-encoded (every UTF-8 byte becomes one printable char), split
//! into chars, and adjacent symbols are merged lowest merge rank first; among equal ranks (the
//! same pair occurring twice) the leftmost goes first.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use crate::vocab::Vocab;
use crate::TokenizerError;

pub(crate) struct Merges {
    /// (left id, right id) -> (rank, merged id)
    pairs: HashMap<(u32, u32), (u32, u32)>,
}

impl Merges {
    /// Parses "left right" lines; the rank is the line index. Like Hugging Face (and unlike
    /// llama.cpp, which silently keeps such merges unusable), a merge whose parts or result are
    /// not tokens is an error: it points at a broken vocabulary.
    pub(crate) fn parse<'a>(lines: impl IntoIterator<Item = &'a str>, vocab: &Vocab) -> Result<Self, TokenizerError> {
        let mut pairs = HashMap::new();
        for (rank, line) in lines.into_iter().enumerate() {
            // llama.cpp splits at the first space after the first byte (a space byte is always
            // a char boundary).
            let split = line.bytes().skip(1).position(|b| b == b' ').map(|i| i + 1);
            let Some(split) = split else {
                return Err(TokenizerError::BadMerge {
                    rank,
                    merge: line.to_string(),
                });
            };
            let (left, right) = (&line[..split], &line[split + 1..]);
            let lookup = |text: &str| {
                vocab.id(text).ok_or_else(|| TokenizerError::MergeTokenMissing {
                    rank,
                    merge: line.to_string(),
                    token: text.to_string(),
                })
            };
            let (l, r, merged) = (lookup(left)?, lookup(right)?, lookup(&format!("{left}{right}"))?);
            // The first occurrence of a duplicated pair wins, as with llama.cpp's map emplace.
            pairs.entry((l, r)).or_insert((rank as u32, merged));
        }
        Ok(Self { pairs })
    }

    /// Appends the tokens of one byte-encoded word to `out`.
    pub(crate) fn encode_word(&self, vocab: &Vocab, word: &str, out: &mut Vec<u32>) {
        if word.is_empty() {
            return;
        }
        if vocab.ignore_merges {
            if let Some(id) = vocab.id(word) {
                out.push(id);
                return;
            }
        }

        struct Sym {
            id: Option<u32>,
            prev: Option<usize>,
            next: Option<usize>,
            alive: bool,
        }
        let mut buf = [0u8; 4];
        let mut syms: Vec<Sym> = word
            .chars()
            .enumerate()
            .map(|(i, c)| Sym {
                id: vocab.id(c.encode_utf8(&mut buf)),
                prev: i.checked_sub(1),
                next: Some(i + 1),
                alive: true,
            })
            .collect();
        if let Some(last) = syms.last_mut() {
            last.next = None;
        }

        // (rank, left index, left id, right index, right id), smallest first.
        let mut heap = BinaryHeap::new();
        let push = |heap: &mut BinaryHeap<_>, syms: &[Sym], left: Option<usize>, right: Option<usize>| {
            let (Some(l), Some(r)) = (left, right) else { return };
            let (Some(lid), Some(rid)) = (syms[l].id, syms[r].id) else {
                return;
            };
            if let Some(&(rank, _)) = self.pairs.get(&(lid, rid)) {
                heap.push(Reverse((rank, l, lid, r, rid)));
            }
        };
        for i in 1..syms.len() {
            push(&mut heap, &syms, Some(i - 1), Some(i));
        }
        while let Some(Reverse((_, l, lid, r, rid))) = heap.pop() {
            // Stale if either side has since merged with something else.
            if !syms[l].alive || !syms[r].alive || syms[l].id != Some(lid) || syms[r].id != Some(rid) {
                continue;
            }
            let Some(&(_, merged)) = self.pairs.get(&(lid, rid)) else {
                continue;
            };
            syms[l].id = Some(merged);
            syms[r].alive = false;
            let after = syms[r].next;
            syms[l].next = after;
            if let Some(a) = after {
                syms[a].prev = Some(l);
            }
            push(&mut heap, &syms, syms[l].prev, Some(l));
            push(&mut heap, &syms, Some(l), after);
        }

        let mut i = Some(0);
        while let Some(idx) = i {
            // A char with no token of its own is dropped, as llama.cpp does (its per-byte
            // retry can only find what the char lookup already missed).
            if let Some(id) = syms[idx].id {
                out.push(id);
            }
            i = syms[idx].next;
        }
    }
}
