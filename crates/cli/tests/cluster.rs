//! The cluster with real processes and real sockets on loopback: `titan worker`s started as child
//! processes, a backbone (`titan trace` / `titan run --nodes`), and `titan trace-diff` as the judge.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use titan_net::{read_frame, write_frame, Kind};

const TOKEN: &str = "cluster-test-token-0123456789abcdef";

fn fixture(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(rel)
}

fn titan() -> Command {
    Command::new(env!("CARGO_BIN_EXE_titan"))
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A `titan worker` child process, killed when dropped; its stderr goes to `log`.
struct Worker {
    child: Child,
    addr: String,
    log: PathBuf,
}

impl Worker {
    fn start(model: &Path, dir: &Path, name: &str, listen: &str) -> Worker {
        Worker::start_with("-m", model, dir, name, listen)
    }

    /// A worker serving `what` (`-m` a model, or `--shard` a shard).
    fn start_with(flag: &str, what: &Path, dir: &Path, name: &str, listen: &str) -> Worker {
        let token = dir.join("node.token");
        if !token.exists() {
            std::fs::write(&token, TOKEN).unwrap();
        }
        let log = dir.join(format!("{name}.log"));
        let mut child = titan()
            .args(["worker", "--listen", listen, "--threads", "1", "--max-frame", "1048576", "--token-file"])
            .arg(&token)
            .arg(flag)
            .arg(what)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("titan worker starts");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let addr = line.trim().strip_prefix("listening on ").unwrap_or_else(|| panic!("worker said {line:?}")).to_string();
        Worker { child, addr, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap()
    }

    /// The log once it contains `needle` (a connection's thread logs just after it closes), or as it
    /// is after 10 s.
    fn log_with(&self, needle: &str) -> String {
        let start = Instant::now();
        loop {
            let log = self.log();
            if log.contains(needle) || start.elapsed() > Duration::from_secs(10) {
                return log;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn token_file(dir: &Path) -> PathBuf {
    let p = dir.join("node.token");
    std::fs::write(&p, TOKEN).unwrap();
    p
}

/// `titan trace` of a fixed greedy run, on this machine alone or with `extra` (the cluster options).
fn trace(model: &Path, out: &Path, extra: &[&str]) -> Output {
    let o = titan()
        .args(["trace", "-p", "The quick brown fox", "-n", "6", "--temp", "0", "--threads", "2", "-m"])
        .arg(model)
        .arg("-o")
        .arg(out)
        .args(extra)
        .output()
        .unwrap();
    assert!(o.status.success(), "trace {extra:?}: {}", stderr(&o));
    o
}

fn trace_diff(a: &Path, b: &Path) -> String {
    let o = titan().arg("trace-diff").arg(a).arg(b).output().unwrap();
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn any_node_count_and_placement_gives_the_single_node_trace() {
    for model in ["qwen3moe/q8_0.gguf", "olmoe/q4_0.gguf", "qwen3moe-k/q4_k_m.gguf", "qwen2moe/q8_0.gguf"] {
        let dir = tempfile::tempdir().unwrap();
        let m = fixture(model);
        let single = dir.path().join("single.trace");
        trace(&m, &single, &[]);
        let workers: Vec<Worker> = (0..4).map(|i| Worker::start(&m, dir.path(), &format!("w{i}"), "127.0.0.1:0")).collect();
        let token = token_file(dir.path());
        for n in 1..=4 {
            let nodes = workers[..n].iter().map(|w| w.addr.as_str()).collect::<Vec<_>>().join(",");
            let replicas = n.min(2).to_string();
            for placement in [["--placement", "contiguous", "--replicas", "1"], ["--placement", "interleaved", "--replicas", replicas.as_str()]] {
                let out = dir.path().join(format!("n{n}-{}.trace", placement[1]));
                let mut args = vec!["--nodes", nodes.as_str(), "--token-file", token.to_str().unwrap()];
                args.extend(placement);
                let o = trace(&m, &out, &args);
                assert!(stderr(&o).contains("cluster plan"), "{}", stderr(&o));
                let verdict = trace_diff(&single, &out);
                assert!(verdict.starts_with("IDENTICAL"), "{model}, {n} workers, {placement:?}: {verdict}");
            }
        }
        // Every worker computed experts (the backbone did not quietly compute everything itself).
        for w in &workers {
            assert!(requests_served(&w.log()) > 0, "{model}: {}", w.log());
        }
    }
}

/// The requests a worker's log says it served, over its closed connections ("…: closed (12 requests)").
fn requests_served(log: &str) -> u64 {
    log.lines().filter_map(|l| l.split("closed (").nth(1)?.split(' ').next()?.parse::<u64>().ok()).sum()
}

/// Reads `child`'s stdout until at least `n` bytes arrived, returning them.
fn read_at_least(out: &mut impl Read, n: usize) -> Vec<u8> {
    let mut got = vec![0u8; 0];
    let mut buf = [0u8; 256];
    while got.len() < n {
        let k = out.read(&mut buf).unwrap();
        assert!(k > 0, "the run ended after {} bytes", got.len());
        got.extend_from_slice(&buf[..k]);
    }
    got
}

#[test]
fn a_worker_killed_mid_generation_changes_no_byte_and_is_used_again_when_back() {
    let dir = tempfile::tempdir().unwrap();
    let m = fixture("qwen3moe/q8_0.gguf");
    let args = ["run", "-p", "Hello", "-n", "4000", "-c", "4096", "--temp", "0", "--threads", "1"];
    let single = titan().args(args).arg("-m").arg(&m).output().unwrap();
    assert!(single.status.success(), "{}", stderr(&single));

    let mut workers: Vec<Worker> = (0..3).map(|i| Worker::start(&m, dir.path(), &format!("w{i}"), "127.0.0.1:0")).collect();
    let nodes = workers.iter().map(|w| w.addr.as_str()).collect::<Vec<_>>().join(",");
    let token = token_file(dir.path());
    let mut run = titan()
        .args(args)
        .arg("-m")
        .arg(&m)
        .args(["--nodes", &nodes, "--token-file", token.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = run.stdout.take().unwrap();
    let mut text = read_at_least(&mut stdout, 64);
    // SIGKILL: no goodbye, the socket just dies.
    let addr = workers[1].addr.clone();
    unsafe { libc::kill(workers[1].child.id() as i32, libc::SIGKILL) };
    let _ = workers[1].child.wait();
    // A new worker on the same address is picked up again.
    workers[1] = Worker::start(&m, dir.path(), "w1-again", &addr);
    stdout.read_to_end(&mut text).unwrap();
    let o = run.wait_with_output().unwrap();
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert_eq!(String::from_utf8_lossy(&text), String::from_utf8_lossy(&single.stdout), "the cluster's text differs after a node died");
    assert!(err.contains(&format!("node 1 ({addr}) is down")), "{err}");
    assert!(err.contains(&format!("node 1 ({addr}) is back")), "{err}");
    let line = err.lines().find(|l| l.trim_start().starts_with(&addr)).unwrap_or_else(|| panic!("no report for {addr}: {err}"));
    assert!(!line.contains(" 0 failovers"), "the kill came after the run: {line}");
}

#[test]
fn a_wrong_token_is_refused_and_the_node_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let m = fixture("qwen3moe/q8_0.gguf");
    let w = Worker::start(&m, dir.path(), "w", "127.0.0.1:0");
    let wrong = dir.path().join("wrong.token");
    std::fs::write(&wrong, "not-the-token-0123456789").unwrap();
    let o = titan().args(["run", "-p", "Hi", "-n", "2", "--nodes", &w.addr, "--token-file", wrong.to_str().unwrap(), "-m"]).arg(&m).output().unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("wrong node token") && !err.contains("panicked"), "{err}");
    let log = w.log_with("refused: wrong node token");
    assert!(log.contains("refused: wrong node token"), "{log}");
    let single = dir.path().join("single.trace");
    trace(&m, &single, &[]);
    let out = dir.path().join("cluster.trace");
    trace(&m, &out, &["--nodes", &w.addr, "--token-file", token_file(dir.path()).to_str().unwrap()]);
    assert!(trace_diff(&single, &out).starts_with("IDENTICAL"));
}

/// Connects and says hello with the right token, as a backbone would.
fn hello(addr: &str, model: &Path) -> TcpStream {
    let f = titan_cluster::model_identity(&titan_gguf::GgufFile::open(model).unwrap());
    let mut s = TcpStream::connect(addr).unwrap();
    let body = serde_json::json!({ "token": TOKEN, "model": f }).to_string();
    write_frame(&mut s, Kind::Hello, 0, body.as_bytes(), &mut Vec::new()).unwrap();
    let mut reply = Vec::new();
    let h = read_frame(&mut s, 1 << 20, &mut reply).unwrap();
    assert_eq!(h.kind, Kind::Welcome, "{}", String::from_utf8_lossy(&reply));
    s
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
    let mut s = hello(&w.addr, &m);
    let mut head = titan_net::frame::encode_header(&titan_net::FrameHeader { kind: Kind::Compute, id: 1, len: 0 });
    head[16..20].copy_from_slice(&(2u32 << 30).to_le_bytes());
    s.write_all(&head).unwrap();
    assert!(closed_within(&mut s, Duration::from_secs(10)), "oversized frame: connection left open");

    // Garbage instead of a hello.
    let mut s = TcpStream::connect(&w.addr).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    assert!(closed_within(&mut s, Duration::from_secs(10)), "garbage: connection left open");

    // A well-framed compute request naming an expert that does not exist.
    let mut s = hello(&w.addr, &m);
    let mut body = Vec::new();
    titan_net::PayloadWriter(&mut body).u32(0).u32(8).u32(64).u32(0).u32(1).u32(99).u32(0);
    write_frame(&mut s, Kind::Compute, 2, &body, &mut Vec::new()).unwrap();
    let mut reply = Vec::new();
    let h = read_frame(&mut s, 1 << 20, &mut reply).unwrap();
    assert_eq!(h.kind, Kind::Error);
    assert!(String::from_utf8_lossy(&reply).contains("expert 99"), "{}", String::from_utf8_lossy(&reply));

    // Each reason is in the worker's log, and the worker still serves a real backbone.
    for needle in ["exceeds the limit", "not a TITAN frame", "expert 99"] {
        let log = w.log_with(needle);
        assert!(log.contains(needle), "{log}");
    }
    let single = dir.path().join("single.trace");
    trace(&m, &single, &[]);
    let out = dir.path().join("cluster.trace");
    trace(&m, &out, &["--nodes", &w.addr, "--token-file", token_file(dir.path()).to_str().unwrap()]);
    assert!(trace_diff(&single, &out).starts_with("IDENTICAL"));
    assert!(!w.log().contains("panicked"), "{}", w.log());
}

/// Writes the shard of `layers` × `experts` of `model` into `dir`.
fn slice(model: &Path, layers: &str, experts: &str, dir: &Path) -> PathBuf {
    let out = dir.join(format!("shard-{layers}-{experts}.gguf"));
    let o = titan().arg("slice").arg(model).args(["--layers", layers, "--experts", experts, "-o"]).arg(&out).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    out
}

#[test]
fn workers_serving_shards_give_the_single_node_trace() {
    for model in ["qwen3moe/q8_0.gguf", "olmoe/q4_0.gguf"] {
        let dir = tempfile::tempdir().unwrap();
        let m = fixture(model);
        let single = dir.path().join("single.trace");
        trace(&m, &single, &[]);
        let token = token_file(dir.path());
        // Every layer-expert held by exactly one shard, cut along both axes.
        let cuts = [("0-1", "0-2"), ("0", "3-7"), ("1", "3-5"), ("1", "6-7")];
        let workers: Vec<Worker> = cuts.iter().enumerate().map(|(i, (l, e))| Worker::start_with("--shard", &slice(&m, l, e, dir.path()), dir.path(), &format!("w{i}"), "127.0.0.1:0")).collect();
        let nodes = workers.iter().map(|w| w.addr.as_str()).collect::<Vec<_>>().join(",");
        let out = dir.path().join("shards.trace");
        let o = trace(&m, &out, &["--nodes", &nodes, "--token-file", token.to_str().unwrap()]);
        assert!(stderr(&o).contains("each node serves the experts of its shard"), "{}", stderr(&o));
        assert_eq!(trace_diff(&single, &out).split(':').next(), Some("IDENTICAL"), "{model}: {}", trace_diff(&single, &out));
        // Experts no shard holds are computed by the backbone.
        let out = dir.path().join("partial.trace");
        let o = trace(&m, &out, &["--nodes", &workers[0].addr, "--token-file", token.to_str().unwrap()]);
        assert!(stderr(&o).contains("backbone: 10 layer-experts no node holds"), "{}", stderr(&o));
        assert!(trace_diff(&single, &out).starts_with("IDENTICAL"), "{model}: {}", trace_diff(&single, &out));
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
    let o = titan().args(["worker", "--listen", "127.0.0.1:0", "--token-file"]).arg(token_file(dir.path())).arg("--shard").arg(&shard).output().unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("expert 7 of layer 1 failed its digest check") && err.contains(&shard.display().to_string()), "{err}");
    // Cut short: a clean error too.
    std::fs::write(&shard, &bytes[..n / 2]).unwrap();
    let o = titan().args(["worker", "--listen", "127.0.0.1:0", "--token-file"]).arg(token_file(dir.path())).arg("--shard").arg(&shard).output().unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("past the end of the file") && !stderr(&o).contains("panicked"), "{}", stderr(&o));
}

/// llama.cpp's own GGUF reader (gguf-py) must read a shard, and find it byte-equal to the model's slice.
/// Runs with the Python named by TITAN_PYTHON (which has the `gguf` package; `.ci/run` provides one); in
/// CI it must be there.
#[test]
fn shards_load_in_gguf_py() {
    let Ok(python) = std::env::var("TITAN_PYTHON") else {
        assert!(std::env::var("CI").is_err(), "CI must set TITAN_PYTHON to a python with the gguf package");
        eprintln!("skipped: TITAN_PYTHON (a python with the gguf package) is not set");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let check = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tools/check_shard.py");
    for (model, layers, experts) in [("qwen3moe/q8_0.gguf", "0-1", "2-5"), ("qwen3moe-k/q4_k_m.gguf", "0", "0-7"), ("mixtral/q4_0.gguf", "1", "7")] {
        let m = fixture(model);
        let shard = slice(&m, layers, experts, dir.path());
        let o = Command::new(&python).arg(&check).arg(&shard).arg(&m).output().unwrap();
        assert!(o.status.success(), "{model}: {}{}", String::from_utf8_lossy(&o.stdout), stderr(&o));
    }
}
