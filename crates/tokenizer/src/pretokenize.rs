//! Pre-tokenizers: split text into words before BPE, exactly as llama.cpp's `unicode_regex_split`.
//!
//! A pre-tokenizer is a list of stages. Each stage splits every piece produced by the previous one;
//! the text between two matches becomes a piece of its own (nothing is dropped). Lookarounds and
//! anchors therefore see only the piece, never its neighbours.
//!
//! The three patterns nearly every model uses (GPT-2, Llama 3, Qwen 2) are hand-written
//! splitters, as in llama.cpp (`unicode_regex_split_custom_*`); they are faster than the regex and
//! free of backtracking limits. Other patterns run through fancy-regex.

use crate::unicode::{is_letter, is_number, is_whitespace};
use crate::TokenizerError;

/// GPT-2's pattern as llama.cpp spells it, and as Hugging Face's ByteLevel spells it.
const GPT2_LLAMA: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const GPT2_HF: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
const LLAMA3_HF: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const LLAMA3_LLAMA: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_HF: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_LLAMA: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

// Regex lists copied from llama.cpp's llm_tokenizer_bpe (llama-cpp-python 0.3.36's vendor/llama.cpp),
// non-ASCII characters written as escapes so no editor can normalise them.
const DEEPSEEK_LLM: &[&str] = &[
    "[\u{D}\u{A}]",
    "\\s?[A-Za-z\u{B5}\u{C0}-\u{D6}\u{D8}-\u{F6}\u{F8}-\u{1BA}\u{1BC}-\u{1BF}\u{1C4}-\u{293}\u{295}-\u{2AF}\u{370}-\u{373}\u{376}\u{377}\u{37B}-\u{37D}\u{37F}\u{386}\u{388}-\u{38A}\u{38C}\u{38E}-\u{3A1}\u{3A3}-\u{3F5}\u{3F7}-\u{481}\u{48A}-\u{52F}\u{531}-\u{556}\u{10A0}-\u{10C5}\u{13A0}-\u{13F5}\u{13F8}-\u{13FD}\u{1C90}-\u{1CBA}\u{1CBD}-\u{1CBF}\u{1D00}-\u{1D2B}\u{1D6B}-\u{1D77}\u{1D79}-\u{1D9A}\u{1E00}-\u{1F15}\u{1F18}-\u{1F1D}\u{1F20}-\u{1F45}\u{1F48}-\u{1F4D}\u{1F50}-\u{1F57}\u{1F59}\u{1F5B}\u{1F5D}\u{1F5F}-\u{1F7D}\u{1F80}-\u{1FB4}\u{1FB6}-\u{1FBC}\u{1FBE}\u{1FC2}-\u{1FC4}\u{1FC6}-\u{1FCC}\u{1FD0}-\u{1FD3}\u{1FD6}-\u{1FDB}\u{1FE0}-\u{1FEC}\u{1FF2}-\u{1FF4}\u{1FF6}-\u{1FFC}\u{2102}\u{2107}\u{210A}-\u{2113}\u{2115}\u{2119}-\u{211D}\u{2124}\u{2126}\u{2128}\u{212A}-\u{212D}\u{212F}-\u{2134}\u{2139}\u{213C}-\u{213F}\u{2145}-\u{2149}\u{214E}\u{2183}\u{2184}\u{2C00}-\u{2C7B}\u{2C7E}-\u{2CE4}\u{2CEB}-\u{2CEE}\u{2CF2}\u{2CF3}\u{A640}-\u{A66D}\u{A680}-\u{A69B}\u{A722}-\u{A76F}\u{A771}-\u{A787}\u{A78B}-\u{A78E}\u{AB70}-\u{ABBF}\u{FB00}-\u{FB06}\u{FB13}-\u{FB17}\u{FF21}-\u{FF3A}\u{FF41}-\u{FF5A}\u{10400}-\u{1044F}\u{104B0}-\u{104D3}\u{104D8}-\u{104FB}\u{10C80}-\u{10CB2}\u{10CC0}-\u{10CF2}\u{118A0}-\u{118DF}\u{1E900}-\u{1E943}]+",
    "\\s?[!-/:-~\u{FF01}-\u{FF0F}\u{FF1A}-\u{FF5E}\u{2018}-\u{201F}\u{3000}-\u{3002}]+",
    "\\s+$",
    "[\u{4E00}-\u{9FA5}\u{800}-\u{4E00}\u{AC00}-\u{D7FF}]+",
    "\\p{N}+",
];
const DEEPSEEK_V3: &[&str] = &[
    "\\p{N}{1,3}",
    "[\u{4E00}-\u{9FA5}\u{3040}-\u{309F}\u{30A0}-\u{30FF}]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\u{D}\u{A}\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\u{D}\u{A}]*|\\s*[\u{D}\u{A}]+|\\s+(?!\\S)|\\s+",
];
const SPARK2_5: &[&str] = &[
    "\\p{N}{1,3}",
    "[\u{4E00}-\u{9FA5}\u{3040}-\u{309F}\u{30A0}-\u{30FF}]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\u{D}\u{A}\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+|[\u{D}\u{A}]|\\s+(?!\\S)|\\s+",
    "\\p{N}",
];
const DEEPSEEK_CODER: &[&str] = &[
    "[\u{D}\u{A}]",
    "\\s?\\p{L}+",
    "\\s?\\p{P}+",
    "[\u{4E00}-\u{9FA5}\u{800}-\u{4E00}\u{AC00}-\u{D7FF}]+",
    "\\p{N}",
];
const FALCON: &[&str] = &[
    "[\\p{P}\\$\\+<=>\\^~\\|`]+",
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
    "[0-9][0-9][0-9]",
];
const STARCODER: &[&str] = &[
    "\\p{N}",
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
];
const QWEN35: &[&str] = &[
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
const PORO: &[&str] = &[" ?[^(\\s|.,!?\u{2026}\u{3002}\u{FF0C}\u{3001}\u{964}\u{6D4}\u{60C})]+"];
const VIKING: &[&str] = &[
    " ?[^(\\s|.,!?\u{2026}\u{3002}\u{FF0C}\u{3001}\u{964}\u{6D4}\u{60C})]+",
    "\\p{N}",
];
const TEKKEN: &[&str] = &[
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
const GPT4O: &[&str] = &[
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
const GRANITE_EMB_MULTI: &[&str] = &[
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))*((?=[\\p{L}\\p{M}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))+((?=[\\p{L}\\p{M}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
const BAILINGMOE: &[&str] = &[
    "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
];
const SEED_CODER: &[&str] = &[
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
const UFAKZEKA: &[&str] =
    &["[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"];
const LAGUNA: &[&str] = &[
    "[^\\n]+|[\\n]+",
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
const EXAONE_MOE: &[&str] = &[
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*(?: \\p{L}\\p{M}*)*)+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
];
const MINICPM5: &[&str] = &[
    "\\p{N}{1,3}",
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
const DEFAULT: &[&str] = &[
    "[\\p{P}\\$\\+<=>\\^~\\|]+",
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
    "\\p{N}+",
    "[0-9][0-9][0-9]",
];

/// What a `tokenizer.ggml.pre` name selects in llama.cpp besides the split itself.
pub(crate) struct PreConfig {
    pub splitter: PreTokenizer,
    /// Use a word as one token when the whole word is in the vocabulary (Llama 3 style).
    pub ignore_merges: bool,
    /// Apply llama.cpp's `clean_up_tokenization_spaces` passes when detokenizing.
    pub clean_spaces: bool,
    /// Default for `add_bos` when the GGUF does not say.
    pub add_bos: bool,
    /// The pre-tokenizer clears the default BOS id (ChatGLM).
    pub no_default_bos: bool,
}

/// The pre-tokenizer llama.cpp selects for a `tokenizer.ggml.pre` value (`None`: the key is absent).
pub(crate) fn for_pre_name(pre: Option<&str>) -> Result<PreConfig, TokenizerError> {
    let name = pre.unwrap_or("default");
    let (patterns, clean_spaces): (&[&str], bool) = match name {
        "default" => (DEFAULT, true),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0" | "lfm2"
        | "jina-v5-nano" | "dbrx" | "smaug-bpe" | "chatglm-bpe" | "glm4" | "glm5" => (&[LLAMA3_LLAMA], true),
        "deepseek-llm" => (DEEPSEEK_LLM, false),
        "deepseek-coder" => (DEEPSEEK_CODER, false),
        "deepseek-v3" | "hunyuan-dense" | "hy_v4" | "joyai-llm" => (DEEPSEEK_V3, false),
        "spark2_5" => (SPARK2_5, false),
        "falcon" => (FALCON, true),
        "starcoder" | "refact" | "codeshell" | "exaone" | "minerva-7b" | "mellum2" => (STARCODER, true),
        "command-r" | "smollm" => (STARCODER, false),
        "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de" | "a.x-4.0" | "mellum"
        | "modern-bert" | "exaone4" | "mpt" | "olmo" | "jais" => (&[GPT2_LLAMA], true),
        "trillion" | "granite-docling" => (&[GPT2_LLAMA], false),
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "hunyuan" | "solar-open" | "grok-2" => {
            (&[QWEN2_LLAMA], false)
        }
        "stablelm2" | "megrez" => (&[QWEN2_LLAMA], true),
        "qwen35" => (QWEN35, false),
        "poro-chat" => (PORO, false),
        "bloom" | "gpt3-finnish" => (PORO, true),
        "viking" => (VIKING, false),
        "tekken" => (TEKKEN, false),
        "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => (GPT4O, false),
        "granite-embed-multi-97m" => (GRANITE_EMB_MULTI, false),
        "bailingmoe" | "bailingmoe2" | "llada-moe" => (BAILINGMOE, false),
        "seed-coder" => (SEED_CODER, false),
        "ufakzeka" => (UFAKZEKA, false),
        "laguna" => (LAGUNA, false),
        "exaone-moe" => (EXAONE_MOE, true),
        "minicpm5" => (MINICPM5, true),
        other => return Err(TokenizerError::UnknownPreTokenizer(other.to_string())),
    };
    let llama3_family = matches!(
        name,
        "llama3"
            | "llama-v3"
            | "llama-bpe"
            | "falcon3"
            | "falcon-h1"
            | "pixtral"
            | "midm-2.0"
            | "lfm2"
            | "jina-v5-nano"
    );
    Ok(PreConfig {
        splitter: PreTokenizer::from_patterns(patterns)?,
        ignore_merges: llama3_family
            || matches!(
                name,
                "glm4" | "glm5" | "tekken" | "granite-embed-multi-97m" | "minicpm5"
            ),
        clean_spaces,
        add_bos: llama3_family || name == "tekken",
        no_default_bos: matches!(name, "chatglm-bpe" | "glm4" | "glm5"),
    })
}

/// One splitting stage.
pub(crate) enum Stage {
    /// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
    Gpt2,
    /// Llama 3's pattern with `\p{N}{1,max_digits}`; `max_digits == 1` is Qwen 2's.
    Llama3 {
        max_digits: usize,
    },
    Regex(Box<fancy_regex::Regex>),
}

impl Stage {
    pub(crate) fn from_pattern(pattern: &str) -> Result<Self, TokenizerError> {
        Ok(match pattern {
            GPT2_LLAMA | GPT2_HF => Stage::Gpt2,
            LLAMA3_LLAMA | LLAMA3_HF => Stage::Llama3 { max_digits: 3 },
            QWEN2_LLAMA | QWEN2_HF => Stage::Llama3 { max_digits: 1 },
            _ => {
                let re = fancy_regex::Regex::new(pattern).map_err(|e| TokenizerError::BadRegex {
                    pattern: pattern.to_string(),
                    message: e.to_string(),
                })?;
                Stage::Regex(Box::new(re))
            }
        })
    }

    /// Split `cs` (one piece) and append the piece lengths, in chars, to `out`.
    fn split(&self, cs: &[char], out: &mut Vec<usize>) {
        match self {
            Stage::Gpt2 => split_gpt2(cs, out),
            Stage::Llama3 { max_digits } => split_llama3(cs, *max_digits, out),
            Stage::Regex(re) => split_regex(re, cs, out),
        }
    }
}

pub(crate) struct PreTokenizer {
    stages: Vec<Stage>,
}

impl PreTokenizer {
    pub(crate) fn from_patterns(patterns: &[&str]) -> Result<Self, TokenizerError> {
        Ok(Self {
            stages: patterns
                .iter()
                .map(|p| Stage::from_pattern(p))
                .collect::<Result<_, _>>()?,
        })
    }

    pub(crate) fn from_stages(stages: Vec<Stage>) -> Self {
        Self { stages }
    }

    /// Split `text` into words (byte ranges of `text`, in order, covering it entirely).
    pub(crate) fn split<'t>(&self, text: &'t str) -> Vec<&'t str> {
        let chars: Vec<char> = text.chars().collect();
        let mut lens: Vec<usize> = if chars.is_empty() {
            Vec::new()
        } else {
            vec![chars.len()]
        };
        for stage in &self.stages {
            let mut next = Vec::with_capacity(lens.len() * 2);
            let mut start = 0;
            for len in lens {
                stage.split(&chars[start..start + len], &mut next);
                start += len;
            }
            lens = next;
        }
        let mut words = Vec::with_capacity(lens.len());
        let mut byte = 0;
        let mut char_idx = 0;
        for len in lens {
            let begin = byte;
            for c in &chars[char_idx..char_idx + len] {
                byte += c.len_utf8();
            }
            char_idx += len;
            words.push(&text[begin..byte]);
        }
        words
    }
}

/// Appends `end - *prev` to `out` when positive and moves `*prev` to `end`.
fn emit(out: &mut Vec<usize>, prev: &mut usize, end: usize) {
    if end > *prev {
        out.push(end - *prev);
    }
    *prev = end;
}

fn split_gpt2(cs: &[char], out: &mut Vec<usize>) {
    let n = cs.len();
    let letter = |i: usize| i < n && is_letter(cs[i]);
    let number = |i: usize| i < n && is_number(cs[i]);
    let space = |i: usize| i < n && is_whitespace(cs[i]);
    let other = |i: usize| i < n && !is_whitespace(cs[i]) && !is_letter(cs[i]) && !is_number(cs[i]);
    let mut prev = 0;
    let mut pos = 0;
    while pos < n {
        let c = cs[pos];
        // 's|'t|'re|'ve|'m|'ll|'d  (case-sensitive)
        if c == '\'' && pos + 1 < n {
            let c1 = cs[pos + 1];
            if matches!(c1, 's' | 't' | 'm' | 'd') {
                pos += 2;
                emit(out, &mut prev, pos);
                continue;
            }
            if pos + 2 < n && matches!((c1, cs[pos + 2]), ('r', 'e') | ('v', 'e') | ('l', 'l')) {
                pos += 3;
                emit(out, &mut prev, pos);
                continue;
            }
        }
        let lead = if c == ' ' { pos + 1 } else { pos };
        // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+'
        let class: Option<&dyn Fn(usize) -> bool> = if letter(lead) {
            Some(&letter)
        } else if number(lead) {
            Some(&number)
        } else if other(lead) {
            Some(&other)
        } else {
            None
        };
        if let Some(class) = class {
            pos = lead;
            while class(pos) {
                pos += 1;
            }
            emit(out, &mut prev, pos);
            continue;
        }
        let mut ws = 0;
        while space(pos + ws) {
            ws += 1;
        }
        // '\s+(?!\S)': a run followed by a non-space gives its last space to the next word.
        if ws > 1 && pos + ws < n {
            pos += ws - 1;
        } else if ws > 0 {
            pos += ws;
        } else {
            pos += 1;
        }
        emit(out, &mut prev, pos);
    }
}

fn split_llama3(cs: &[char], max_digits: usize, out: &mut Vec<usize>) {
    let n = cs.len();
    let letter = |i: usize| i < n && is_letter(cs[i]);
    let number = |i: usize| i < n && is_number(cs[i]);
    let space = |i: usize| i < n && is_whitespace(cs[i]);
    let other = |i: usize| i < n && !is_whitespace(cs[i]) && !is_letter(cs[i]) && !is_number(cs[i]);
    let newline = |i: usize| i < n && (cs[i] == '\r' || cs[i] == '\n');
    let mut prev = 0;
    let mut pos = 0;
    while pos < n {
        let c = cs[pos];
        // (?i:'s|'t|'re|'ve|'m|'ll|'d)
        if c == '\'' && pos + 1 < n {
            let c1 = cs[pos + 1].to_ascii_lowercase();
            if matches!(c1, 's' | 't' | 'm' | 'd') {
                pos += 2;
                emit(out, &mut prev, pos);
                continue;
            }
            if pos + 2 < n
                && matches!(
                    (c1, cs[pos + 2].to_ascii_lowercase()),
                    ('r', 'e') | ('v', 'e') | ('l', 'l')
                )
            {
                pos += 3;
                emit(out, &mut prev, pos);
                continue;
            }
        }
        // [^\r\n\p{L}\p{N}]?\p{L}+
        if !(newline(pos) || number(pos)) && (letter(pos) || letter(pos + 1)) {
            pos += 1;
            while letter(pos) {
                pos += 1;
            }
            emit(out, &mut prev, pos);
            continue;
        }
        // \p{N}{1,max_digits}
        if number(pos) {
            let mut run = 0;
            while number(pos) {
                pos += 1;
                run += 1;
                if run == max_digits {
                    emit(out, &mut prev, pos);
                    run = 0;
                }
            }
            emit(out, &mut prev, pos);
            continue;
        }
        // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
        let lead = if c == ' ' { pos + 1 } else { pos };
        if other(lead) {
            pos = lead;
            while other(pos) {
                pos += 1;
            }
            while newline(pos) {
                pos += 1;
            }
            emit(out, &mut prev, pos);
            continue;
        }
        let mut ws = 0;
        let mut after_last_newline = 0;
        while space(pos + ws) {
            if newline(pos + ws) {
                after_last_newline = pos + ws + 1;
            }
            ws += 1;
        }
        if after_last_newline > 0 {
            // '\s*[\r\n]+': up to and including the run's last newline
            pos = after_last_newline;
        } else if ws > 1 && pos + ws < n {
            // '\s+(?!\S)'
            pos += ws - 1;
        } else if ws > 0 {
            pos += ws;
        } else {
            pos += 1;
        }
        emit(out, &mut prev, pos);
    }
}

fn split_regex(re: &fancy_regex::Regex, cs: &[char], out: &mut Vec<usize>) {
    // llama.cpp hands std::regex a copy of the text with every non-ASCII whitespace replaced by
    // U+000B (std::regex's \s is ASCII-only). Doing the same keeps literal classes that contain
    // such a character (deepseek's `　-。`) matching exactly what llama.cpp matches.
    let text: String = cs
        .iter()
        .map(|&c| if !c.is_ascii() && is_whitespace(c) { '\u{0B}' } else { c })
        .collect();
    let mut prev = 0; // in chars
    let mut byte_cursor = 0;
    let mut char_cursor = 0;
    let mut to_chars = |byte: usize| {
        char_cursor += text[byte_cursor..byte].chars().count();
        byte_cursor = byte;
        char_cursor
    };
    for m in re.find_iter(&text) {
        // A backtracking-limit error leaves the rest of the piece unsplit rather than failing the
        // whole encode; the patterns above never get near the limit on real text.
        let Ok(m) = m else { break };
        let start = to_chars(m.start());
        let end = to_chars(m.end());
        emit(out, &mut prev, start);
        emit(out, &mut prev, end);
    }
    emit(out, &mut prev, cs.len());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split_with(patterns: &[&str], text: &str) -> Vec<String> {
        PreTokenizer::from_patterns(patterns)
            .unwrap()
            .split(text)
            .into_iter()
            .map(String::from)
            .collect()
    }

    /// Every hand-written splitter agrees with its regex, run through the generic regex stage.
    #[test]
    fn native_splitters_match_their_regex() {
        let texts = [
            "Hello world! It's 12345 o'clock, we'LL see...\n\n  indented\tline \r\n end  ",
            "   leading spaces and trailing   ",
            "numbers 1 22 333 4444 55555 ٣٤٥٦ and ½",
            "mixed: naïve café — 日本語のテキスト, Ελληνικά; Ａｂｃ！\u{3000}wide\u{a0}nbsp",
            "emoji 🦙🦙 and symbols $+<=>^`|~ ###\n\n\n",
            "'s 'S 'Re 've 'M 'LL 'd 'x '",
            " ",
            "\n",
            "a\u{301}b combining",
        ];
        let generic = |pattern: &str| {
            let re = fancy_regex::Regex::new(pattern).unwrap();
            PreTokenizer::from_stages(vec![Stage::Regex(Box::new(re))])
        };
        for (native, pattern) in [
            (GPT2_LLAMA, GPT2_HF),
            (LLAMA3_LLAMA, LLAMA3_HF),
            (QWEN2_LLAMA, QWEN2_HF),
        ] {
            let native = PreTokenizer::from_patterns(&[native]).unwrap();
            assert!(matches!(native.stages[0], Stage::Gpt2 | Stage::Llama3 { .. }));
            let regex = generic(pattern);
            for text in texts {
                assert_eq!(native.split(text), regex.split(text), "pattern {pattern} on {text:?}");
            }
        }
    }

    #[test]
    fn gpt2_split_examples() {
        assert_eq!(
            split_with(&[GPT2_LLAMA], "Hello  world's\n"),
            ["Hello", " ", " world", "'s", "\n"]
        );
        assert_eq!(split_with(&[GPT2_LLAMA], "I'M 2024!!"), ["I", "'", "M", " 2024", "!!"]);
    }

    #[test]
    fn llama3_and_qwen2_split_digits_differently() {
        assert_eq!(split_with(&[LLAMA3_LLAMA], "x 1234567"), ["x", " ", "123", "456", "7"]);
        assert_eq!(split_with(&[QWEN2_LLAMA], "x 123"), ["x", " ", "1", "2", "3"]);
        assert_eq!(
            split_with(&[LLAMA3_LLAMA], "I'M ok\n\n  x"),
            ["I", "'M", " ok", "\n\n", " ", " x"]
        );
    }

    #[test]
    fn stages_split_the_previous_pieces() {
        // default: punctuation runs first, then GPT-2, then digit runs, then triples of ASCII digits
        assert_eq!(split_with(DEFAULT, "a,b 12345"), ["a", ",", "b", " ", "123", "45"]);
        // deepseek-v3: digits in threes before anything else
        assert_eq!(split_with(DEEPSEEK_V3, "ab1234 c"), ["ab", "123", "4", " c"]);
        // deepseek-llm: the ideographic space is whitespace to llama.cpp, so not part of the class `　-。`
        assert_eq!(split_with(DEEPSEEK_LLM, "!\u{3000}"), ["!", "\u{3000}"]);
    }

    #[test]
    fn every_listed_pre_tokenizer_compiles() {
        for name in [
            "default",
            "llama3",
            "llama-bpe",
            "dbrx",
            "chatglm-bpe",
            "glm4",
            "deepseek-llm",
            "deepseek-coder",
            "deepseek-v3",
            "spark2_5",
            "falcon",
            "starcoder",
            "command-r",
            "gpt-2",
            "olmo",
            "qwen2",
            "stablelm2",
            "qwen35",
            "poro-chat",
            "viking",
            "tekken",
            "gpt-4o",
            "granite-embed-multi-97m",
            "bailingmoe",
            "seed-coder",
            "ufakzeka",
            "laguna",
            "exaone-moe",
            "minicpm5",
        ] {
            assert!(for_pre_name(Some(name)).is_ok(), "{name}");
        }
        match for_pre_name(Some("kimi-k2")) {
            Err(TokenizerError::UnknownPreTokenizer(name)) => assert_eq!(name, "kimi-k2"),
            _ => panic!("kimi-k2 must be refused"),
        }
    }
}
