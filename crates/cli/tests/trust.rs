//! Nodes that cannot be trusted, against a real backbone process on loopback: nodes that answer NaN or
//! change the bits of their answers (served from this test process: the model's own experts behind a
//! wrapper that lies), an impostor on a dead node's port, and a man in the middle that alters, replays or
//! trickles a node's frames. Each is caught, said, and computed around; where the contract promises it,
//! the text is the single machine's, byte for byte.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use titan_cluster::{NodeModel, WorkerOptions};
use titan_engine::experts::{ExpertJob, Experts};
use titan_engine::EngineError;
use titan_kernels::GgmlType;
use titan_net::{write_frame, Kind, HEADER_LEN, TAG_LEN};

mod common;
use common::tamper::{Relay, Tamper};
use common::*;

/// A temporary directory with the node token, and the qwen3moe fixture's single-machine trace in it.
struct Setup {
    dir: tempfile::TempDir,
    m: PathBuf,
    token: PathBuf,
    single: PathBuf,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let m = fixture("qwen3moe/q8_0.gguf");
    let token = token_file(dir.path());
    let single = dir.path().join("single.trace");
    trace(&m, &single, &[]);
    Setup { dir, m, token, single }
}

/// How a lying node changes the outputs it answers; `k` counts every output row it sends (one expert's
/// output for one input row), from 0.
#[derive(Clone, Copy)]
enum Lie {
    /// Output `at` holds a NaN.
    NanOnce { at: u64 },
    /// Every output holds an infinity.
    Infinite,
    /// Every output is zeros.
    Zeros,
    /// Every output is 3e38 (finite).
    Huge,
    /// Output `k` has the lowest bit of its first value flipped when `k % every == every - 1`.
    FlipOneIn { every: u64 },
}

/// The model's own experts, answering as `lie` says.
struct Liar {
    honest: Box<dyn Experts>,
    lie: Lie,
    outputs: AtomicU64,
}

impl Experts for Liar {
    fn input_type(&self, layer: usize) -> Result<GgmlType, EngineError> {
        self.honest.input_type(layer)
    }

    fn apply(
        &self,
        job: &ExpertJob,
        meanwhile: &mut dyn FnMut() -> Result<(), EngineError>,
        deliver: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<(), EngineError> {
        let d = job.input.cols();
        self.honest.apply(job, meanwhile, &mut |i, y| {
            let mut y = y.to_vec();
            for row in y.chunks_exact_mut(d) {
                let k = self.outputs.fetch_add(1, Relaxed);
                match self.lie {
                    Lie::NanOnce { at } if k == at => row[0] = f32::NAN,
                    Lie::NanOnce { .. } => {}
                    Lie::Infinite => row[0] = f32::INFINITY,
                    Lie::Zeros => row.fill(0.0),
                    Lie::Huge => row.fill(3e38),
                    Lie::FlipOneIn { every } if k % every == every - 1 => row[0] = f32::from_bits(row[0].to_bits() ^ 1),
                    Lie::FlipOneIn { .. } => {}
                }
            }
            deliver(i, &y)
        })
    }
}

/// A node serving `model`'s experts from this process, lying as `lie` says; its address.
fn liar(model: &Path, lie: Lie) -> String {
    let (config, honest, budget) = titan_store::load_experts(model, None).unwrap();
    let identity = titan_layout::ModelIdentity::of(&titan_gguf::GgufFile::open(model).unwrap())
        .unwrap()
        .to_string();
    let node = NodeModel {
        identity,
        n_layer: config.n_layer,
        n_expert: config.n_expert,
        n_embd: config.n_embd,
        experts: Box::new(Liar {
            honest,
            lie,
            outputs: AtomicU64::new(0),
        }),
        holds: None,
        weights: None,
        budget,
    };
    let opts = WorkerOptions {
        listen: "127.0.0.1:0".into(),
        token: TOKEN.as_bytes().to_vec(),
        max_frame: titan_net::DEFAULT_MAX_FRAME,
        encrypt: false,
    };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || titan_cluster::serve(node, opts, |a| tx.send(a).unwrap()));
    rx.recv_timeout(Duration::from_secs(60)).unwrap().to_string()
}

fn cluster_args<'a>(nodes: &'a str, token: &'a Path) -> Vec<&'a str> {
    vec![
        "--nodes",
        nodes,
        "--token-file",
        token.to_str().unwrap(),
        "--no-backbone-share",
    ]
}

/// A node that answers a NaN once, or infinities always, is refused each time (the answer computed here
/// instead), and the text is the single machine's.
#[test]
fn non_finite_answers_fail_over_and_change_no_byte() {
    let Setup { dir, m, token, single } = setup();
    for (name, lie, what) in [("nan", Lie::NanOnce { at: 30 }, "NaN"), ("inf", Lie::Infinite, "inf")] {
        let node = liar(&m, lie);
        let out = dir.path().join(format!("{name}.trace"));
        let o = trace(&m, &out, &cluster_args(&node, &token));
        let err = stderr(&o);
        assert!(trace_diff(&single, &out).starts_with("IDENTICAL"), "{name}: {err}");
        let down = format!("node 0 ({node}) is down, its experts are computed elsewhere: layer");
        assert!(err.contains(&down), "{name}: {err}");
        assert!(err.contains(&format!("the answer holds {what}")), "{name}: {err}");
    }
}

/// With `--audit 1` every output a node sends is recomputed here: a node answering zeros or 3e38 —
/// finite, so not refused as NaN is — is caught at its first answer, marked down for good, and the text is
/// the single machine's.
#[test]
fn a_full_audit_catches_finite_lies_at_once() {
    let Setup { dir, m, token, single } = setup();
    for (name, lie) in [("zeros", Lie::Zeros), ("huge", Lie::Huge)] {
        let node = liar(&m, lie);
        let out = dir.path().join(format!("{name}.trace"));
        let mut args = cluster_args(&node, &token);
        args.extend(["--audit", "1"]);
        let o = trace(&m, &out, &args);
        let err = stderr(&o);
        assert!(trace_diff(&single, &out).starts_with("IDENTICAL"), "{name}: {err}");
        assert_eq!(err.matches("is faulty or lying").count(), 1, "{name}: {err}");
        assert!(!err.contains("is back"), "a lying node was taken back: {err}");
    }
}

/// With `--audit 0.01`, a node that flips one bit of one output in 1,000 is caught — each bad output is
/// audited with probability 1/100, and the run sends about 1,340,000 outputs (1,340 bad ones): the chance
/// that none is audited is 0.99^1340 ≈ 1.4e-6 — named with its layer and expert, marked down and never
/// used again. The outputs sent before it was caught and not audited are in the result: the perplexity is
/// within a hair of the single machine's, not its bits.
#[test]
fn an_audit_catches_one_flipped_bit_in_a_thousand_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let m = fixture("qwen3moe/q8_0.gguf");
    let token = token_file(dir.path());
    let text = dir.path().join("text.txt");
    let heldout =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/demo/heldout.txt")).unwrap();
    std::fs::write(&text, heldout.repeat(40)).unwrap();
    let perplexity = |extra: &[&str]| {
        let o = titan()
            .args(["perplexity", "-t", "1", "-m"])
            .arg(&m)
            .arg("-f")
            .arg(&text)
            .args(extra)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        let value: f64 = out
            .lines()
            .find_map(|l| l.strip_prefix("perplexity: "))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no perplexity in {out}"));
        (value, stderr(&o))
    };
    let (single, _) = perplexity(&[]);
    let node = liar(&m, Lie::FlipOneIn { every: 1000 });
    let mut args = cluster_args(&node, &token);
    args.extend(["--audit", "0.01"]);
    let (value, err) = perplexity(&args);
    let caught = err
        .lines()
        .find(|l| l.contains("is faulty or lying and takes no more work"))
        .unwrap_or_else(|| panic!("the lying node was not caught: {err}"));
    assert!(
        caught.contains(&format!("node 0 ({node})"))
            && caught.contains("its output of expert")
            && caught.contains("of layer"),
        "{caught}"
    );
    assert!(!err.contains("is back"), "a lying node was taken back: {err}");
    assert!(err.contains("of which differed: 1\n"), "{err}");
    assert!(
        (value - single).abs() <= single * 1e-3,
        "perplexity {value} against {single} here"
    );
}

/// What an impostor listening at a node's address received.
#[derive(Default)]
struct Seen {
    bytes: Vec<u8>,
    kinds: Vec<u8>,
    connections: usize,
}

/// An impostor at `addr` (a dead node's): it answers every hello with a challenge whose proof it had to
/// guess, as one without the token must, and keeps every byte it is sent.
fn impostor(addr: &str) -> Arc<Mutex<Seen>> {
    let start = Instant::now();
    let listener = loop {
        match TcpListener::bind(addr) {
            Ok(l) => break l,
            Err(e) if start.elapsed() < Duration::from_secs(10) => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("binding the dead node's address {addr}: {e}"),
        }
    };
    let seen = Arc::new(Mutex::new(Seen::default()));
    let record = seen.clone();
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(mut s) = s else { return };
            record.lock().unwrap().connections += 1;
            s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            let mut guessed = true;
            loop {
                let mut frame = vec![0u8; HEADER_LEN];
                if s.read_exact(&mut frame).is_err() {
                    break;
                }
                let len = u32::from_le_bytes(frame[16..20].try_into().unwrap()) as usize;
                frame.resize(HEADER_LEN + len.min(1 << 20) + TAG_LEN, 0);
                let whole = s.read_exact(&mut frame[HEADER_LEN..]).is_ok();
                let mut seen = record.lock().unwrap();
                seen.kinds.push(frame[5]);
                seen.bytes.extend_from_slice(&frame);
                drop(seen);
                if !whole {
                    break;
                }
                if std::mem::take(&mut guessed) {
                    let body = serde_json::json!({ "nonce": "ab".repeat(32), "proof": "cd".repeat(32) }).to_string();
                    let _ = write_frame(&mut s, Kind::Challenge, 0, body.as_bytes(), &mut Vec::new());
                }
            }
        }
    });
    seen
}

/// The node behind a long generation dies and an impostor takes its port: the backbone asks it to prove
/// that it knows the token, it cannot, and it gets nothing — neither the token nor a single row — while
/// the text stays the single machine's.
#[test]
fn an_impostor_on_a_dead_nodes_port_gets_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let m = fixture("qwen3moe/q8_0.gguf");
    let args = [
        "run",
        "-p",
        "Hello",
        "-n",
        "12000",
        "-c",
        "16384",
        "--allow-long-context",
        "--temp",
        "0",
        "--threads",
        "1",
    ];
    let single = titan().args(args).arg("-m").arg(&m).output().unwrap();
    assert!(single.status.success(), "{}", stderr(&single));
    let mut worker = Worker::start(&m, dir.path(), "w0", "127.0.0.1:0");
    let addr = worker.addr.clone();
    let mut run = titan()
        .args(args)
        .arg("-m")
        .arg(&m)
        .args([
            "--nodes",
            &addr,
            "--token-file",
            token_file(dir.path()).to_str().unwrap(),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = run.stdout.take().unwrap();
    let mut text = read_at_least(&mut stdout, 64);
    worker.child.kill().unwrap();
    worker.child.wait().unwrap();
    let seen = impostor(&addr);
    // The backbone dials a down node every second; the run is long enough for several.
    stdout.read_to_end(&mut text).unwrap();
    let o = run.wait_with_output().unwrap();
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert_eq!(String::from_utf8_lossy(&text), String::from_utf8_lossy(&single.stdout));
    let seen = seen.lock().unwrap();
    assert!(seen.connections > 0, "the backbone never dialled the impostor: {err}");
    assert!(
        err.contains(&format!(
            "node 0 ({addr}) answers but is not taken back: the node did not prove that it knows the token"
        )),
        "{err}"
    );
    assert!(!err.contains("is back"), "{err}");
    assert!(
        seen.kinds.iter().all(|&k| k == Kind::Hello as u8),
        "the impostor was sent frames of kinds {:?}",
        seen.kinds
    );
    assert!(
        !seen.bytes.windows(TOKEN.len()).any(|w| w == TOKEN.as_bytes()),
        "the token reached the impostor"
    );
}

/// A relay between the backbone and a node that alters one bit of an answer, or replays an earlier
/// answer in place of a later one, is caught by the frame's MAC: the node is marked down, its share
/// computed here, and the text is the single machine's.
#[test]
fn a_frame_altered_or_replayed_on_the_way_is_caught() {
    let Setup { dir, m, token, single } = setup();
    let w = Worker::start(&m, dir.path(), "w", "127.0.0.1:0");
    for (name, tamper) in [
        ("altered", Tamper::Alter { nth: 3 }),
        ("replayed", Tamper::Replay { nth: 3 }),
    ] {
        let relay = Relay::start(&w.addr, tamper);
        let out = dir.path().join(format!("{name}.trace"));
        let o = trace(&m, &out, &cluster_args(&relay.addr, &token));
        let err = stderr(&o);
        assert!(relay.tampered(), "{name}: the relay saw too few answers: {err}");
        assert!(trace_diff(&single, &out).starts_with("IDENTICAL"), "{name}: {err}");
        assert!(
            err.contains("a frame failed its authentication (altered, replayed or injected on the way)"),
            "{name}: {err}"
        );
    }
}

/// A node whose answer trickles in a byte a second costs the backbone one `--node-timeout` (the whole
/// frame is due by then, however it arrives), not a second per byte.
#[test]
fn a_trickling_answer_costs_one_node_timeout() {
    let Setup { dir, m, token, single } = setup();
    let w = Worker::start(&m, dir.path(), "w", "127.0.0.1:0");
    let relay = Relay::start(&w.addr, Tamper::Trickle { nth: 2 });
    let out = dir.path().join("trickled.trace");
    let mut args = cluster_args(&relay.addr, &token);
    args.extend(["--node-timeout", "2000"]);
    let start = Instant::now();
    let o = trace(&m, &out, &args);
    let took = start.elapsed();
    let err = stderr(&o);
    assert!(relay.tampered(), "{err}");
    assert!(trace_diff(&single, &out).starts_with("IDENTICAL"), "{err}");
    assert!(err.contains("no answer within the deadline (2s)"), "{err}");
    // One timeout of 2 s, plus the run itself (well under a second here); a deadline restarted by every
    // byte would hold it for as long as the frame trickles (hours).
    assert!(took < Duration::from_secs(15), "the run took {took:?}");
}

/// Twenty connections that each send a hello byte every 4 s hold at most the node's handshake slots
/// (those past them are closed at once), are all closed by the hello's whole-frame limit (10 s from its
/// first byte, however it trickles), and the node serves a backbone afterwards.
#[test]
fn trickling_hellos_are_bounded_and_closed() {
    let dir = tempfile::tempdir().unwrap();
    let m = fixture("qwen3moe/q8_0.gguf");
    let w = Worker::start(&m, dir.path(), "w", "127.0.0.1:0");
    let threads = || {
        let status = std::fs::read_to_string(format!("/proc/{}/status", w.child.id())).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("Threads:"))
            .and_then(|v| v.trim().parse::<usize>().ok())
    };
    let before = threads();
    let hello = [b'T', b'T', b'N', b'F', titan_net::VERSION, Kind::Hello as u8];
    let mut conns: Vec<TcpStream> = (0..20).map(|_| TcpStream::connect(&w.addr).unwrap()).collect();
    for c in &conns {
        c.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
    }
    let start = Instant::now();
    let mut closed_at: Vec<Option<Duration>> = vec![None; conns.len()];
    let (mut most, mut sent) = (0, 0);
    while closed_at.iter().any(Option::is_none) && start.elapsed() < Duration::from_secs(30) {
        let byte = (start.elapsed().as_secs() / 4) as usize;
        for (c, at) in conns.iter_mut().zip(closed_at.iter_mut()) {
            if at.is_some() {
                continue;
            }
            if byte >= sent && byte < hello.len() && c.write_all(&hello[byte..byte + 1]).is_err() {
                *at = Some(start.elapsed());
                continue;
            }
            // A read that returns 0 or fails otherwise than by timing out: the node closed it.
            match c.read(&mut [0u8; 64]) {
                Ok(0) => *at = Some(start.elapsed()),
                Err(e) if !matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                    *at = Some(start.elapsed())
                }
                _ => {}
            }
        }
        sent = sent.max(byte + 1);
        if let (Some(b), Some(now)) = (before, threads()) {
            most = most.max(now.saturating_sub(b));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut closed: Vec<Duration> = closed_at
        .iter()
        .map(|t| t.unwrap_or_else(|| panic!("connections still open after 30 s: {closed_at:?}")))
        .collect();
    closed.sort_unstable();
    // Four past the 16 slots closed at once; the rest when their hello's 10 s are up.
    assert!(closed[3] < Duration::from_secs(2), "{closed:?}");
    assert!(closed[4] > Duration::from_secs(9), "{closed:?}");
    assert!(closed[19] < Duration::from_secs(13), "{closed:?}");
    assert!(
        most <= 16,
        "{most} threads held by connections that never finished a hello"
    );
    let single = dir.path().join("single.trace");
    trace(&m, &single, &[]);
    let out = dir.path().join("after.trace");
    trace(
        &m,
        &out,
        &[
            "--nodes",
            &w.addr,
            "--token-file",
            token_file(dir.path()).to_str().unwrap(),
        ],
    );
    assert!(trace_diff(&single, &out).starts_with("IDENTICAL"));
}

/// A node whose copy of the model has one damaged byte in a dense weight (its disk rotted; the header,
/// and so the model's identity, is intact) answers its rows of that product wrong: `--audit 1` recomputes
/// every row a node sends, catches it at once, names the product, and the text is the single machine's.
#[test]
fn an_audit_catches_a_node_with_a_damaged_dense_weight() {
    let dir = tempfile::tempdir().unwrap();
    let m = fixture("qwen3moe/q8_0.gguf");
    let copy = dir.path().join("q8_0.gguf");
    std::fs::copy(&m, &copy).unwrap();
    let (at, start) = {
        let file = titan_gguf::GgufFile::open(&copy).unwrap();
        let t = file
            .tensor("blk.0.attn_q.weight")
            .expect("the fixture has blk.0.attn_q.weight");
        // In the last row (rows are cut backbone first, so the last is a node's): Q8_0 blocks are a 2-byte
        // scale, then 32 one-byte values; byte 10 of the last block is a value.
        (
            file.data_offset + t.offset + t.size - 34 + 10,
            file.data_offset + t.offset,
        )
    };
    let mut bytes = std::fs::read(&copy).unwrap();
    bytes[at as usize] ^= 0x40;
    std::fs::write(&copy, bytes).unwrap();
    let token = token_file(dir.path());
    let w = Worker::start(&copy, dir.path(), "w", "127.0.0.1:0");
    let single = dir.path().join("single.trace");
    trace(&m, &single, &[]);
    let out = dir.path().join("audited.trace");
    let o = trace(
        &m,
        &out,
        &[
            "--nodes",
            &w.addr,
            "--token-file",
            token.to_str().unwrap(),
            "--audit",
            "1",
        ],
    );
    let err = stderr(&o);
    assert!(trace_diff(&single, &out).starts_with("IDENTICAL"), "{err}");
    let caught = err
        .lines()
        .find(|l| l.contains("is faulty or lying and takes no more work"))
        .unwrap_or_else(|| panic!("the damaged node was not caught: {err}"));
    assert!(
        caught.contains("its rows of the dense product at file offset"),
        "{caught}"
    );
    let offset: u64 = caught
        .rsplit("file offset ")
        .next()
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no offset in {caught}"));
    assert!(
        offset >= start && offset <= at,
        "offset {offset}: the product starts at {start}, the damage is at {at}"
    );
}

/// The frames' bodies of `kind` in `bytes` (a stream of frames as a relay heard them).
fn bodies(bytes: &[u8], kind: Kind) -> Vec<Vec<u8>> {
    let (mut at, mut out) = (0, Vec::new());
    while at + HEADER_LEN <= bytes.len() {
        let len = u32::from_le_bytes(bytes[at + 16..at + 20].try_into().unwrap()) as usize;
        if bytes[at + 5] == kind as u8 {
            out.push(bytes[at + HEADER_LEN..at + HEADER_LEN + len].to_vec());
        }
        at += HEADER_LEN + len + TAG_LEN;
    }
    out
}

/// With `--encrypt` on both ends, an eavesdropper between backbone and node hears none of the activations
/// it hears in the clear without it (the same run, so the same answers), the text is the single machine's,
/// and a bit flipped on the way is still caught. A node that requires encryption refuses a backbone without
/// it, saying why.
#[test]
fn encrypted_connections_show_no_activation() {
    let Setup { dir, m, token, single } = setup();
    let plain = Worker::start(&m, dir.path(), "plain", "127.0.0.1:0");
    let sealed = Worker::start_with_args("-m", &m, dir.path(), "sealed", "127.0.0.1:0", &["--encrypt"]);
    let mut heard = Vec::new();
    for (name, w, extra) in [("clear", &plain, &[][..]), ("encrypted", &sealed, &["--encrypt"][..])] {
        let relay = Relay::start(&w.addr, Tamper::Record);
        let out = dir.path().join(format!("{name}.trace"));
        let mut args = cluster_args(&relay.addr, &token);
        args.extend(extra);
        let o = trace(&m, &out, &args);
        assert!(
            trace_diff(&single, &out).starts_with("IDENTICAL"),
            "{name}: {}",
            stderr(&o)
        );
        heard.push(relay.heard());
    }
    let answers = bodies(&heard[0], Kind::Output);
    assert!(
        answers.len() > 4,
        "the relay heard {} answers in the clear",
        answers.len()
    );
    for (i, answer) in answers.iter().enumerate() {
        for window in answer.chunks_exact(32) {
            assert!(
                !heard[1].windows(32).any(|w| w == window),
                "32 bytes of answer {i} in the clear were heard on the encrypted connection"
            );
        }
    }
    // Tampering is caught under encryption as under MACs alone.
    let relay = Relay::start(&sealed.addr, Tamper::Alter { nth: 3 });
    let out = dir.path().join("altered.trace");
    let mut args = cluster_args(&relay.addr, &token);
    args.push("--encrypt");
    let o = trace(&m, &out, &args);
    assert!(relay.tampered());
    assert!(trace_diff(&single, &out).starts_with("IDENTICAL"));
    assert!(
        stderr(&o).contains("a frame failed its authentication"),
        "{}",
        stderr(&o)
    );
    // A backbone without --encrypt is refused by a node that requires it.
    let o = titan()
        .args([
            "run",
            "-p",
            "Hi",
            "-n",
            "2",
            "--nodes",
            &sealed.addr,
            "--token-file",
            token.to_str().unwrap(),
            "-m",
        ])
        .arg(&m)
        .output()
        .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("this node accepts only encrypted connections: give the backbone --encrypt"),
        "{err}"
    );
}
