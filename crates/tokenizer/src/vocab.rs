//! The vocabulary: token texts, scores and attributes, special ids and the flags llama.cpp
//! derives from GGUF metadata (`llama_vocab::impl::load`), including its text-based detection
//! of end-of-generation tokens.

use std::collections::{BTreeSet, HashMap};

use crate::{TokenizerError, VocabSpec};

/// Token attributes, as llama.cpp's `llama_token_attr` bits (a token can gain CONTROL on load).
pub(crate) mod attr {
    pub const UNKNOWN: u8 = 1 << 0;
    pub const UNUSED: u8 = 1 << 1;
    pub const NORMAL: u8 = 1 << 2;
    pub const CONTROL: u8 = 1 << 3;
    pub const USER_DEFINED: u8 = 1 << 4;
    pub const BYTE: u8 = 1 << 5;

    /// From GGUF `tokenizer.ggml.token_type`; unknown values are "undefined" (no bit).
    pub fn from_token_type(t: i32) -> u8 {
        match t {
            1 => NORMAL,
            2 => UNKNOWN,
            3 => CONTROL,
            4 => USER_DEFINED,
            5 => UNUSED,
            6 => BYTE,
            _ => 0,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `tokenizer.ggml.model = "gpt2"`: byte-level BPE.
    Bpe,
    /// `tokenizer.ggml.model = "llama"`: SentencePiece BPE with byte fallback.
    Spm,
}

/// Flags a BPE pre-tokenizer name implies (see `pretokenize::for_pre_name`).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct PreFlags {
    pub ignore_merges: bool,
    pub clean_spaces: bool,
    pub add_bos: bool,
    pub no_default_bos: bool,
}

pub(crate) struct Vocab {
    pub kind: Kind,
    pub texts: Vec<String>,
    pub scores: Vec<f32>,
    pub attrs: Vec<u8>,
    pub ids: HashMap<String, u32>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub unk: Option<u32>,
    pub add_bos: bool,
    pub add_eos: bool,
    pub add_space_prefix: bool,
    pub clean_spaces: bool,
    pub ignore_merges: bool,
    pub eog: BTreeSet<u32>,
    /// CONTROL, USER_DEFINED and UNKNOWN tokens, longest text first: the order in which
    /// llama.cpp looks for them in the input.
    pub specials: Vec<u32>,
}

// Texts llama.cpp recognises when the GGUF does not name the token (`load`, "auto-detect").
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<\u{FF5C}end\u{2581}of\u{2581}sentence\u{FF5C}>",
    "<end_of_utterance>",
];
const EOM_TEXTS: &[&str] = &["<|eom_id|>"];
const FIM_PRE_TEXTS: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<\u{FF5C}fim\u{2581}begin\u{FF5C}>",
    "<PRE>",
    "\u{2581}<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF_TEXTS: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<\u{FF5C}fim\u{2581}hole\u{FF5C}>",
    "<SUF>",
    "\u{2581}<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID_TEXTS: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<\u{FF5C}fim\u{2581}end\u{FF5C}>",
    "<MID>",
    "\u{2581}<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<\u{FF5C}end\u{2581}of\u{2581}sentence\u{FF5C}>",
    "[e~[",
];
/// gpt-oss: llama.cpp always renders these as text.
const ALWAYS_RENDERED: &[&str] = &["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"];

impl Vocab {
    /// `llama_defaults`: fill missing BOS/EOS/UNK ids with llama.cpp's per-model defaults (GGUF);
    /// a tokenizer.json names its own.
    pub(crate) fn build(
        spec: VocabSpec,
        kind: Kind,
        pre: PreFlags,
        llama_defaults: bool,
    ) -> Result<Self, TokenizerError> {
        let n = spec.tokens.len();
        if n == 0 {
            return Err(TokenizerError::EmptyVocab);
        }
        if n > u32::MAX as usize {
            return Err(TokenizerError::VocabTooLarge(n));
        }
        let scores = match spec.scores {
            Some(s) if s.len() < n => {
                return Err(TokenizerError::ShortArray {
                    what: "scores",
                    len: s.len(),
                    n_tokens: n,
                })
            }
            Some(mut s) => {
                s.truncate(n);
                s
            }
            None => vec![0.0; n],
        };
        let mut attrs = match &spec.token_types {
            Some(t) if t.len() < n => {
                return Err(TokenizerError::ShortArray {
                    what: "token_types",
                    len: t.len(),
                    n_tokens: n,
                })
            }
            Some(t) => t[..n].iter().map(|&t| attr::from_token_type(t)).collect(),
            None => vec![attr::NORMAL; n],
        };

        let mut texts = spec.tokens;
        let mut ids = HashMap::with_capacity(n);
        for (i, text) in texts.iter_mut().enumerate() {
            if text.is_empty() {
                // llama.cpp's placeholder, so that every token has a distinct text
                *text = format!("[EMPTY_{i}]");
            }
            if let Some(first) = ids.insert(text.clone(), i as u32) {
                return Err(TokenizerError::DuplicateToken {
                    text: text.clone(),
                    first,
                    second: i as u32,
                });
            }
        }

        // llama.cpp's defaults per model type, used when the GGUF has no id (and only if in range).
        let in_range = |id: Option<u32>| id.filter(|&id| (id as usize) < n);
        let (default_bos, default_eos, default_unk) = match kind {
            _ if !llama_defaults => (None, None, None),
            Kind::Spm => (Some(1), Some(2), Some(0)),
            // Yes, 11 for both: llama.cpp's BPE default ("," in GPT-2's vocabulary).
            Kind::Bpe => (if pre.no_default_bos { None } else { Some(11) }, Some(11), None),
        };
        // An id the GGUF gives out of range is ignored, as llama.cpp does ("bad special token").
        let pick = |given: Option<u32>, default: Option<u32>| in_range(given).or(in_range(default));
        let bos = pick(spec.bos, default_bos);
        let eos = pick(spec.eos, default_eos);
        let unk = pick(spec.unk, default_unk);
        let mut eot = in_range(spec.eot);
        let mut eom = in_range(spec.eom);

        let (default_add_bos, default_space_prefix) = match kind {
            Kind::Spm => (true, true),
            Kind::Bpe => (pre.add_bos, false),
        };
        let add_bos = spec.add_bos.unwrap_or(default_add_bos);
        let add_eos = spec.add_eos.unwrap_or(false);
        if add_bos && bos.is_none() {
            return Err(TokenizerError::MissingSpecial {
                flag: "add_bos",
                token: "bos",
            });
        }
        if add_eos && eos.is_none() {
            return Err(TokenizerError::MissingSpecial {
                flag: "add_eos",
                token: "eos",
            });
        }

        // Text-based detection. llama.cpp walks a hash map, so when several texts match one slot
        // its choice is arbitrary; we take the lowest id. Each detected token becomes CONTROL.
        let find = |list: &[&str]| list.iter().filter_map(|t| ids.get(*t).copied()).min();
        let detect = |slot: &mut Option<u32>, list: &[&str], attrs: &mut Vec<u8>| {
            if slot.is_none() {
                *slot = find(list);
                if let Some(id) = *slot {
                    attrs[id as usize] |= attr::CONTROL;
                }
            }
        };
        let (mut fim_pre, mut fim_suf, mut fim_mid) = (None, None, None);
        let (mut fim_pad, mut fim_rep, mut fim_sep) = (None, None, None);
        detect(&mut eot, EOT_TEXTS, &mut attrs);
        detect(&mut eom, EOM_TEXTS, &mut attrs);
        detect(&mut fim_pre, FIM_PRE_TEXTS, &mut attrs);
        detect(&mut fim_suf, FIM_SUF_TEXTS, &mut attrs);
        detect(&mut fim_mid, FIM_MID_TEXTS, &mut attrs);
        detect(&mut fim_pad, FIM_PAD_TEXTS, &mut attrs);
        detect(&mut fim_rep, FIM_REP_TEXTS, &mut attrs);
        detect(&mut fim_sep, FIM_SEP_TEXTS, &mut attrs);

        let mut eog: BTreeSet<u32> = [fim_pad, fim_rep, fim_sep].into_iter().flatten().collect();
        for text in EOG_TEXTS {
            if let Some(&id) = ids.get(*text) {
                eog.insert(id);
                attrs[id as usize] |= attr::CONTROL;
            }
        }
        for text in ALWAYS_RENDERED {
            if let Some(&id) = ids.get(*text) {
                attrs[id as usize] = attr::USER_DEFINED;
            }
        }
        eog.extend([eos, eot, eom].into_iter().flatten());

        let eog_has = |eog: &BTreeSet<u32>, text: &str| ids.get(text).is_some_and(|id| eog.contains(id));
        // o200k_harmony / solar-open: "<|end|>" ends a message, not the generation.
        if eog_has(&eog, "<|end|>")
            && ((eog_has(&eog, "<|return|>") && eog_has(&eog, "<|call|>"))
                || (eog_has(&eog, "<|calls|>") && eog_has(&eog, "<|flush|>")))
        {
            let end = ids["<|end|>"];
            eog.remove(&end);
            attrs[end as usize] = attr::USER_DEFINED;
        }
        // gemma4 / paddleocr: "</s>" is ordinary text when "<|tool_response>" exists.
        if eog_has(&eog, "<|tool_response>") && eog_has(&eog, "</s>") {
            let s = ids["</s>"];
            eog.remove(&s);
            attrs[s as usize] = attr::NORMAL;
        }

        let mut specials: Vec<u32> = (0..n as u32)
            .filter(|&id| attrs[id as usize] & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0)
            .collect();
        // Stable, so equal lengths keep id order (llama.cpp's std::sort leaves that order unspecified).
        specials.sort_by_key(|&id| std::cmp::Reverse(texts[id as usize].len()));

        Ok(Self {
            kind,
            texts,
            scores,
            attrs,
            ids,
            bos,
            eos,
            unk,
            add_bos,
            add_eos,
            add_space_prefix: spec.add_space_prefix.unwrap_or(default_space_prefix),
            clean_spaces: kind == Kind::Bpe && pre.clean_spaces,
            ignore_merges: kind == Kind::Bpe && pre.ignore_merges,
            eog,
            specials,
        })
    }

    pub(crate) fn id(&self, text: &str) -> Option<u32> {
        self.ids.get(text).copied()
    }

    pub(crate) fn len(&self) -> usize {
        self.texts.len()
    }
}
