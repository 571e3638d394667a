//! The `http_request` fuzz target's body, shared by `fuzz/fuzz_targets/http_request.rs` and
//! `tests/fuzz_corpus.rs`: arbitrary bytes as the body of `POST /v1/completions`, of
//! `POST /v1/chat/completions` and of `POST /v1/responses`, checked as the handlers check them (JSON,
//! prompt, messages rendered by a real chat template, then the sampling and length settings against a
//! context). Every body is accepted or refused with a 4xx; what is accepted is in range.

use titan_server::api::{chat_body, completion_body, render, PromptInput};
use titan_server::responses::responses_body;
use titan_server::template::ChatTemplate;

const CTX: usize = 512;
/// The vocabulary `logit_bias` ids are checked against.
const VOCAB: usize = 1000;

/// Qwen3's chat template (tests/fixtures/templates/qwen3.jinja), as the server's tests use it.
pub fn template(root: &std::path::Path) -> ChatTemplate {
    let source =
        std::fs::read_to_string(root.join("tests/fixtures/templates/qwen3.jinja")).expect("the Qwen3 template fixture");
    ChatTemplate::new(&source, "", "<|im_end|>").expect("the Qwen3 template compiles")
}

pub fn run(template: &ChatTemplate, data: &[u8]) {
    // The prompt's length, as the tokenizer would give it, stands in for tokenising (not what is fuzzed here).
    let prompt_len = |n: usize| n % (CTX + 16);
    match completion_body(data) {
        Ok((r, prompt)) => {
            let n = match prompt {
                PromptInput::Text(t) => t.len(),
                PromptInput::Tokens(t) => {
                    assert!(!t.is_empty(), "an empty token list was accepted");
                    t.len()
                }
            };
            check(
                r.params.settings(prompt_len(n), CTX, VOCAB, "max_tokens"),
                prompt_len(n),
            );
        }
        Err(e) => assert!(e.status.is_client_error(), "{}: {}", e.status, e.message),
    }
    match chat_body(data, Some(template), 16 * data.len().max(1 << 10)) {
        Ok((r, text, _)) => {
            assert!(!r.messages.is_empty(), "a chat without messages was accepted");
            check(
                r.params.settings(prompt_len(text.len()), CTX, VOCAB, "max_tokens"),
                prompt_len(text.len()),
            );
        }
        Err(e) => assert!(e.status.is_client_error(), "{}: {}", e.status, e.message),
    }
    match responses_body(data).and_then(|(r, messages)| {
        let text = render(template, &messages, &[], 16 * data.len().max(1 << 10))?;
        Ok((r, text))
    }) {
        Ok((r, text)) => check(
            r.params()
                .settings(prompt_len(text.len()), CTX, VOCAB, "max_output_tokens"),
            prompt_len(text.len()),
        ),
        Err(e) => assert!(e.status.is_client_error(), "{}: {}", e.status, e.message),
    }
}

fn check(settings: Result<titan_server::api::Settings, titan_server::error::ApiError>, prompt_len: usize) {
    match settings {
        Ok(s) => {
            assert!(
                (1..CTX).contains(&prompt_len),
                "a prompt of {prompt_len} tokens was accepted"
            );
            assert!(
                s.max_tokens >= 1 && prompt_len + s.max_tokens <= CTX,
                "max_tokens {} accepted",
                s.max_tokens
            );
            assert!(s.sampler.check().is_ok() && s.stop.len() <= 4);
            assert!(s.sampler.logit_bias.iter().all(|&(id, _)| (id as usize) < VOCAB));
        }
        Err(e) => assert!(e.status.is_client_error(), "{}: {}", e.status, e.message),
    }
}
