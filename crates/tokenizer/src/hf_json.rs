//! Hugging Face `tokenizer.json` (model type BPE with a ByteLevel pre-tokenizer) mapped onto
//! the same vocabulary and BPE as a GGUF "gpt2" vocabulary.
//!
//! Read: `model.vocab`, `model.merges` ("a b" strings or ["a", "b"] pairs), `model.ignore_merges`,
//! `added_tokens` (special -> control, otherwise user-defined), the pre-tokenizer (ByteLevel,
//! Split with an Isolated regex, Digits, or a Sequence of those) and, from a
//! `tokenizer_config.json` beside the file or a TemplateProcessing post-processor, BOS/EOS and
//! whether to add them. Normalizers are ignored, as llama.cpp ignores them for BPE.

use std::path::Path;

use serde_json::Value;

use crate::pretokenize::{PreTokenizer, Stage};
use crate::vocab::PreFlags;
use crate::{TokenizerError, VocabSpec};

pub(crate) struct Loaded {
    pub spec: VocabSpec,
    pub flags: PreFlags,
    pub splitter: PreTokenizer,
}

fn read_json(path: &Path) -> Result<Value, TokenizerError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|error| TokenizerError::Io {
        path: shown.clone(),
        error,
    })?;
    serde_json::from_str(&text).map_err(|e| TokenizerError::Json {
        path: shown,
        message: e.to_string(),
    })
}

pub(crate) fn load(path: &Path) -> Result<Loaded, TokenizerError> {
    let shown = path.display().to_string();
    let unsupported = |what: String| TokenizerError::UnsupportedJson {
        path: shown.clone(),
        what,
    };
    let root = read_json(path)?;
    let model = &root["model"];
    if let Some(kind) = model["type"].as_str() {
        if kind != "BPE" {
            return Err(unsupported(format!(
                "model type {kind:?}; only byte-level BPE is supported"
            )));
        }
    }
    let vocab = model["vocab"]
        .as_object()
        .ok_or_else(|| unsupported("model.vocab is not an object".into()))?;

    // Token table: ids from model.vocab and added_tokens; holes become unused placeholders,
    // as llama.cpp's converter writes them.
    let mut entries: Vec<(u32, String, i32)> = Vec::with_capacity(vocab.len());
    for (text, id) in vocab {
        let id = id
            .as_u64()
            .ok_or_else(|| unsupported(format!("vocab id of {text:?} is not a number")))?;
        entries.push((id as u32, text.clone(), 1));
    }
    for added in root["added_tokens"].as_array().map(Vec::as_slice).unwrap_or_default() {
        let (Some(id), Some(text)) = (added["id"].as_u64(), added["content"].as_str()) else {
            return Err(unsupported(format!("added token without id/content: {added}")));
        };
        let kind = if added["special"].as_bool().unwrap_or(false) {
            3
        } else {
            4
        };
        entries.push((id as u32, text.to_string(), kind));
    }
    let n = entries.iter().map(|e| e.0 as usize + 1).max().unwrap_or(0);
    let mut tokens: Vec<Option<String>> = vec![None; n];
    let mut types = vec![5; n];
    for (id, text, kind) in entries {
        // An added token may restate a vocab entry; the added token's type wins.
        tokens[id as usize] = Some(text);
        types[id as usize] = kind;
    }
    let tokens: Vec<String> = tokens
        .into_iter()
        .enumerate()
        .map(|(i, t)| t.unwrap_or_else(|| format!("[PAD{i}]")))
        .collect();

    let mut merges = Vec::new();
    for m in model["merges"].as_array().map(Vec::as_slice).unwrap_or_default() {
        match m {
            Value::String(s) => merges.push(s.clone()),
            Value::Array(pair) => match (
                pair.first().and_then(Value::as_str),
                pair.get(1).and_then(Value::as_str),
            ) {
                (Some(a), Some(b)) if pair.len() == 2 => merges.push(format!("{a} {b}")),
                _ => return Err(unsupported(format!("merge {m} is not a pair of strings"))),
            },
            _ => return Err(unsupported(format!("merge {m} is neither \"a b\" nor [\"a\", \"b\"]"))),
        }
    }

    let stages = pre_stages(&root["pre_tokenizer"]).map_err(unsupported)?;
    if stages.is_empty() {
        return Err(unsupported(
            "no pre-tokenizer: a byte-level BPE needs ByteLevel or a Split regex".into(),
        ));
    }

    let id_of = |name: &str| tokens.iter().position(|t| t == name).map(|i| i as u32);
    let mut spec = VocabSpec {
        model: "gpt2".into(),
        tokens: tokens.clone(),
        token_types: Some(types),
        merges: Some(merges),
        ..VocabSpec::default()
    };

    // BOS/EOS from a TemplateProcessing post-processor ("<bos> $A" / "$A <eos>") ...
    if let Some(single) = find_template(&root["post_processor"]) {
        let special_at = |i: usize| single.get(i).and_then(|p| p["SpecialToken"]["id"].as_str());
        if let Some(bos) = special_at(0).and_then(id_of) {
            spec.bos = Some(bos);
            spec.add_bos = Some(true);
        }
        if single.len() > 1 {
            if let Some(eos) = special_at(single.len() - 1).and_then(id_of) {
                spec.eos = Some(eos);
                spec.add_eos = Some(true);
            }
        }
    }
    // ... and from tokenizer_config.json, which has the last word when present.
    let mut clean_spaces = false;
    if let Some(config_path) = path
        .parent()
        .map(|d| d.join("tokenizer_config.json"))
        .filter(|p| p.exists())
    {
        let config = read_json(&config_path)?;
        let token_name = |v: &Value| v.as_str().or_else(|| v["content"].as_str()).map(str::to_string);
        if let Some(id) = token_name(&config["bos_token"]).and_then(|t| id_of(&t)) {
            spec.bos = Some(id);
        }
        if let Some(id) = token_name(&config["eos_token"]).and_then(|t| id_of(&t)) {
            spec.eos = Some(id);
        }
        if let Some(id) = token_name(&config["pad_token"]).and_then(|t| id_of(&t)) {
            spec.pad = Some(id);
        }
        if let Some(b) = config["add_bos_token"].as_bool() {
            spec.add_bos = Some(b);
        }
        if let Some(b) = config["add_eos_token"].as_bool() {
            spec.add_eos = Some(b);
        }
        clean_spaces = config["clean_up_tokenization_spaces"].as_bool().unwrap_or(false);
    }
    if spec.add_bos == Some(true) && spec.bos.is_none() {
        spec.add_bos = Some(false);
    }

    Ok(Loaded {
        spec,
        flags: PreFlags {
            ignore_merges: model["ignore_merges"].as_bool().unwrap_or(false),
            clean_spaces,
            add_bos: false,
            no_default_bos: true,
        },
        splitter: PreTokenizer::from_stages(stages),
    })
}

fn pre_stages(node: &Value) -> Result<Vec<Stage>, String> {
    let mut stages = Vec::new();
    match node["type"].as_str() {
        None if node.is_null() => {}
        Some("Sequence") => {
            for inner in node["pretokenizers"].as_array().map(Vec::as_slice).unwrap_or_default() {
                stages.extend(pre_stages(inner)?);
            }
        }
        Some("ByteLevel") => {
            // add_prefix_space is not applied (llama.cpp does not apply it either).
            if node["use_regex"].as_bool().unwrap_or(true) {
                stages.push(Stage::Gpt2);
            }
        }
        Some("Split") => {
            let behavior = node["behavior"].as_str().unwrap_or("");
            if behavior != "Isolated" || node["invert"].as_bool().unwrap_or(false) {
                return Err(format!(
                    "Split with behavior {behavior:?} (only Isolated, not inverted, is supported)"
                ));
            }
            let pattern = match (node["pattern"]["Regex"].as_str(), node["pattern"]["String"].as_str()) {
                (Some(re), _) => re.to_string(),
                (None, Some(s)) => regex_syntax::escape(s),
                _ => return Err(format!("Split without a pattern: {node}")),
            };
            stages.push(Stage::from_pattern(&pattern).map_err(|e| e.to_string())?);
        }
        Some("Digits") => {
            let pattern = if node["individual_digits"].as_bool().unwrap_or(false) {
                r"\p{N}"
            } else {
                r"\p{N}+"
            };
            stages.push(Stage::from_pattern(pattern).map_err(|e| e.to_string())?);
        }
        other => return Err(format!("pre-tokenizer {other:?} is not supported")),
    }
    Ok(stages)
}

/// The `single` template of a TemplateProcessing post-processor, possibly inside a Sequence.
fn find_template(node: &Value) -> Option<&Vec<Value>> {
    match node["type"].as_str()? {
        "TemplateProcessing" => node["single"].as_array(),
        "Sequence" => node["processors"].as_array()?.iter().find_map(find_template),
        _ => None,
    }
}
