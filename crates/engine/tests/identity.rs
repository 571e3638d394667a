//! Bit-identity claims, checked with traces: the same run gives the same bytes whatever the thread
//! count, and a token's logits do not depend on whether it was computed in a prompt batch or alone.

mod common;

use common::*;
use titan_engine::trace::{diff, Trace};
use titan_engine::{GenerateOptions, Model, Outputs, SamplerOptions};

fn traced_run(model: &Model, threads: usize) -> Trace {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
    let prompt = model
        .tokenizer
        .encode("The quick brown fox jumps over the lazy dog", true, false);
    let opts = GenerateOptions {
        max_tokens: 6,
        n_ctx: 64,
        sampler: SamplerOptions {
            temperature: 0.7,
            seed: 42,
            ..Default::default()
        },
    };
    let mut t = Trace::default();
    pool.install(|| model.generate_traced(&prompt, &opts, Some(&mut t), |_| {}))
        .unwrap();
    t
}

#[test]
fn one_thread_and_two_threads_are_identical() {
    for f in ONE_PER_ARCHITECTURE {
        let model = Model::load(fixtures().join(f)).unwrap();
        let (a, b) = (traced_run(&model, 1), traced_run(&model, 2));
        let rep = diff(&a, &b, None);
        println!(
            "{f}: {} tensors, {} elements, {} decisions",
            rep.tensors, rep.elements, rep.decisions
        );
        assert!(rep.identical(), "{f}: {rep:?}");
        // Routing decisions besides the sampled tokens, but in a model without experts (the dense Qwen3.5).
        let routed = model.config.n_expert > 0;
        assert!(
            rep.elements > 1000 && rep.decisions > if routed { 6 } else { 0 },
            "{f}: {rep:?}"
        );
    }
}

#[test]
fn a_row_alone_equals_the_same_row_in_a_batch() {
    for f in ONE_PER_ARCHITECTURE {
        let model = Model::load(fixtures().join(f)).unwrap();
        let tokens = model
            .tokenizer
            .encode("Héllo wörld, 日本語 🙂 fn main() {}", true, false);
        let v = model.config.n_vocab;
        let mut batch_seq = model.new_sequence(tokens.len());
        let batch = model.forward(&tokens, 0, &mut batch_seq, Outputs::All).unwrap();
        let mut seq = model.new_sequence(tokens.len());
        for (i, &t) in tokens.iter().enumerate() {
            let alone = model.forward(&[t], i, &mut seq, Outputs::Last).unwrap();
            let same = alone
                .iter()
                .zip(&batch[i * v..(i + 1) * v])
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same,
                "{f}: position {i} differs between batch and single-row computation"
            );
        }
    }
}

/// The public API refuses what it cannot run, without panicking: no tokens, a position past the context,
/// a sampler value out of range, a context beyond the model's or beyond memory.
#[test]
fn requests_that_cannot_run_are_errors() {
    let model = Model::load(fixtures().join(ONE_PER_ARCHITECTURE[0])).unwrap();
    let mut seq = model.new_sequence(8);
    let err = model.forward(&[], 0, &mut seq, Outputs::All).unwrap_err().to_string();
    assert_eq!(err, "forward was given no tokens");
    let err = model
        .forward(&[1], usize::MAX, &mut seq, Outputs::All)
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("context of 8 tokens exceeded"), "{err}");
    let opts = GenerateOptions {
        max_tokens: usize::MAX,
        n_ctx: 8,
        sampler: SamplerOptions {
            top_p: 2.0,
            ..Default::default()
        },
    };
    let err = model.generate(&[1, 2], &opts, |_| {}).unwrap_err().to_string();
    assert_eq!(err, "top_p is 2; it must be in (0, 1]");
    let trained = model.config.n_ctx_train;
    let err = model
        .check_context(trained + 1, u64::MAX, false)
        .unwrap_err()
        .to_string();
    assert!(err.contains(&format!("outside 1..={trained}")), "{err}");
    let err = model.check_context(trained + 1, 1 << 10, true).unwrap_err().to_string();
    assert!(
        err.contains("of KV cache, more than the 0.0 GiB of memory available"),
        "{err}"
    );
    model.check_context(trained, u64::MAX, false).unwrap();
    model.check_context(trained * 2, u64::MAX, true).unwrap();
    // Memory unknown (u64::MAX): a cache past what can be addressed is refused, and no placeholder is printed.
    let err = model.check_context(usize::MAX, u64::MAX, true).unwrap_err().to_string();
    assert!(
        err.ends_with("of KV cache, more than this machine can address") && !err.contains("memory available"),
        "{err}"
    );
}

/// Continuous batching: three sequences advanced together in uneven chunks (one's prompt beside another's
/// decode rows, spans of different lengths at different positions) give each sequence's logits the same bits
/// as running it alone.
#[test]
fn a_sequence_in_a_batch_of_sequences_equals_it_alone() {
    use titan_engine::{Batch, Span};
    for f in ONE_PER_ARCHITECTURE {
        let model = Model::load(fixtures().join(f)).unwrap();
        let v = model.config.n_vocab;
        let texts = [
            "The quick brown fox jumps over the lazy dog",
            "Héllo wörld, 日本語 🙂",
            "fn main() { println!(\"hi\"); }",
        ];
        let seqs: Vec<Vec<u32>> = texts.iter().map(|t| model.tokenizer.encode(t, true, false)).collect();
        let alone: Vec<Vec<f32>> = seqs
            .iter()
            .map(|t| {
                let mut seq = model.new_sequence(t.len());
                model.forward(t, 0, &mut seq, Outputs::All).unwrap().to_vec()
            })
            .collect();
        // Each step takes the next chunk of every sequence that has tokens left: chunk sizes 1..=5 by a
        // fixed pattern, so prompt-like chunks and single decode-like rows meet in the same step.
        let mut states: Vec<_> = seqs.iter().map(|t| model.new_sequence(t.len())).collect();
        let mut done = vec![0usize; seqs.len()];
        let mut got: Vec<Vec<f32>> = vec![Vec::new(); seqs.len()];
        let mut batch = Batch::default();
        let mut step = 0;
        while done.iter().zip(&seqs).any(|(d, s)| d < &s.len()) {
            let mut order = Vec::new();
            let mut spans = Vec::new();
            for (i, (seq, state)) in seqs.iter().zip(states.iter_mut()).enumerate() {
                if done[i] == seq.len() {
                    continue;
                }
                let take = (1 + (step + 2 * i) % 5).min(seq.len() - done[i]);
                spans.push(Span {
                    tokens: &seq[done[i]..done[i] + take],
                    pos0: done[i],
                    seq: state,
                    outputs: Outputs::All,
                });
                order.push((i, take));
            }
            let logits = model.forward_batch(&mut spans, &mut batch).unwrap();
            let mut at = 0;
            for (i, take) in order {
                got[i].extend_from_slice(&logits[at..at + take * v]);
                at += take * v;
                done[i] += take;
            }
            step += 1;
        }
        for (i, (a, b)) in alone.iter().zip(&got).enumerate() {
            assert!(
                a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
                "{f}: sequence {i} differs when batched with others"
            );
        }
        println!("{f}: 3 sequences over {step} batched steps, identical to each alone");
    }
}

/// A linear-attention state only moves forward: a call continues where the last one ended or restarts the
/// sequence at 0, and a restart gives the first run's bits again (a KV cache could be overwritten anywhere).
#[test]
fn a_recurrent_state_continues_or_restarts() {
    let model = Model::load(fixtures().join("qwen35moe/q8_0.gguf")).unwrap();
    let t = model.tokenizer.encode("The quick brown fox jumps", true, false);
    let mut seq = model.new_sequence(t.len());
    let first = model.forward(&t, 0, &mut seq, Outputs::All).unwrap().to_vec();
    let err = model
        .forward(&t[2..3], 2, &mut seq, Outputs::Last)
        .unwrap_err()
        .to_string();
    let end = t.len();
    assert_eq!(err, format!("this model's linear-attention state cannot move to position 2: the sequence continues at {end} (or restarts at 0)"));
    let again = model.forward(&t, 0, &mut seq, Outputs::All).unwrap();
    assert!(
        again.iter().zip(&first).all(|(a, b)| a.to_bits() == b.to_bits()),
        "a restart at 0 differs from the first run"
    );
}

/// A sequence started over at position 0 computes a new text exactly as a fresh sequence does, whatever
/// its cache held before: the server reuses a finished request's sequence for the next one.
#[test]
fn a_reused_sequence_equals_a_fresh_one() {
    for f in ONE_PER_ARCHITECTURE {
        let model = Model::load(fixtures().join(f)).unwrap();
        let old = model.tokenizer.encode(
            "An earlier request, longer than the next one, fills the cache",
            true,
            false,
        );
        let new = model.tokenizer.encode("The next request", true, false);
        let mut fresh = model.new_sequence(old.len());
        let expected = model.forward(&new, 0, &mut fresh, Outputs::All).unwrap().to_vec();
        let mut reused = model.new_sequence(old.len());
        model.forward(&old, 0, &mut reused, Outputs::Last).unwrap();
        let got = model.forward(&new, 0, &mut reused, Outputs::All).unwrap();
        assert!(
            got.iter().zip(&expected).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{f}: a reused sequence differs from a fresh one"
        );
    }
}

/// A prompt cache: a sequence cut back to a prefix it shares with a new text, then given the rest, gives
/// the rest's logits the same bits as a fresh sequence given the whole text. A KV cache is cut at the
/// longest common prefix; a recurrent state only where its checkpoint was taken (the end of the first
/// prompt), and nowhere else.
#[test]
fn a_truncated_sequence_equals_a_fresh_one() {
    for f in ONE_PER_ARCHITECTURE {
        let model = Model::load(fixtures().join(f)).unwrap();
        let v = model.config.n_vocab;
        let encode = |t: &str| model.tokenizer.encode(t, true, false);
        let first = encode("The quick brown fox jumps over the lazy dog");
        let answer = model.tokenizer.encode(" and then it ran far away", false, false);
        let next = model.tokenizer.encode(" and then it sat down", false, false);
        let old: Vec<u32> = first.iter().chain(&answer).copied().collect();
        let new: Vec<u32> = first.iter().chain(&next).copied().collect();
        let common = old.iter().zip(&new).take_while(|(a, b)| a == b).count();
        assert!(common > first.len() && common < old.len(), "{f}: {common}");

        let mut fresh = model.new_sequence(64);
        let expected = model.forward(&new, 0, &mut fresh, Outputs::All).unwrap().to_vec();
        // The first prompt in one call, its checkpoint, then the answer a token at a time.
        let mut seq = model.new_sequence(64);
        model.forward(&first, 0, &mut seq, Outputs::Last).unwrap();
        seq.checkpoint();
        for (i, &t) in answer.iter().enumerate() {
            model.forward(&[t], first.len() + i, &mut seq, Outputs::Last).unwrap();
        }
        let recurrent = model.config.delta_net.is_some();
        let keep = seq.reusable(common);
        assert_eq!(keep, if recurrent { first.len() } else { common }, "{f}");
        if recurrent {
            let err = seq.truncate(common).unwrap_err().to_string();
            let (at, end) = (first.len(), old.len());
            assert_eq!(
                err,
                format!("this model's linear-attention state cannot go back to position {common}: it stands at {end} and has a copy at {at}"),
                "{f}"
            );
        }
        assert!(
            seq.truncate(old.len() + 1).is_err(),
            "{f}: kept a position never computed"
        );
        seq.truncate(keep).unwrap();
        let got = model.forward(&new[keep..], keep, &mut seq, Outputs::All).unwrap();
        assert!(
            got.iter()
                .zip(&expected[keep * v..])
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{f}: the rest after {keep} cached positions differs from a fresh sequence"
        );
        // Cut again, to the checkpoint, which the second text still shares: the same bits once more.
        seq.truncate(first.len()).unwrap();
        let again = model
            .forward(&new[first.len()..], first.len(), &mut seq, Outputs::All)
            .unwrap();
        assert!(
            again
                .iter()
                .zip(&expected[first.len() * v..])
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{f}: cut back to the checkpoint, the rest differs"
        );
        println!("{f}: {keep} of {} positions reused, identical", new.len());
    }
}

/// DeepSeek-V4's compressed entries over its 160-token sequence (windows of 4 and one of 128): one call, a token
/// at a time, uneven chunks, two threads, and a sequence cut back into the window of 128 and run on (after a
/// different text filled it), all give the same bits. An entry is computed by the call that completes its window,
/// from the window's stored inputs, whichever call that is.
#[test]
fn compressed_entries_do_not_depend_on_how_the_sequence_is_cut() {
    let m = manifest();
    let entry = m["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "deepseek4")
        .expect("the deepseek4 fixture");
    let tokens = ids(&entry["long"]["tokens"]);
    let model = Model::load(fixtures().join("deepseek4/mxfp4_moe.gguf")).unwrap();
    let (n, v) = (tokens.len(), model.config.n_vocab);
    assert!(n > 128, "the sequence completes a window of 128");
    let mut seq = model.new_sequence(n);
    let whole = model.forward(&tokens, 0, &mut seq, Outputs::All).unwrap().to_vec();
    let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());

    for chunk in [1, 37, 127] {
        let mut seq = model.new_sequence(n);
        for (i, part) in tokens.chunks(chunk).enumerate() {
            let pos = i * chunk;
            let got = model.forward(part, pos, &mut seq, Outputs::All).unwrap();
            assert!(
                same(got, &whole[pos * v..(pos + part.len()) * v]),
                "chunks of {chunk}: positions {pos}.. differ from one call"
            );
        }
    }
    let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
    let mut seq = model.new_sequence(n);
    let two = pool.install(|| model.forward(&tokens, 0, &mut seq, Outputs::All).unwrap().to_vec());
    assert!(same(&two, &whole), "two threads differ from one");

    // Another text to the end, then cut back to 100 (window 0 of 128 no longer complete) and given the rest.
    let mut seq = model.new_sequence(n);
    let other: Vec<u32> = tokens.iter().map(|&t| (t + 1) % v as u32).collect();
    model.forward(&other, 0, &mut seq, Outputs::Last).unwrap();
    model.forward(&tokens[..100], 0, &mut seq, Outputs::Last).unwrap();
    model.forward(&other[100..], 100, &mut seq, Outputs::Last).unwrap();
    seq.truncate(100).unwrap();
    let rest = model.forward(&tokens[100..], 100, &mut seq, Outputs::All).unwrap();
    assert!(
        same(rest, &whole[100 * v..]),
        "cut back into the window of 128, the rest differs from one call"
    );
}

/// A DeepSeek-V4 file whose token-to-expert table names an expert the layer does not have is refused when it
/// loads, with a message that says so, rather than indexing past the experts when that token comes.
#[test]
fn a_token_table_naming_a_missing_expert_is_refused() {
    let src = fixtures().join("deepseek4/mxfp4_moe.gguf");
    let (start, name) = {
        let f = titan_gguf::GgufFile::open(&src).unwrap();
        let t = f.tensor("blk.0.ffn_gate_tid2eid.weight").expect("the table");
        ((f.data_offset + t.offset) as usize, t.name.clone())
    };
    let mut bytes = std::fs::read(&src).unwrap();
    // token 0's first expert
    bytes[start..start + 4].copy_from_slice(&99i32.to_le_bytes());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad-table.gguf");
    std::fs::write(&path, bytes).unwrap();
    let err = Model::load(&path).err().expect("refused").to_string();
    assert!(
        err.contains(&format!("tensor {name} names expert 99, but the layer has 8")),
        "{err}"
    );
}
