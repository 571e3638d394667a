//! Speculative decoding changes no byte: for every architecture, greedy and sampled, a generation that
//! verifies drafts — prompt lookup, a draft model, the model's own MTP block, or drafts right at a chosen
//! rate — gives the plain
//! generation's tokens and the plain generation's trace, record for record, while drafts are both kept
//! and thrown away (so that the cache's rollback, and a recurrent state's, are exercised).

mod common;

use common::*;
use titan_engine::draft::{Drafter, ModelDrafter, MtpDrafter, NgramDrafter, ReplayDrafter, StepRows};
use titan_engine::trace::{diff, Trace};
use titan_engine::{GenerateOptions, Generation, Model, Outputs, SamplerOptions, Sequence, Speculation};

fn options(temperature: f32) -> GenerateOptions {
    GenerateOptions {
        max_tokens: 40,
        n_ctx: 128,
        sampler: SamplerOptions {
            temperature,
            seed: 42,
            ..Default::default()
        },
    }
}

fn run(
    model: &Model,
    prompt: &[u32],
    opts: &GenerateOptions,
    drafter: Option<&mut dyn Drafter>,
) -> (Generation, Trace) {
    let mut t = Trace::default();
    // Always four drafts: the adaptive length would follow this machine's timings.
    let spec = drafter.map(|drafter| Speculation {
        drafter,
        min_drafts: 4,
        max_drafts: 4,
    });
    let g = model.generate_with(prompt, opts, spec, Some(&mut t), |_| {}).unwrap();
    (g, t)
}

/// Another file of `file`'s architecture (the same vocabulary, other weights): a draft model that is
/// right often but not always.
fn draft_model(file: &str) -> Model {
    let dir = fixtures().join(file).parent().unwrap().to_path_buf();
    let mut others: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "gguf") && !p.ends_with(file))
        .collect();
    others.sort();
    Model::load(
        others
            .first()
            .unwrap_or_else(|| panic!("{file}: no other file to draft with")),
    )
    .unwrap()
}

#[test]
fn drafts_change_no_byte_of_the_output_or_the_trace() {
    for f in ONE_PER_ARCHITECTURE {
        let model = Model::load(fixtures().join(f)).unwrap();
        let draft = draft_model(f);
        // A text that repeats itself, so that prompt lookup finds something to draft.
        let prompt = model
            .tokenizer
            .encode("one two three four five, one two three four five, one two", true, false);
        for temperature in [0.0, 0.9] {
            let opts = options(temperature);
            let (plain, plain_trace) = run(&model, &prompt, &opts, None);
            assert_eq!(plain.spec.drafted, 0);
            let text: Vec<u32> = prompt.iter().chain(&plain.tokens).copied().collect();
            let drafters: Vec<(&str, Box<dyn Drafter>)> = vec![
                ("ngram", Box::new(NgramDrafter::default())),
                (
                    "draft model",
                    Box::new(ModelDrafter::new(&draft, &model, opts.n_ctx).unwrap()),
                ),
                (
                    "replay at 0.7",
                    Box::new(ReplayDrafter::new(text, 0.7, model.config.n_vocab, 3)),
                ),
            ];
            for (name, mut d) in drafters {
                let (g, t) = run(&model, &prompt, &opts, Some(d.as_mut()));
                let what = format!("{f}, temperature {temperature}, {name}: {:?}", g.spec);
                assert_eq!(g.tokens, plain.tokens, "{what}");
                assert_eq!(g.stop, plain.stop, "{what}");
                let rep = diff(&plain_trace, &t, None);
                assert!(rep.identical(), "{what}: {rep:?}");
                assert!(rep.decisions >= plain.tokens.len(), "{what}: {rep:?}");
                println!("{what}: {} tokens in {} steps", g.tokens.len(), g.spec.steps);
                if name == "replay at 0.7" && plain.tokens.len() > 8 {
                    // Both kept and rejected drafts, and fewer steps than tokens.
                    assert!(0 < g.spec.accepted && g.spec.accepted < g.spec.drafted, "{what}");
                    assert!(g.spec.steps < plain.spec.steps, "{what}");
                }
            }
        }
    }
}

/// Records what an MTP drafter was asked and what it drafted; with `truth` (the plain generation's text), it
/// then proposes that text's next tokens instead, so that steps keep several rows.
struct Recorder<'m> {
    inner: MtpDrafter<'m>,
    seen: Vec<(Vec<u32>, usize, Vec<u32>)>,
    truth: Option<Vec<u32>>,
}

impl Drafter for Recorder<'_> {
    fn draft(&mut self, history: &[u32], max: usize, out: &mut Vec<u32>) -> titan_engine::Result<()> {
        self.inner.draft(history, max, out)?;
        self.seen.push((history.to_vec(), max, out.clone()));
        if let Some(text) = &self.truth {
            out.clear();
            out.extend(text.iter().skip(history.len()).take(max));
        }
        Ok(())
    }

    fn wants_states(&self) -> bool {
        self.inner.wants_states()
    }

    fn observe(&mut self, rows: &StepRows<'_>) -> titan_engine::Result<()> {
        self.inner.observe(rows)
    }
}

/// Drafts from the model's own MTP block (a file that kept it) change no byte either; and at every step
/// they are the drafts that the block gives for the same history computed at once — so its catch-up after
/// each step (rows kept, drafts rejected, a recurrent state gone back and fed again) kept its cache exact.
#[test]
fn mtp_drafts_change_no_byte_and_are_those_of_the_history_at_once() {
    for (file, temperature) in [
        "qwen3next-mtp/q8_0.gguf",
        "qwen35moe-mtp/q8_0.gguf",
        "glm4moe/q4_0.gguf",
    ]
    .into_iter()
    .flat_map(|f| [(f, 0.0), (f, 0.9)])
    {
        let model = Model::load(fixtures().join(file)).unwrap();
        let prompt = model.tokenizer.encode("one two three four five, one two", true, false);
        let opts = options(temperature);
        let (plain, plain_trace) = run(&model, &prompt, &opts, None);
        let text: Vec<u32> = prompt.iter().chain(&plain.tokens).copied().collect();
        for truth in [None, Some(text)] {
            let mut rec = Recorder {
                inner: MtpDrafter::new(&model, opts.n_ctx).unwrap(),
                seen: Vec::new(),
                truth,
            };
            let replaced = rec.truth.is_some();
            let (g, t) = run(&model, &prompt, &opts, Some(&mut rec));
            let what = format!(
                "{file}, temperature {temperature}, true drafts {replaced}: {:?}",
                g.spec
            );
            assert_eq!(g.tokens, plain.tokens, "{what}");
            let rep = diff(&plain_trace, &t, None);
            assert!(rep.identical(), "{what}: {rep:?}");
            assert!(g.spec.drafted > 0 && rec.seen.len() > 4, "{what}");
            if replaced {
                assert!(g.spec.accepted > 8, "{what}");
            }
            for (history, max, drafted) in &rec.seen {
                assert_eq!(
                    &drafts_at_once(&model, history, *max),
                    drafted,
                    "{what}: after {} positions",
                    history.len() - 1
                );
            }
        }
    }
}

/// The drafts a fresh MTP drafter gives after `history`, every position but the last run at once.
fn drafts_at_once(model: &Model, history: &[u32], max: usize) -> Vec<u32> {
    let n = history.len() - 1;
    let mut seq = model.new_sequence(128);
    let mut fresh = MtpDrafter::new(model, 128).unwrap();
    feed(model, &mut seq, &mut fresh, &history[..n], 0);
    let mut drafts = Vec::new();
    fresh.draft(history, max, &mut drafts).unwrap();
    drafts
}

/// Runs `tokens` (if any) at positions pos0.. of `seq`, and shows the drafter their rows.
fn feed(model: &Model, seq: &mut Sequence, drafter: &mut MtpDrafter<'_>, tokens: &[u32], pos0: usize) {
    if tokens.is_empty() {
        return;
    }
    model.forward(tokens, pos0, seq, Outputs::Last).unwrap();
    let mut states = Vec::new();
    model.final_states(seq, 0..tokens.len(), &mut states);
    let rows = StepRows {
        tokens,
        pos0,
        states: &states,
    };
    drafter.observe(&rows).unwrap();
}

/// An MTP drafter kept with its sequence for a new text that shares a prefix (a server's prompt cache)
/// continues where both can be cut — where the text stood, at the prompt's end it marked, or one row
/// before a row it holds — and then drafts what a fresh drafter gives for the new text computed at once.
#[test]
fn an_mtp_drafter_kept_for_a_new_text_drafts_as_a_fresh_one() {
    for file in [
        "qwen3next-mtp/q8_0.gguf",
        "qwen35moe-mtp/q8_0.gguf",
        "glm4moe/q4_0.gguf",
    ] {
        let model = Model::load(fixtures().join(file)).unwrap();
        let recurrent = file.starts_with("qwen3");
        let prompt = model
            .tokenizer
            .encode("one two three four five, one two three", true, false);
        let answer = model.tokenizer.encode(" four five six seven", false, false);
        let p = prompt.len();
        let old: Vec<u32> = prompt.iter().chain(&answer).copied().collect();
        // New texts: the old one and more, its prompt and something else, half its prompt and something else;
        // each with one token more (its row is the first draft's, which takes the state resumed from) or three.
        let tails = [
            model.tokenizer.encode(" and", false, false),
            model.tokenizer.encode(" eight nine ten", false, false),
        ];
        let cases = [
            (old.len(), old.len()),
            (p, p),
            (p / 2, if recurrent { 0 } else { p / 2 - 1 }),
        ];
        for ((shared, want_cut), tail) in cases.into_iter().flat_map(|c| tails.iter().map(move |t| (c, t))) {
            let new: Vec<u32> = old[..shared].iter().chain(tail).copied().collect();
            // The old text as a server runs it: the prompt, a checkpoint and mark at its end, the answer.
            let mut seq = model.new_sequence(128);
            let mut drafter = MtpDrafter::new(&model, 128).unwrap();
            feed(&model, &mut seq, &mut drafter, &prompt, 0);
            seq.checkpoint();
            drafter.mark();
            feed(&model, &mut seq, &mut drafter, &answer, p);
            let cut = drafter.resumable(shared, |k| seq.reusable(k));
            assert_eq!(cut, want_cut, "{file}, {shared} tokens shared");
            seq.truncate(cut).unwrap();
            drafter.resume(cut);
            // The rest of the new text but its last token, then drafts.
            feed(&model, &mut seq, &mut drafter, &new[cut..new.len() - 1], cut);
            let mut drafts = Vec::new();
            drafter.draft(&new, 4, &mut drafts).unwrap();
            assert_eq!(drafts.len(), 4, "{file}, {shared} shared");
            assert_eq!(
                drafts,
                drafts_at_once(&model, &new, 4),
                "{file}, {shared} tokens shared"
            );
        }
    }
}
