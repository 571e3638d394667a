//! The cluster with real processes and real sockets on loopback: `titan worker`s started as child
//! processes, a backbone (`titan trace` / `titan run --nodes`), and `titan trace-diff` as the judge.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use titan_cluster::auth;
use titan_net::{read_frame, write_frame, Deadline, Kind, Session, Side};

mod common;
use common::*;

#[test]
fn any_node_count_and_placement_gives_the_single_node_trace() {
    for model in [
        "qwen3moe/q8_0.gguf",
        "olmoe/q4_0.gguf",
        "qwen3moe-k/q4_k_m.gguf",
        "qwen2moe/q8_0.gguf",
        "qwen3next-mtp/q8_0.gguf", // qwen3next's model, with an MTP block the nodes never serve
        "qwen35moe-k/q4_k_m.gguf",
        "deepseek3/q8_0.gguf",
        "deepseek2-lite/q4_0.gguf",
        "mixtral/q4_1.gguf",
        "gpt-oss/mxfp4_moe.gguf",
        "qwen35/q8_0.gguf",
        "glm4moe/q8_0.gguf",
        "minimax-m2/q4_0.gguf",
        "llama4/q8_0.gguf",
        "deepseek4/mxfp4_moe.gguf",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let m = fixture(model);
        let single = dir.path().join("single.trace");
        trace(&m, &single, &[]);
        let workers: Vec<Worker> = (0..4)
            .map(|i| Worker::start(&m, dir.path(), &format!("w{i}"), "127.0.0.1:0"))
            .collect();
        let token = token_file(dir.path());
        // A routing profile, for the placement that gives the hottest experts a second node.
        let profile = dir.path().join("profile.json");
        let o = titan()
            .args([
                "profile",
                "-p",
                "Hello world, this is a longer text to route",
                "-n",
                "8",
                "--temp",
                "0",
                "-m",
            ])
            .arg(&m)
            .arg("-o")
            .arg(&profile)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        for n in 1..=4 {
            let nodes = workers[..n]
                .iter()
                .map(|w| w.addr.as_str())
                .collect::<Vec<_>>()
                .join(",");
            let replicas = n.min(2).to_string();
            let placements = [
                ["--placement", "contiguous", "--replicas", "1"],
                ["--placement", "interleaved", "--replicas", replicas.as_str()],
                [
                    "--placement",
                    "contiguous",
                    "--replicate-hot",
                    profile.to_str().unwrap(),
                ],
            ];
            for (p, placement) in placements.into_iter().enumerate() {
                let out = dir.path().join(format!("n{n}-{p}.trace"));
                let mut args = vec!["--nodes", nodes.as_str(), "--token-file", token.to_str().unwrap()];
                args.extend(placement);
                let o = trace(&m, &out, &args);
                assert!(stderr(&o).contains("cluster plan"), "{}", stderr(&o));
                let verdict = trace_diff(&single, &out);
                assert!(
                    verdict.starts_with("IDENTICAL"),
                    "{model}, {n} workers, {placement:?}: {verdict}"
                );
            }
        }
        // Every worker computed experts (the backbone did not quietly compute everything itself).
        for w in &workers {
            assert!(requests_served(&w.log()) > 0, "{model}: {}", w.log());
        }
    }
}

#[test]
fn a_worker_killed_mid_generation_changes_no_byte_and_is_used_again_when_back() {
    let dir = tempfile::tempdir().unwrap();
    let m = fixture("qwen3moe/q8_0.gguf");
    let (single, mut workers, mut run) = long_run_on_workers(&m, dir.path(), 3, "4000", &[]);
    let mut stdout = run.stdout.take().unwrap();
    let mut text = read_at_least(&mut stdout, 64);
    // SIGKILL: no goodbye, the socket just dies. Where the kernel shows sockets' queues (Linux), the worker is
    // first stopped at a moment a request from the backbone lies unread in its socket: closing a socket with
    // unread bytes resets the connection, so the backbone, waiting for the answer, reads an OS error (the
    // reset) rather than a clean close, and the test sees how that error is reported.
    let addr = workers[1].addr.clone();
    let pid = workers[1].child.id() as i32;
    let port = addr.rsplit(':').next().unwrap().parse::<u16>().unwrap();
    let mut reset = false;
    for _ in 0..50 {
        // SAFETY: `kill` takes plain integers and touches no memory of ours. The pid is our own child's, not
        // yet waited for: even had it exited, the pid stays reserved to it until we wait, so it names no other
        // process.
        unsafe { libc::kill(pid, libc::SIGSTOP) };
        std::thread::sleep(Duration::from_millis(200));
        match unread_bytes_at(port) {
            None => break,
            Some(0) => {
                // Stopped while computing (the request already read): let it answer, and stop it again.
                // SAFETY: as above.
                unsafe { libc::kill(pid, libc::SIGCONT) };
                std::thread::sleep(Duration::from_millis(20));
            }
            Some(_) => {
                reset = true;
                break;
            }
        }
    }
    // SAFETY: as above: the pid is still our own child's, not yet waited for.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let _ = workers[1].child.wait();
    // A new worker on the same address is picked up again.
    workers[1] = Worker::start(&m, dir.path(), "w1-again", &addr);
    stdout.read_to_end(&mut text).unwrap();
    let o = run.wait_with_output().unwrap();
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert_eq!(
        String::from_utf8_lossy(&text),
        String::from_utf8_lossy(&single),
        "the cluster's text differs after a node died"
    );
    let down = err
        .lines()
        .find(|l| l.contains(&format!("node 1 ({addr}) is down")))
        .unwrap_or_else(|| panic!("node 1 was not reported down: {err}"));
    // The reason names the OS error once: the error that wraps it does not repeat it.
    if reset {
        assert_eq!(down.matches("(os error").count(), 1, "{down}");
    }
    assert!(down.matches("(os error").count() <= 1, "{down}");
    assert!(err.contains(&format!("node 1 ({addr}) is back")), "{err}");
    let line = err
        .lines()
        .find(|l| l.trim_start().starts_with(&addr))
        .unwrap_or_else(|| panic!("no report for {addr}: {err}"));
    assert!(!line.contains(" 0 failovers"), "the kill came after the run: {line}");
}

/// A node that is not up when the backbone starts costs nothing but its share of the work: the backbone
/// computes it meanwhile, takes the node in when it comes, and the text is the single machine's.
#[test]
fn a_node_down_at_start_is_taken_in_when_it_comes() {
    let dir = tempfile::tempdir().unwrap();
    let m = fixture("qwen3moe/q8_0.gguf");
    let token = token_file(dir.path());
    // An address nobody listens on yet: bound and let go, so the port is free and refuses connections.
    let late = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    let up = Worker::start(&m, dir.path(), "w0", "127.0.0.1:0");
    // Long enough for the late worker to start (the model, its speed probe) and be dialled again (every
    // second) before the end, on a loaded machine too: 3,000 tokens took one second in a CI run, too short.
    let args = [
        "run",
        "-p",
        "Hello",
        "-n",
        "12000",
        "-c",
        "12288",
        "--allow-long-context",
        "--temp",
        "0",
        "--threads",
        "1",
    ];
    let single = titan().args(args).arg("-m").arg(&m).output().unwrap();
    assert!(single.status.success(), "{}", stderr(&single));
    let mut run = titan()
        .args(args)
        .arg("-m")
        .arg(&m)
        .args([
            "--nodes",
            &format!("{},{late}", up.addr),
            "--token-file",
            token.to_str().unwrap(),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = run.stdout.take().unwrap();
    let mut text = read_at_least(&mut stdout, 64);
    let joined = Worker::start(&m, dir.path(), "w1", &late);
    stdout.read_to_end(&mut text).unwrap();
    let o = run.wait_with_output().unwrap();
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert_eq!(String::from_utf8_lossy(&text), String::from_utf8_lossy(&single.stdout));
    assert!(err.contains(&format!("node 1 ({late}) is not up")), "{err}");
    assert!(err.contains(&format!("node 1 ({late}) is up: it joins now")), "{err}");
    assert!(
        requests_served(&joined.log()) > 0,
        "the late node served nothing: {}",
        joined.log()
    );
    drop(up);
}

/// The bytes received and not yet read by the process on the loopback TCP connections whose local port is
/// `port` (a worker's accepted connections), from /proc/net/tcp; `None` where the kernel does not show them.
fn unread_bytes_at(port: u16) -> Option<u64> {
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    let local = format!(":{port:04X}");
    Some(
        table
            .lines()
            .skip(1)
            .filter_map(|line| {
                let f: Vec<&str> = line.split_whitespace().collect();
                // local_address, rem_address, st (01: established), tx_queue:rx_queue
                (f.len() > 4 && f[1].ends_with(&local) && f[3] == "01")
                    .then(|| u64::from_str_radix(f[4].split(':').nth(1)?, 16).ok())
                    .flatten()
            })
            .sum(),
    )
}

#[test]
fn a_wrong_token_is_refused_and_the_node_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let m = fixture("qwen3moe/q8_0.gguf");
    let w = Worker::start(&m, dir.path(), "w", "127.0.0.1:0");
    let wrong = dir.path().join("wrong.token");
    std::fs::write(&wrong, "not-the-token-0123456789").unwrap();
    let o = titan()
        .args([
            "run",
            "-p",
            "Hi",
            "-n",
            "2",
            "--nodes",
            &w.addr,
            "--token-file",
            wrong.to_str().unwrap(),
            "-m",
        ])
        .arg(&m)
        .output()
        .unwrap();
    // The backbone checks the node's proof first: with another token, it is the node that cannot prove it.
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("did not prove that it knows the token") && !err.contains("panicked"),
        "{err}"
    );
    // A backbone whose own proof is wrong is refused by the node, which says why and keeps serving.
    let (mut s, _, _) = handshake(&w.addr, &m, Some([7u8; 32]));
    let mut reply = Vec::new();
    let h = read_frame(&mut s, 1 << 20, &mut reply).unwrap();
    assert_eq!(h.kind, Kind::Error);
    assert_eq!(String::from_utf8_lossy(&reply), "wrong node token");
    let log = w.log_with("refused: wrong node token");
    assert!(log.contains("refused: wrong node token"), "{log}");
    let single = dir.path().join("single.trace");
    trace(&m, &single, &[]);
    let out = dir.path().join("cluster.trace");
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

/// Connects and runs the handshake a backbone runs, with the right token (or, with `proof`, the proof given),
/// as `titan_cluster::auth` defines it; the stream and its session.
fn handshake(addr: &str, model: &Path, proof: Option<[u8; 32]>) -> (TcpStream, Session, String) {
    let model = titan_layout::ModelIdentity::of(&titan_gguf::GgufFile::open(model).unwrap())
        .unwrap()
        .to_string();
    let keys = auth::Keys::new(TOKEN.as_bytes());
    let nonce = auth::nonce().unwrap();
    let mut s = TcpStream::connect(addr).unwrap();
    let body = serde_json::json!({ "model": model, "nonce": auth::hex(&nonce) }).to_string();
    write_frame(&mut s, Kind::Hello, 0, body.as_bytes(), &mut Vec::new()).unwrap();
    let mut reply = Vec::new();
    let h = read_frame(&mut s, 1 << 20, &mut reply).unwrap();
    assert_eq!(h.kind, Kind::Challenge, "{}", String::from_utf8_lossy(&reply));
    let challenge: serde_json::Value = serde_json::from_slice(&reply).unwrap();
    let theirs = auth::unhex(challenge["nonce"].as_str().unwrap()).unwrap();
    let node_proof = auth::unhex(challenge["proof"].as_str().unwrap()).unwrap();
    assert!(
        auth::same(&node_proof, &keys.node_proof(&nonce, &theirs, &model, false)),
        "the node's proof"
    );
    let ours = proof.unwrap_or_else(|| keys.backbone_proof(&nonce, &theirs, &model, false));
    let body = serde_json::json!({ "proof": auth::hex(&ours) }).to_string();
    write_frame(&mut s, Kind::Proof, 0, body.as_bytes(), &mut Vec::new()).unwrap();
    let session = Session::new(keys.session_key(&nonce, &theirs, &model, false), Side::Backbone);
    (s, session, model)
}

/// A backbone's connection to `addr`, handshake done and the welcome read.
fn hello(addr: &str, model: &Path) -> (TcpStream, Session) {
    let (mut s, mut session, _) = handshake(addr, model, None);
    let mut reply = Vec::new();
    let h = session.read(&mut s, 1 << 20, &mut reply, Deadline::None).unwrap();
    assert_eq!(h.kind, Kind::Welcome, "{}", String::from_utf8_lossy(&reply));
    (s, session)
}

/// True once the peer has closed `s` (a read returns 0 or an error) within `limit`.
fn closed_within(s: &mut TcpStream, limit: Duration) -> bool {
    s.set_read_timeout(Some(limit)).unwrap();
    let start = Instant::now();
    let mut buf = [0u8; 4096];
    while start.elapsed() < limit {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return true,
            Ok(_) => {}
        }
    }
    false
}

#[test]
fn oversized_and_malformed_frames_close_only_their_connection() {
    let dir = tempfile::tempdir().unwrap();
    let m = fixture("qwen3moe/q8_0.gguf");
    let w = Worker::start(&m, dir.path(), "w", "127.0.0.1:0");

    // A frame declaring 2 GiB (the worker's limit is 1 MiB): refused before anything is allocated.
    let (mut s, _) = hello(&w.addr, &m);
    let mut head = titan_net::frame::encode_header(&titan_net::FrameHeader {
        kind: Kind::Compute,
        id: 1,
        len: 0,
    });
    head[16..20].copy_from_slice(&(2u32 << 30).to_le_bytes());
    s.write_all(&head).unwrap();
    assert!(
        closed_within(&mut s, Duration::from_secs(10)),
        "oversized frame: connection left open"
    );

    // Garbage instead of a hello.
    let mut s = TcpStream::connect(&w.addr).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    assert!(
        closed_within(&mut s, Duration::from_secs(10)),
        "garbage: connection left open"
    );

    // A well-framed compute request naming an expert that does not exist.
    let (mut s, mut session) = hello(&w.addr, &m);
    let mut body = Vec::new();
    titan_net::PayloadWriter(&mut body)
        .u32(0)
        .u32(8)
        .u32(64)
        .u32(0)
        .u32(1)
        .u32(99)
        .u32(0);
    session.write(&mut s, Kind::Compute, 2, &body, &mut Vec::new()).unwrap();
    let mut reply = Vec::new();
    let h = session.read(&mut s, 1 << 20, &mut reply, Deadline::None).unwrap();
    assert_eq!(h.kind, Kind::Error);
    assert!(
        String::from_utf8_lossy(&reply).contains("expert 99"),
        "{}",
        String::from_utf8_lossy(&reply)
    );

    // Each reason is in the worker's log, and the worker still serves a real backbone.
    for needle in ["exceeds the limit", "not a TITAN frame", "expert 99"] {
        let log = w.log_with(needle);
        assert!(log.contains(needle), "{log}");
    }
    let single = dir.path().join("single.trace");
    trace(&m, &single, &[]);
    let out = dir.path().join("cluster.trace");
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
    assert!(!w.log().contains("panicked"), "{}", w.log());
}

/// Writes the shard of `layers` × `experts` of `model` into `dir`.
fn slice(model: &Path, layers: &str, experts: &str, dir: &Path) -> PathBuf {
    let out = dir.join(format!("shard-{layers}-{experts}.gguf"));
    let o = titan()
        .arg("slice")
        .arg(model)
        .args(["--layers", layers, "--experts", experts, "-o"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    out
}

/// A worker serving each shard of `m` cut as (layers, experts), in order.
fn shard_workers(m: &Path, cuts: &[(&str, &str)], dir: &Path) -> Vec<Worker> {
    cuts.iter()
        .enumerate()
        .map(|(i, (l, e))| Worker::start_with("--shard", &slice(m, l, e, dir), dir, &format!("w{i}"), "127.0.0.1:0"))
        .collect()
}

#[test]
fn workers_serving_shards_give_the_single_node_trace() {
    for model in [
        "qwen3moe/q8_0.gguf",
        "olmoe/q4_0.gguf",
        "qwen35moe/q4_0.gguf",
        "deepseek3/q4_0.gguf",
        "glm4moe/q4_0.gguf",
        "minimax-m2/q8_0.gguf",
        "deepseek4/mxfp4_moe.gguf",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let m = fixture(model);
        let single = dir.path().join("single.trace");
        trace(&m, &single, &[]);
        let token = token_file(dir.path());
        // Every layer-expert held by exactly one shard, cut along both axes: all MoE layers (DeepSeek's first
        // layer is dense), or the first or second half of them.
        let c = titan_engine::Config::from_gguf(&titan_gguf::GgufFile::open(&m).unwrap()).unwrap();
        let (lo, n) = (c.dense_lead, c.n_layer - c.dense_lead);
        let span = |a: usize, b: usize| {
            if a == b {
                (lo + a).to_string()
            } else {
                format!("{}-{}", lo + a, lo + b)
            }
        };
        let (all, first, second) = (span(0, n - 1), span(0, n / 2 - 1), span(n / 2, n - 1));
        let cuts = [(&all, "0-2"), (&first, "3-7"), (&second, "3-5"), (&second, "6-7")];
        let cuts = cuts.map(|(l, e)| (l.as_str(), e));
        let workers = shard_workers(&m, &cuts, dir.path());
        let nodes = workers.iter().map(|w| w.addr.as_str()).collect::<Vec<_>>().join(",");
        let out = dir.path().join("shards.trace");
        let o = trace(&m, &out, &["--nodes", &nodes, "--token-file", token.to_str().unwrap()]);
        assert!(
            stderr(&o).contains("each node serves the experts of its shard"),
            "{}",
            stderr(&o)
        );
        assert_eq!(
            trace_diff(&single, &out).split(':').next(),
            Some("IDENTICAL"),
            "{model}: {}",
            trace_diff(&single, &out)
        );
        // Experts no shard holds are computed by the backbone.
        let out = dir.path().join("partial.trace");
        let o = trace(
            &m,
            &out,
            &["--nodes", &workers[0].addr, "--token-file", token.to_str().unwrap()],
        );
        assert!(
            stderr(&o).contains(&format!(
                "backbone: computes the {} layer × expert pairs no node holds",
                5 * n
            )),
            "{}",
            stderr(&o)
        );
        assert!(
            trace_diff(&single, &out).starts_with("IDENTICAL"),
            "{model}: {}",
            trace_diff(&single, &out)
        );
        // Every worker was connected; together they computed (a shard whose experts no token chose
        // serves nothing, rightly).
        let served: u64 = workers.iter().map(|w| requests_served(&w.log_with("requests)"))).sum();
        assert!(served > 0, "{model}: no worker computed anything");
    }
}

#[test]
fn a_damaged_shard_is_refused_naming_the_expert() {
    let dir = tempfile::tempdir().unwrap();
    let shard = slice(&fixture("qwen3moe/q8_0.gguf"), "0-1", "4-7", dir.path());
    let mut bytes = std::fs::read(&shard).unwrap();
    let n = bytes.len();
    bytes[n - 40] ^= 0x10; // inside the last tensor: layer 1's down projection of expert 7
    std::fs::write(&shard, &bytes).unwrap();
    let o = titan()
        .args(["worker", "--listen", "127.0.0.1:0", "--token-file"])
        .arg(token_file(dir.path()))
        .arg("--shard")
        .arg(&shard)
        .output()
        .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("expert 7 of layer 1 failed its digest check") && err.contains(&shard.display().to_string()),
        "{err}"
    );
    // Cut short: a clean error too.
    std::fs::write(&shard, &bytes[..n / 2]).unwrap();
    let o = titan()
        .args(["worker", "--listen", "127.0.0.1:0", "--token-file"])
        .arg(token_file(dir.path()))
        .arg("--shard")
        .arg(&shard)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("past the end of the file") && !stderr(&o).contains("panicked"),
        "{}",
        stderr(&o)
    );
}

/// gpt-oss's experts carry bias rows, which its shards carry with the matrices: two workers serving shards
/// cut along both axes (one holds every layer × experts 0-3, the other two shards of experts 4-7) give the
/// single-node trace, with MXFP4 experts and with Q8_0.
#[test]
fn workers_serving_gpt_oss_shards_give_the_single_node_trace() {
    for model in ["gpt-oss/mxfp4_moe.gguf", "gpt-oss/q8_0.gguf"] {
        let dir = tempfile::tempdir().unwrap();
        let m = fixture(model);
        let single = dir.path().join("single.trace");
        trace(&m, &single, &[]);
        let token = token_file(dir.path());
        let first = slice(&m, "0-3", "0-3", dir.path());
        let (low, high) = (slice(&m, "0-1", "4-7", dir.path()), slice(&m, "2-3", "4-7", dir.path()));
        let both = PathBuf::from(format!("{},{}", low.display(), high.display()));
        let workers = [
            Worker::start_with("--shard", &first, dir.path(), "w0", "127.0.0.1:0"),
            Worker::start_with("--shard", &both, dir.path(), "w1", "127.0.0.1:0"),
        ];
        let nodes = format!("{},{}", workers[0].addr, workers[1].addr);
        let out = dir.path().join("shards.trace");
        let o = trace(&m, &out, &["--nodes", &nodes, "--token-file", token.to_str().unwrap()]);
        assert!(
            stderr(&o).contains("each node serves the experts of its shard"),
            "{}",
            stderr(&o)
        );
        assert_eq!(
            trace_diff(&single, &out).split(':').next(),
            Some("IDENTICAL"),
            "{model}: {}",
            trace_diff(&single, &out)
        );
        for w in &workers {
            let log = w.log_with("requests)");
            assert!(requests_served(&log) > 0 && !log.contains("panicked"), "{model}: {log}");
        }
    }
}

/// Two workers fetching their gpt-oss shards from the backbone: the assignment's digests, which cover each
/// expert's bias rows, are the shards' own, and the trace is the single node's.
#[test]
fn workers_fetching_gpt_oss_shards_give_the_single_node_trace() {
    fetched_shards_give_the_single_node_trace("gpt-oss/mxfp4_moe.gguf");
}

/// Workers fetching their slices of Llama 4's interleaved layers get shards of its MoE layers only (the
/// dense layers between split them), and the trace is the single node's.
#[test]
fn workers_fetching_interleaved_shards_give_the_single_node_trace() {
    fetched_shards_give_the_single_node_trace("llama4/q8_0.gguf");
}

/// Two workers fetching their shards of `model` from the backbone's slice endpoint: the trace is the single
/// node's, and each downloaded exactly what its cache holds.
fn fetched_shards_give_the_single_node_trace(model: &str) {
    let dir = tempfile::tempdir().unwrap();
    let m = fixture(model);
    let single = dir.path().join("single.trace");
    trace(&m, &single, &[]);
    let nodes = [free_addr(), free_addr()];
    let caches: Vec<PathBuf> = (0..2).map(|i| dir.path().join(format!("cache{i}"))).collect();
    let slices = free_addr();
    let url = format!("http://{slices}");
    let out = dir.path().join("fetched.trace");
    let (_, workers) = trace_serving_slices(&m, &out, &nodes, &slices, dir.path(), || {
        let mut w = fetching_workers(&url, &caches, &nodes, dir.path(), "w");
        wait_listening(&mut w);
        w
    });
    let verdict = trace_diff(&single, &out);
    assert!(verdict.starts_with("IDENTICAL"), "{model}: {verdict}");
    for (w, cache) in workers.iter().zip(&caches) {
        assert!(
            downloaded(w) > 0 && downloaded(w) == dir_bytes(cache),
            "{model}: {}",
            w.log()
        );
    }
}

/// A flipped byte in an expert's bias row fails that expert's digest check, as a flipped matrix byte does.
#[test]
fn a_damaged_bias_is_refused_naming_the_expert() {
    let dir = tempfile::tempdir().unwrap();
    let shard = slice(&fixture("gpt-oss/q8_0.gguf"), "1-2", "2-5", dir.path());
    // Inside expert 4's row (the third the shard holds) of layer 2's up bias.
    let at = {
        let f = titan_gguf::GgufFile::open(&shard).unwrap();
        let t = f.tensor("blk.2.ffn_up_exps.bias").unwrap();
        let row = t.size / t.dims[1];
        (f.data_offset + t.offset + 2 * row + 5) as usize
    };
    let mut bytes = std::fs::read(&shard).unwrap();
    bytes[at] ^= 0x10;
    std::fs::write(&shard, &bytes).unwrap();
    let o = titan()
        .args(["worker", "--listen", "127.0.0.1:0", "--token-file"])
        .arg(token_file(dir.path()))
        .arg("--shard")
        .arg(&shard)
        .output()
        .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("expert 4 of layer 2 failed its digest check") && err.contains(&shard.display().to_string()),
        "{err}"
    );
}

/// llama.cpp's own GGUF reader (gguf-py) must read a shard, and find it byte-equal to the model's slice.
/// Runs with the Python named by TITAN_PYTHON (which has the `gguf` package; `.ci/run` provides one); in
/// CI it must be there.
#[test]
fn shards_load_in_gguf_py() {
    let Ok(python) = std::env::var("TITAN_PYTHON") else {
        assert!(
            std::env::var("CI").is_err(),
            "CI must set TITAN_PYTHON to a python with the gguf package"
        );
        eprintln!("skipped: TITAN_PYTHON (a python with the gguf package) is not set");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let check = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tools/check_shard.py");
    for (model, layers, experts) in [
        ("qwen3moe/q8_0.gguf", "0-1", "2-5"),
        ("qwen3moe-k/q4_k_m.gguf", "0", "0-7"),
        ("mixtral/q4_0.gguf", "1", "7"),
        ("gpt-oss/mxfp4_moe.gguf", "1-2", "3-6"),
        ("gpt-oss/q8_0.gguf", "0", "0-7"),
    ] {
        let m = fixture(model);
        let shard = slice(&m, layers, experts, dir.path());
        let o = Command::new(&python).arg(&check).arg(&shard).arg(&m).output().unwrap();
        assert!(
            o.status.success(),
            "{model}: {}{}",
            String::from_utf8_lossy(&o.stdout),
            stderr(&o)
        );
    }
}

#[test]
fn workers_download_exactly_their_slices_resume_and_refetch_damage() {
    let dir = tempfile::tempdir().unwrap();
    let m = fixture("qwen3moe/q8_0.gguf");
    let single = dir.path().join("single.trace");
    trace(&m, &single, &[]);
    let nodes = [free_addr(), free_addr(), free_addr()];
    let caches: Vec<PathBuf> = (0..3).map(|i| dir.path().join(format!("cache{i}"))).collect();

    // Empty caches: each worker downloads its assignment, exactly, and the trace is the single node's.
    let slices = free_addr();
    let url = format!("http://{slices}");
    let out = dir.path().join("first.trace");
    let (_, workers) = trace_serving_slices(&m, &out, &nodes, &slices, dir.path(), || {
        let mut w = fetching_workers(&url, &caches, &nodes, dir.path(), "first");
        wait_listening(&mut w);
        w
    });
    assert!(
        trace_diff(&single, &out).starts_with("IDENTICAL"),
        "{}",
        trace_diff(&single, &out)
    );
    let model_bytes = std::fs::metadata(&m).unwrap().len();
    let mut total = 0;
    for (w, cache) in workers.iter().zip(&caches) {
        assert_eq!(downloaded(w), dir_bytes(cache), "{}", w.log());
        total += downloaded(w);
    }
    assert!(
        total < model_bytes,
        "the workers together downloaded {total} bytes of a {model_bytes}-byte model"
    );
    drop(workers);

    // Full caches download nothing; a flipped byte is found and only that shard fetched again; a partial
    // download resumes from where it stopped; the workers start before the backbone and wait for it.
    let damaged = std::fs::read_dir(&caches[1]).unwrap().next().unwrap().unwrap().path();
    let mut bytes = std::fs::read(&damaged).unwrap();
    let n = bytes.len();
    bytes[n - 100] ^= 1;
    std::fs::write(&damaged, &bytes).unwrap();
    let whole = std::fs::read_dir(&caches[2]).unwrap().next().unwrap().unwrap().path();
    let full = std::fs::read(&whole).unwrap();
    std::fs::remove_file(&whole).unwrap();
    std::fs::write(whole.with_extension("part"), &full[..full.len() / 2]).unwrap();

    let slices = free_addr();
    let url = format!("http://{slices}");
    let mut early = fetching_workers(&url, &caches, &nodes, dir.path(), "second");
    std::thread::sleep(Duration::from_millis(500));
    let out = dir.path().join("second.trace");
    let (_, workers) = trace_serving_slices(&m, &out, &nodes, &slices, dir.path(), || {
        wait_listening(&mut early);
        early
    });
    assert!(
        trace_diff(&single, &out).starts_with("IDENTICAL"),
        "{}",
        trace_diff(&single, &out)
    );
    assert_eq!(downloaded(&workers[0]), 0, "{}", workers[0].log());
    assert!(
        workers[1].log().contains("cached shard is damaged"),
        "{}",
        workers[1].log()
    );
    assert_eq!(downloaded(&workers[1]), n as u64, "{}", workers[1].log());
    assert_eq!(
        downloaded(&workers[2]),
        (full.len() - full.len() / 2) as u64,
        "{}",
        workers[2].log()
    );
    assert_eq!(std::fs::read(&whole).unwrap(), full, "the resumed shard differs");
    assert!(
        workers[0].log().contains("joining the backbone"),
        "the worker did not wait for the backbone: {}",
        workers[0].log()
    );
}

#[test]
fn the_slice_endpoint_refuses_unsigned_replayed_and_unassigned_requests() {
    let dir = tempfile::tempdir().unwrap();
    let m = fixture("qwen3moe/q8_0.gguf");
    let (slices, node) = (free_addr(), free_addr());
    let token = token_file(dir.path());
    let mut backbone = titan()
        .args(["run", "-p", "Hi", "-n", "2", "--join-timeout", "60", "-m"])
        .arg(&m)
        .args([
            "--nodes",
            &node,
            "--token-file",
            token.to_str().unwrap(),
            "--serve-slices",
            &slices,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    let url = |p: &str| format!("http://{slices}{p}");
    let start = Instant::now();
    let status = |r: Result<ureq::http::Response<ureq::Body>, ureq::Error>| -> (u16, String) {
        let mut r = r.unwrap();
        (r.status().as_u16(), r.body_mut().read_to_string().unwrap())
    };
    // Wait for the endpoint.
    while agent.get(url("/v1/slice")).call().is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the slice endpoint did not come up"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let q = format!("/v1/slice?node={node}&layers=0-1&experts=0-7");
    let keys = auth::Keys::new(TOKEN.as_bytes());
    let wrong = auth::Keys::new(b"wrong-token-0123456789");
    let sign = |keys: &auth::Keys, method: &str, target: &str, body: &[u8]| {
        auth::Signed::new(keys, method, target, body).unwrap().header()
    };
    // Unsigned, the old bearer token, another token's key, a signature of another request: all 401, and
    // nothing of the model in the answer.
    let other = sign(&keys, "GET", "/v1/slice?node=x&layers=0-1&experts=0-7", b"");
    for a in [
        None,
        Some(format!("Bearer {TOKEN}")),
        Some(sign(&wrong, "GET", &q, b"")),
        Some(other),
    ] {
        let mut req = agent.get(url(&q));
        if let Some(a) = &a {
            req = req.header("Authorization", a);
        }
        let (code, body) = status(req.call());
        assert_eq!(code, 401, "{a:?}: {body}");
        assert!(body.len() < 200 && !body.contains("GGUF"), "{body}");
    }
    let join_to = |body: &[u8], keys: &auth::Keys| {
        let signed = auth::Signed::new(keys, "POST", "/v1/join", body).unwrap();
        let mut r = agent
            .post(url("/v1/join"))
            .header("Authorization", &signed.header())
            .content_type("application/json")
            .send(body)
            .unwrap();
        let mac = r.headers().get("x-titan-mac").map(|v| v.to_str().unwrap().to_string());
        let (code, text) = (r.status().as_u16(), r.body_mut().read_to_string().unwrap());
        (code, text, mac, signed.nonce)
    };
    let (code, body, _, _) = join_to(b"{}", &wrong);
    assert_eq!(code, 401, "{body}");
    let (code, body, _, _) = join_to(b"{\"node\": \"127.0.0.1:1\", \"budget\": 1}", &keys);
    assert_eq!(code, 403, "{body}");
    let (code, _, _, _) = join_to(&[b'x'; 20_000], &keys);
    assert_eq!(code, 413, "a 20 kB body was accepted");
    let (code, body) = status(
        agent
            .get(url(&q))
            .header("Authorization", &sign(&keys, "GET", &q, b""))
            .call(),
    );
    assert_eq!(code, 409, "before the plan: {body}");
    // The one node joins: it is assigned everything, with every expert's digest, and the answer's MAC is the
    // token's over its nonce; a range outside the model is refused.
    let join = format!("{{\"node\": \"{node}\", \"budget\": 1}}");
    let (code, body, mac, nonce) = join_to(join.as_bytes(), &keys);
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"shards\":[[[0,1],[0,7]]]"), "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["digests"][0].as_str().unwrap().len(), 64 * 16, "{body}");
    let mac = mac.and_then(|m| auth::unhex(&m)).expect("the answer carries its MAC");
    assert!(auth::same(&mac, &keys.answer_mac(&nonce, body.as_bytes())));
    let outside = format!("/v1/slice?node={node}&layers=0-9&experts=0-7");
    let (code, body) = status(
        agent
            .get(url(&outside))
            .header("Authorization", &sign(&keys, "GET", &outside, b""))
            .call(),
    );
    assert_eq!(code, 400, "{body}");
    // A signed request goes through once; the same bytes again are a replay.
    let signed = sign(&keys, "GET", &q, b"");
    let (code, _) = status(
        agent
            .get(url(&q))
            .header("Authorization", &signed)
            .header("Range", "bytes=10-19")
            .call(),
    );
    assert_eq!(code, 206);
    let (code, body) = status(
        agent
            .get(url(&q))
            .header("Authorization", &signed)
            .header("Range", "bytes=10-19")
            .call(),
    );
    assert_eq!(code, 401, "{body}");
    assert!(body.contains("a replay"), "{body}");
    let _ = backbone.kill();
    let _ = backbone.wait();
}

/// Real dimensions (one layer of OLMoE-1B-7B, `titan synth`, Q4_0 with 2048-wide rows): the shards' and the
/// resident model's Q4_0 weights are regrouped for the SIMD kernels, which the 64-wide fixtures never are.
#[test]
fn shards_of_real_dimensions_give_the_single_node_trace() {
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("olmoe-1l.gguf");
    let o = titan()
        .args([
            "synth",
            "--preset",
            "olmoe-1b-7b",
            "--type",
            "q4_0",
            "--layers",
            "1",
            "--routing-tokens",
            "0",
            "-o",
        ])
        .arg(&m)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let single = dir.path().join("single.trace");
    trace(&m, &single, &[]);
    let shards = [slice(&m, "0", "0-20", dir.path()), slice(&m, "0", "21-63", dir.path())];
    let workers: Vec<Worker> = shards
        .iter()
        .enumerate()
        .map(|(i, s)| Worker::start_with("--shard", s, dir.path(), &format!("w{i}"), "127.0.0.1:0"))
        .collect();
    let nodes = workers.iter().map(|w| w.addr.as_str()).collect::<Vec<_>>().join(",");
    let out = dir.path().join("cluster.trace");
    trace(
        &m,
        &out,
        &[
            "--nodes",
            &nodes,
            "--token-file",
            token_file(dir.path()).to_str().unwrap(),
        ],
    );
    assert!(
        trace_diff(&single, &out).starts_with("IDENTICAL"),
        "{}",
        trace_diff(&single, &out)
    );
}

/// A worker that streams its experts from an expert store through a small budget, and a backbone whose own
/// fallback streams too, give the single-node trace.
#[test]
fn streaming_workers_and_backbone_give_the_single_node_trace() {
    let dir = tempfile::tempdir().unwrap();
    let m = fixture("qwen3moe-k/q4_k_m.gguf");
    let store = dir.path().join("store");
    let o = titan().arg("convert").arg(&m).arg("-o").arg(&store).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let single = dir.path().join("single.trace");
    trace(&m, &single, &[]);
    let token = token_file(dir.path());
    let log = dir.path().join("w.log");
    let mut child = titan()
        .args([
            "worker",
            "--listen",
            "127.0.0.1:0",
            "--threads",
            "1",
            "--expert-budget",
            "1",
            "--token-file",
        ])
        .arg(&token)
        .arg("-m")
        .arg(&m)
        .arg("--store")
        .arg(&store)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let addr = listening_addr(&mut child, "worker");
    let w = Worker { child, addr, log };
    let out = dir.path().join("cluster.trace");
    let args = [
        "--nodes",
        &w.addr,
        "--token-file",
        token.to_str().unwrap(),
        "--store",
        store.to_str().unwrap(),
        "--expert-budget",
        "1",
    ];
    let o = trace(&m, &out, &args);
    assert!(stderr(&o).contains("cluster plan"), "{}", stderr(&o));
    assert!(
        trace_diff(&single, &out).starts_with("IDENTICAL"),
        "{}",
        trace_diff(&single, &out)
    );
    assert!(w.log_with("requests)").contains("requests)"), "{}", w.log());
    assert!(requests_served(&w.log()) > 0, "{}", w.log());
}

/// A worker that hangs (SIGSTOP: its socket stays open, nothing answers) misses the deadline, is marked down
/// and computed around; the text stays the single node's, and the run does not stall on it.
#[test]
fn a_hung_worker_misses_the_deadline_and_changes_no_byte() {
    let dir = tempfile::tempdir().unwrap();
    let m = fixture("qwen3moe/q8_0.gguf");
    let start = Instant::now();
    let (single, workers, mut run) = long_run_on_workers(&m, dir.path(), 2, "3000", &["--node-timeout", "300"]);
    let mut stdout = run.stdout.take().unwrap();
    let mut text = read_at_least(&mut stdout, 64);
    // SAFETY: `kill` takes plain integers and touches no memory of ours. The pid is our own child's, not yet
    // waited for: even had it exited, the pid stays reserved to it until we wait, so it names no other process.
    unsafe { libc::kill(workers[1].child.id() as i32, libc::SIGSTOP) };
    stdout.read_to_end(&mut text).unwrap();
    let o = run.wait_with_output().unwrap();
    let took = start.elapsed();
    // SAFETY: as for the SIGSTOP above: the pid is still our own child's, not yet waited for.
    unsafe { libc::kill(workers[1].child.id() as i32, libc::SIGCONT) };
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert_eq!(
        String::from_utf8_lossy(&text),
        String::from_utf8_lossy(&single),
        "the text differs after a node hung"
    );
    assert!(
        err.contains(&format!("node 1 ({}) is down", workers[1].addr)) && err.contains("no answer within the deadline"),
        "{err}"
    );
    assert!(
        took < Duration::from_secs(60),
        "the run took {took:?}: the hung node stalled it"
    );
}

/// A dense layer cannot be sliced: `titan slice` says where the experts start, and writes nothing.
#[test]
fn shards_of_dense_layers_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("shard.gguf");
    let o = titan()
        .arg("slice")
        .arg(fixture("deepseek3/q8_0.gguf"))
        .args(["--layers", "0-2", "--experts", "0-3", "-o"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(!o.status.success() && !out.exists());
    assert!(
        stderr(&o).contains("the model's first 1 layers are dense and have no experts; start the layers at 1"),
        "{}",
        stderr(&o)
    );
}

/// Llama 4's MoE layers alternate with dense ones (layers 1 and 3 of the fixture): a shard spanning a dense
/// layer is refused naming it, and shards of one MoE layer each, cut along the experts, give the single-node trace.
#[test]
fn shards_of_an_interleaved_model_hold_one_moe_layer_each() {
    let dir = tempfile::tempdir().unwrap();
    let m = fixture("llama4/q4_0.gguf");
    let out = dir.path().join("shard.gguf");
    let o = titan()
        .arg("slice")
        .arg(&m)
        .args(["--layers", "1-3", "--experts", "0-7", "-o"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(!o.status.success() && !out.exists());
    assert!(
        stderr(&o).contains("layers 1..=3: layer 2 is dense (one layer in 2 has experts)"),
        "{}",
        stderr(&o)
    );
    let single = dir.path().join("single.trace");
    trace(&m, &single, &[]);
    let token = token_file(dir.path());
    let workers = shard_workers(&m, &[("1", "0-7"), ("3", "0-3"), ("3", "4-7")], dir.path());
    let nodes = workers.iter().map(|w| w.addr.as_str()).collect::<Vec<_>>().join(",");
    let out = dir.path().join("shards.trace");
    trace(&m, &out, &["--nodes", &nodes, "--token-file", token.to_str().unwrap()]);
    assert_eq!(
        trace_diff(&single, &out).split(':').next(),
        Some("IDENTICAL"),
        "{}",
        trace_diff(&single, &out)
    );
}

/// Speculative decoding on two workers, and with the experts streamed: the trace of the kept tokens is the
/// plain single-node trace, greedy and sampled, with prompt lookup and with a draft model (another file of
/// the architecture), drafts both kept and thrown away.
#[test]
fn speculation_on_a_cluster_and_streamed_gives_the_plain_trace() {
    let draft = fixture("qwen3moe/q8_0.gguf");
    let draft_args = ["--spec", "draft", "--draft", draft.to_str().unwrap()];
    // Sampled from the two likeliest tokens, the text still repeats itself enough for prompt lookup.
    let sampled = ["--temp", "0.5", "--top-k", "2", "--seed", "5"];
    speculation_gives_the_plain_trace(
        "qwen3moe/q4_0.gguf",
        &[&draft_args, &["--spec", "ngram"]],
        &sampled,
        true,
    );
}

/// Drafts from the model's own MTP block (`--spec mtp`, a file that kept it): on 2 workers (which hold
/// the main blocks' experts; the backbone computes the MTP block's) and streamed through a budget of one
/// expert per layer, greedy and sampled, the trace is the plain run's. (The fixture's block has random
/// weights: its drafts are thrown away; the engine's tests cover kept ones.)
#[test]
fn mtp_drafts_on_a_cluster_and_streamed_give_the_plain_trace() {
    let sampled = ["--temp", "0.9", "--seed", "5"];
    speculation_gives_the_plain_trace("qwen3next-mtp/q8_0.gguf", &[&["--spec", "mtp"]], &sampled, false);
}

/// `model`'s trace with each of `specs` (3 drafts a step), on 2 workers and streamed through a budget of one
/// expert per layer, greedy and `sampled`, against its plain single-node trace; with `must_keep`, some
/// drafts kept and some thrown away.
fn speculation_gives_the_plain_trace(model: &str, specs: &[&[&str]], sampled: &[&str], must_keep: bool) {
    let dir = tempfile::tempdir().unwrap();
    let m = fixture(model);
    let store = dir.path().join("store");
    let o = titan().arg("convert").arg(&m).arg("-o").arg(&store).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let workers: Vec<Worker> = (0..2)
        .map(|i| Worker::start(&m, dir.path(), &format!("w{i}"), "127.0.0.1:0"))
        .collect();
    let nodes = format!("{},{}", workers[0].addr, workers[1].addr);
    let token = token_file(dir.path());
    let cluster = ["--nodes", nodes.as_str(), "--token-file", token.to_str().unwrap()];
    let streamed = ["--store", store.to_str().unwrap(), "--expert-budget", "1"];
    let run = |out: &Path, sampling: &[&str], extra: &[&str]| {
        let o = titan()
            .args([
                "trace",
                "-p",
                "one two three four, one two three four, one two",
                "-n",
                "24",
            ])
            .args(["--threads", "2", "-m"])
            .arg(&m)
            .arg("-o")
            .arg(out)
            .args(sampling)
            .args(extra)
            .output()
            .unwrap();
        assert!(o.status.success(), "{extra:?}: {}", stderr(&o));
        stderr(&o)
    };
    let three = ["--draft-min", "3", "--draft-max", "3"];
    for sampling in [&["--temp", "0"][..], sampled] {
        let plain = dir.path().join("plain.trace");
        run(&plain, sampling, &["--spec", "off"]);
        for (name, place) in [("cluster", &cluster[..]), ("streamed", &streamed[..])] {
            for spec in specs {
                let out = dir.path().join("spec.trace");
                let log = run(&out, sampling, &[place, spec, &three[..]].concat());
                if name == "cluster" {
                    assert!(log.contains("cluster plan"), "{log}");
                }
                // Drafts verified: "speculation: 1.71 tokens per step, 9 of 36 drafts accepted".
                let line = log
                    .lines()
                    .find(|l| l.starts_with("speculation:"))
                    .unwrap_or_else(|| panic!("{log}"));
                let words: Vec<&str> = line.split_whitespace().collect();
                let (kept, drafted): (u32, u32) = (words[5].parse().unwrap(), words[7].parse().unwrap());
                assert!(drafted > 0, "{name}, {sampling:?}, {spec:?}: {line}");
                if must_keep {
                    assert!(0 < kept && kept < drafted, "{name}, {sampling:?}, {spec:?}: {line}");
                }
                let verdict = trace_diff(&plain, &out);
                assert!(
                    verdict.starts_with("IDENTICAL"),
                    "{name}, {sampling:?}, {spec:?}: {verdict}"
                );
            }
        }
    }
    for w in &workers {
        assert!(requests_served(&w.log()) > 0, "{}", w.log());
    }
}
