//! Special-token partitioning, as llama.cpp's `tokenizer_st_partition`: before any model-specific
//! tokenization, literal special-token texts in the input become their tokens.
//!
//! Special tokens are tried longest text first; each one splits every remaining text fragment
//! at all its (non-overlapping, left to right) occurrences. User-defined tokens are always
//! matched; control and unknown tokens only when `parse_special` is set.

use crate::vocab::{attr, Vocab};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fragment<'t> {
    Text(&'t str),
    Token(u32),
}

pub(crate) fn partition<'t>(vocab: &Vocab, text: &'t str, parse_special: bool) -> Vec<Fragment<'t>> {
    let mut fragments = if text.is_empty() {
        Vec::new()
    } else {
        vec![Fragment::Text(text)]
    };
    for &id in &vocab.specials {
        if !parse_special && vocab.attrs[id as usize] & (attr::CONTROL | attr::UNKNOWN) != 0 {
            continue;
        }
        let needle = vocab.texts[id as usize].as_str();
        if !fragments
            .iter()
            .any(|f| matches!(f, Fragment::Text(t) if t.contains(needle)))
        {
            continue;
        }
        let mut next = Vec::with_capacity(fragments.len() + 2);
        for fragment in fragments {
            let Fragment::Text(t) = fragment else {
                next.push(fragment);
                continue;
            };
            let mut rest_start = 0;
            for (at, _) in t.match_indices(needle) {
                if at > rest_start {
                    next.push(Fragment::Text(&t[rest_start..at]));
                }
                next.push(Fragment::Token(id));
                rest_start = at + needle.len();
            }
            if rest_start < t.len() {
                next.push(Fragment::Text(&t[rest_start..]));
            }
        }
        fragments = next;
    }
    fragments
}
