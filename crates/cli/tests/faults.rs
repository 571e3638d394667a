//! Faults injected into real processes on loopback: workers killed at random moments, connections cut in
//! the middle of a frame or of a download, the backbone killed and restarted while its workers run. Each
//! generation either completes with the single node's bytes or fails with a clear error, and nothing
//! damaged is kept.

use std::io::Read;
use std::time::{SystemTime, UNIX_EPOCH};

use titan_net::Kind;

mod common;
use common::cutter::{Cut, Cutter};
use common::*;

/// Three kill moments in `lo..hi` bytes of output, ascending, from a seed the test prints (so a failure can
/// be replayed by fixing it).
fn kill_points(seed: u64, lo: usize, hi: usize) -> Vec<usize> {
    let mut x = seed | 1;
    let mut points: Vec<usize> = (0..3)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            lo + (x % (hi - lo) as u64) as usize
        })
        .collect();
    points.sort_unstable();
    points
}

#[test]
fn workers_killed_at_random_moments_change_no_byte() {
    let dir = tempfile::tempdir().unwrap();
    let m = fixture("qwen3moe/q8_0.gguf");
    let seed = std::env::var("TITAN_FAULT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64);
    let points = kill_points(seed, 16, 1500);
    println!("seed {seed} (TITAN_FAULT_SEED): killing workers 0, 1, 2 after {points:?} bytes of output");
    let (single, mut workers, mut run) = long_run_on_workers(&m, dir.path(), 3, "4000", &[]);
    let mut stdout = run.stdout.take().unwrap();
    let mut text = Vec::new();
    for (node, &at) in points.iter().enumerate() {
        text.extend(read_at_least(&mut stdout, at.saturating_sub(text.len())));
        let addr = workers[node].addr.clone();
        // SAFETY: `kill` takes plain integers and touches no memory of ours. The pid is our own child's, not yet
        // waited for (the `wait` comes next): even had it exited, the pid stays reserved to it until then.
        unsafe { libc::kill(workers[node].child.id() as i32, libc::SIGKILL) };
        let _ = workers[node].child.wait();
        workers[node] = Worker::start(&m, dir.path(), &format!("w{node}-again"), &addr);
    }
    stdout.read_to_end(&mut text).unwrap();
    let o = run.wait_with_output().unwrap();
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert_eq!(
        String::from_utf8_lossy(&text),
        String::from_utf8_lossy(&single),
        "seed {seed}: the text differs after the kills"
    );
    for (node, w) in workers.iter().enumerate() {
        assert!(
            err.contains(&format!("node {node} ({}) is down", w.addr)),
            "seed {seed}: {err}"
        );
    }
}

/// A node whose connection is cut inside a frame — a request half sent, or a reply half received — is
/// failed over like a dead one: the backbone never reads a partial frame as a whole one.
#[test]
fn connections_cut_mid_frame_change_no_byte() {
    let dir = tempfile::tempdir().unwrap();
    let m = fixture("qwen3moe/q8_0.gguf");
    let single = dir.path().join("single.trace");
    trace(&m, &single, &[]);
    let workers: Vec<Worker> = (0..2)
        .map(|i| Worker::start(&m, dir.path(), &format!("w{i}"), "127.0.0.1:0"))
        .collect();
    // Towards node 0: 30 bytes into its first compute request. From node 1: 30 bytes into its first reply.
    let cutters = [
        Cutter::start(
            &workers[0].addr,
            Cut::MidFrame {
                replies: false,
                kind: Kind::Compute,
                into: 30,
            },
        ),
        Cutter::start(
            &workers[1].addr,
            Cut::MidFrame {
                replies: true,
                kind: Kind::Output,
                into: 30,
            },
        ),
    ];
    let nodes = cutters.iter().map(|c| c.addr.as_str()).collect::<Vec<_>>().join(",");
    let out = dir.path().join("cut.trace");
    let o = trace(
        &m,
        &out,
        &[
            "--nodes",
            &nodes,
            "--token-file",
            token_file(dir.path()).to_str().unwrap(),
        ],
    );
    let err = stderr(&o);
    assert!(cutters.iter().all(Cutter::has_cut), "a connection was not cut: {err}");
    for (node, c) in cutters.iter().enumerate() {
        assert!(err.contains(&format!("node {node} ({}) is down", c.addr)), "{err}");
    }
    let diff = trace_diff(&single, &out);
    assert!(diff.starts_with("IDENTICAL"), "{diff}");
    for w in &workers {
        assert!(!w.log().contains("panicked"), "{}", w.log());
    }
}

/// A shard download cut in the middle of its body resumes where it stopped (the bytes received add up to
/// the shard, once), is verified before it is used, and the trace is the single node's.
#[test]
fn a_slice_download_cut_mid_body_resumes_and_is_verified() {
    let dir = tempfile::tempdir().unwrap();
    let m = fixture("qwen3moe/q8_0.gguf");
    let single = dir.path().join("single.trace");
    trace(&m, &single, &[]);
    let (slices, node) = (free_addr(), free_addr());
    // The backbone's endpoint does not listen yet; the relay dials it per connection, so start it now.
    let cutter = Cutter::start(&slices, Cut::Replies { bytes: 3000 });
    let url = format!("http://{}", cutter.addr);
    let cache = dir.path().join("cache");
    let out = dir.path().join("cluster.trace");
    let nodes = [node];
    let (_, workers) = trace_serving_slices(&m, &out, &nodes, &slices, dir.path(), || {
        fetching_workers(&url, std::slice::from_ref(&cache), &nodes, dir.path(), "w")
    });
    let log = workers[0].log();
    assert!(cutter.has_cut(), "the download was not cut: {log}");
    assert!(log.contains("download cut at byte"), "{log}");
    assert_eq!(
        downloaded(&workers[0]),
        dir_bytes(&cache),
        "the resumed download fetched bytes twice or lost some: {log}"
    );
    assert!(
        std::fs::read_dir(&cache)
            .unwrap()
            .all(|e| e.unwrap().path().extension().is_some_and(|x| x == "gguf")),
        "a partial file was left in the cache"
    );
    let diff = trace_diff(&single, &out);
    assert!(diff.starts_with("IDENTICAL"), "{diff}");
}

/// The backbone killed mid-generation (SIGKILL: its sockets just die) and started again: the workers keep
/// serving, and the new run is the single node's.
#[test]
fn a_backbone_killed_and_restarted_while_workers_run_changes_no_byte() {
    let dir = tempfile::tempdir().unwrap();
    let m = fixture("qwen3moe/q8_0.gguf");
    let (_, workers, mut run) = long_run_on_workers(&m, dir.path(), 2, "4000", &[]);
    let mut stdout = run.stdout.take().unwrap();
    read_at_least(&mut stdout, 64);
    run.kill().unwrap();
    let _ = run.wait();
    for w in &workers {
        let log = w.log_with("closed");
        assert!(log.contains("closed"), "{log}");
    }
    let single = dir.path().join("single.trace");
    trace(&m, &single, &[]);
    let nodes = workers.iter().map(|w| w.addr.as_str()).collect::<Vec<_>>().join(",");
    let out = dir.path().join("again.trace");
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
    let diff = trace_diff(&single, &out);
    assert!(diff.starts_with("IDENTICAL"), "{diff}");
    for w in &workers {
        assert!(!w.log().contains("panicked"), "{}", w.log());
    }
}
