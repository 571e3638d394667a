//! Speculative decoding in `titan serve`: requests that repeat their prompt, greedy and seeded-sampled,
//! sent several at once beside others to a server that drafts by prompt lookup, answer byte for byte what
//! a server without drafts answers — while drafts are verified and kept (the metrics say how many); on the
//! hybrids too, whose recurrent state goes back to a copy when a draft is rejected.

use std::thread;

use serde_json::{json, Value};

mod common;
use common::*;

fn requests() -> Vec<Value> {
    let repeat = "alpha beta gamma delta epsilon, alpha beta gamma delta epsilon, alpha beta gamma";
    let mut r = Vec::new();
    for (i, prompt) in [repeat, "Write a list of fruits.", repeat, "Hello there"]
        .iter()
        .enumerate()
    {
        r.push(json!({
            "prompt": prompt,
            "max_tokens": 48,
            "temperature": if i % 2 == 0 { 0.0 } else { 0.9 },
            "seed": 7 + i,
        }));
        r.push(json!({
            "prompt": prompt,
            "max_tokens": 40,
            "temperature": 0.8,
            "top_k": 0,
            "seed": 100 + i,
        }));
    }
    // Two tokens made far likelier than the rest: a text of those two, which prompt lookup drafts right
    // and wrong by turns, on any model (a random-weight hybrid's own text never repeats itself).
    r.push(json!({
        "prompt": "Hello there",
        "max_tokens": 48,
        "temperature": 1.0,
        "logit_bias": {"64": 100, "265": 100},
        "seed": 3,
    }));
    r
}

/// Every request sent at once; the texts in order.
fn answers(server: &serve::Server) -> Vec<String> {
    thread::scope(|s| {
        let handles: Vec<_> = requests()
            .into_iter()
            .map(|body| {
                s.spawn(move || {
                    let (status, v) = server.post("/v1/completions", &body);
                    assert_eq!(status, 200, "{v}");
                    v["choices"][0]["text"].as_str().unwrap().to_string()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn metric(server: &serve::Server, name: &str) -> f64 {
    let (_, v) = server.get("/metrics", false);
    let text = v.as_str().unwrap().to_string();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
        .parse()
        .unwrap()
}

#[test]
fn drafted_answers_beside_others_are_the_plain_answers() {
    for model in [
        "qwen3moe/q4_0.gguf",
        "gpt-oss/mxfp4_moe.gguf",
        "deepseek2-lite/q4_0.gguf",
        "qwen3next/q8_0.gguf",
        "qwen35/q4_0.gguf",
    ] {
        let m = fixture(model);
        let plain = serve::Server::start(&m, "templates/qwen3.jinja", &["--parallel", "3", "--draft-max", "0"]);
        let want = answers(&plain);
        assert_eq!(metric(&plain, "titan_draft_tokens_total"), 0.0);
        drop(plain);
        // Always four drafts where prompt lookup has them: the adaptive length would follow this machine.
        let spec = serve::Server::start(
            &m,
            "templates/qwen3.jinja",
            &["--parallel", "3", "--draft-max", "4", "--draft-min", "4"],
        );
        let got = answers(&spec);
        for (i, (a, b)) in want.iter().zip(&got).enumerate() {
            assert_eq!(a, b, "{model}, request {i}");
        }
        let (drafted, kept) = (
            metric(&spec, "titan_draft_tokens_total"),
            metric(&spec, "titan_draft_tokens_accepted_total"),
        );
        println!("{model}: {kept} of {drafted} drafts kept");
        assert!(kept > 0.0 && kept < drafted, "{model}: {kept} of {drafted}");
    }
}

#[test]
fn a_draft_model_drafts_for_every_slot_and_changes_no_answer() {
    let m = fixture("qwen3moe/q4_0.gguf");
    let plain = serve::Server::start(&m, "templates/qwen3.jinja", &["--parallel", "3", "--draft-max", "0"]);
    let want = answers(&plain);
    drop(plain);
    let draft = fixture("qwen3moe/q8_0.gguf");
    let spec = serve::Server::start(
        &m,
        "templates/qwen3.jinja",
        &[
            "--parallel",
            "3",
            "--draft",
            draft.to_str().unwrap(),
            "--draft-min",
            "3",
            "--draft-max",
            "3",
        ],
    );
    assert_eq!(answers(&spec), want);
    let (drafted, kept) = (
        metric(&spec, "titan_draft_tokens_total"),
        metric(&spec, "titan_draft_tokens_accepted_total"),
    );
    assert!(kept > 0.0 && kept < drafted, "{kept} of {drafted}");
    // A draft model of another vocabulary is refused before the server listens, naming both vocabularies.
    let o = titan()
        .args(["serve", "--listen", "127.0.0.1:0", "-m"])
        .arg(&m)
        .arg("--draft")
        .arg(fixture("olmoe/q8_0.gguf"))
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--draft") && err.contains("vocabulary"), "{err}");
}

/// A conversation sent one request at a time: each prompt repeats the last prompt and answer and adds to
/// them, then one repeats the last prompt with something else instead of its answer (as when a reply is
/// regenerated). The texts in order, and each request's cached prompt tokens.
fn conversation(server: &serve::Server) -> Vec<(String, u64)> {
    let mut said = Vec::new();
    let mut text = "alpha beta gamma delta epsilon, alpha beta".to_string();
    let mut last = text.clone();
    for turn in 0..4 {
        if turn == 3 {
            text = format!("{last} and then");
        }
        last = text.clone();
        let body = json!({"prompt": text, "max_tokens": 12, "temperature": 0.0});
        let (status, v) = server.post("/v1/completions", &body);
        assert_eq!(status, 200, "{v}");
        let answer = v["choices"][0]["text"].as_str().unwrap().to_string();
        let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
        text = format!("{text}{answer} zeta eta");
        said.push((answer, cached));
    }
    said
}

/// Drafts from the model's own MTP block, for every slot, change no answer either — beside other requests,
/// and along a conversation whose slot keeps the block's cache with its sequence for the next turn (each
/// turn still drafts, so the drafter followed every cut the prompt cache made); a model without an MTP
/// block is refused before the server listens.
#[test]
fn mtp_drafts_for_every_slot_and_change_no_answer() {
    for model in [
        "qwen3next-mtp/q8_0.gguf",
        "qwen35moe-mtp/q8_0.gguf",
        "glm4moe/q4_0.gguf",
    ] {
        let m = fixture(model);
        let plain = serve::Server::start(&m, "templates/qwen3.jinja", &["--parallel", "3", "--spec", "off"]);
        // The conversation first, on empty slots: what the prompt cache holds then does not depend on how
        // the concurrent requests after it happened to be scheduled.
        let want_talk = conversation(&plain);
        let want = answers(&plain);
        assert_eq!(metric(&plain, "titan_draft_tokens_total"), 0.0);
        drop(plain);
        let spec = serve::Server::start(
            &m,
            "templates/qwen3.jinja",
            &[
                "--parallel",
                "3",
                "--spec",
                "mtp",
                "--draft-min",
                "3",
                "--draft-max",
                "3",
            ],
        );
        let (texts, cached): (Vec<String>, Vec<u64>) = conversation(&spec).into_iter().unzip();
        let (want_texts, want_cached): (Vec<String>, Vec<u64>) = want_talk.into_iter().unzip();
        assert_eq!(texts, want_texts, "{model}");
        // As much of each prompt reused, or one token less: where the drafter holds no state for the
        // position before the cut, the step computes that position again.
        for (got, want) in cached.iter().zip(&want_cached) {
            assert!(
                got + 1 >= *want && got <= want,
                "{model}: {cached:?} against {want_cached:?}"
            );
        }
        assert!(cached[1..].iter().all(|&c| c > 0), "{model}: {cached:?}");
        let drafted = metric(&spec, "titan_draft_tokens_total");
        // A turn of 12 tokens whose drafts all fail drafts 27 (3 a step while 3 more tokens are wanted): more
        // than three turns' worth means that every turn drafted.
        assert!(drafted > 3.0 * 27.0, "{model}: {drafted} drafts along the conversation");
        assert_eq!(answers(&spec), want, "{model}");
        assert!(metric(&spec, "titan_draft_tokens_total") > drafted, "{model}");
        println!("{model}: {drafted} drafts along the conversation, cached {cached:?}");
    }
    let o = titan()
        .args(["serve", "--listen", "127.0.0.1:0", "--spec", "mtp", "-m"])
        .arg(fixture("qwen3moe/q4_0.gguf"))
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--spec mtp") && err.contains("multi-token-prediction"),
        "{err}"
    );
}
