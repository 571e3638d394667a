//! SentencePiece-style BPE, as llama.cpp's `llm_tokenizer_spm_session`.
//!
//! The text (spaces already escaped to U+2581) is split into chars; the adjacent pair whose
//! concatenation is the vocabulary token with the highest score is merged first (leftmost on
//! ties), until no adjacent pair forms a token. Symbols that are not tokens fall back to byte
//! tokens `<0xXX>`.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::vocab::Vocab;

struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    /// Byte length of the pair when queued; a different sum later means a side has merged since.
    len: usize,
}

impl Ord for Bigram {
    fn cmp(&self, other: &Self) -> Ordering {
        // Max-heap: higher score first, then the smaller left index.
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}

/// Token for one byte: `<0xXX>`, else the byte as a one-char token, else unk (llama.cpp
/// throws there; a missing byte token only happens with a broken vocabulary).
pub(crate) fn byte_token(vocab: &Vocab, byte: u8) -> Option<u32> {
    vocab
        .id(&format!("<0x{byte:02X}>"))
        .or_else(|| {
            if byte.is_ascii() {
                vocab.id(&(byte as char).to_string())
            } else {
                None
            }
        })
        .or(vocab.unk)
}

pub(crate) fn encode(vocab: &Vocab, text: &str, out: &mut Vec<u32>) {
    struct Sym {
        start: usize,
        len: usize,
        prev: Option<usize>,
        next: Option<usize>,
    }
    let mut syms: Vec<Sym> = text
        .char_indices()
        .enumerate()
        .map(|(i, (start, c))| Sym {
            start,
            len: c.len_utf8(),
            prev: i.checked_sub(1),
            next: Some(i + 1),
        })
        .collect();
    let Some(last) = syms.last_mut() else { return };
    last.next = None;

    let mut heap = BinaryHeap::new();
    let try_add = |heap: &mut BinaryHeap<Bigram>, syms: &[Sym], left: Option<usize>, right: Option<usize>| {
        let (Some(l), Some(r)) = (left, right) else { return };
        let len = syms[l].len + syms[r].len;
        let start = syms[l].start;
        if let Some(id) = vocab.id(&text[start..start + len]) {
            heap.push(Bigram {
                score: vocab.scores[id as usize],
                left: l,
                right: r,
                len,
            });
        }
    };
    for i in 1..syms.len() {
        try_add(&mut heap, &syms, Some(i - 1), Some(i));
    }
    while let Some(b) = heap.pop() {
        let (l, r) = (b.left, b.right);
        if syms[l].len == 0 || syms[r].len == 0 || syms[l].len + syms[r].len != b.len {
            continue;
        }
        syms[l].len += syms[r].len;
        syms[r].len = 0;
        let after = syms[r].next;
        syms[l].next = after;
        if let Some(a) = after {
            syms[a].prev = Some(l);
        }
        try_add(&mut heap, &syms, syms[l].prev, Some(l));
        try_add(&mut heap, &syms, Some(l), after);
    }

    let mut i = Some(0);
    while let Some(idx) = i {
        let piece = &text[syms[idx].start..syms[idx].start + syms[idx].len];
        match vocab.id(piece) {
            Some(id) => out.push(id),
            // Only single chars can get here: every merged symbol is a token.
            None => out.extend(piece.bytes().filter_map(|b| byte_token(vocab, b))),
        }
        i = syms[idx].next;
    }
}
