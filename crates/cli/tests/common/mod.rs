//! What the tests that start real `titan` processes share: the fixture, the binary, worker children that
//! are killed when dropped, the node token, traces and their diff.
#![allow(dead_code)] // each test binary uses its own subset

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub mod cutter;
pub mod serve;
pub mod tamper;

pub const TOKEN: &str = "cluster-test-token-0123456789abcdef";

pub fn fixture(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(rel)
}

pub fn titan() -> Command {
    Command::new(env!("CARGO_BIN_EXE_titan"))
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A `titan worker` child process, killed when dropped; its stderr goes to `log`.
pub struct Worker {
    pub child: Child,
    pub addr: String,
    pub log: PathBuf,
}

impl Worker {
    pub fn start(model: &Path, dir: &Path, name: &str, listen: &str) -> Worker {
        Worker::start_with("-m", model, dir, name, listen)
    }

    /// A worker serving `what` (`-m` a model, or `--shard` a shard).
    pub fn start_with(flag: &str, what: &Path, dir: &Path, name: &str, listen: &str) -> Worker {
        Worker::start_with_args(flag, what, dir, name, listen, &[])
    }

    /// The same, with more options.
    pub fn start_with_args(flag: &str, what: &Path, dir: &Path, name: &str, listen: &str, extra: &[&str]) -> Worker {
        let token = token_file(dir);
        let log = dir.join(format!("{name}.log"));
        let mut child = titan()
            .args([
                "worker",
                "--listen",
                listen,
                "--threads",
                "1",
                "--max-frame",
                "1048576",
                "--token-file",
            ])
            .arg(&token)
            .arg(flag)
            .arg(what)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("titan worker starts");
        let addr = listening_addr(&mut child, "worker");
        Worker { child, addr, log }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap()
    }

    /// The log once it contains `needle` (a connection's thread logs just after it closes), or as it
    /// is after 10 s.
    pub fn log_with(&self, needle: &str) -> String {
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

/// The node token file in `dir`, written once (atomically: a process may be reading it).
/// The address a `titan worker` or `titan serve` child prints first on stdout (`listening on ADDR`); `who`
/// names the child in the panic if it prints something else.
pub fn listening_addr(child: &mut Child, who: &str) -> String {
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    line.trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("{who} said {line:?}"))
        .to_string()
}

pub fn token_file(dir: &Path) -> PathBuf {
    let p = dir.join("node.token");
    if !p.exists() {
        let tmp = dir.join("node.token.tmp");
        std::fs::write(&tmp, TOKEN).unwrap();
        std::fs::rename(&tmp, &p).unwrap();
    }
    p
}

/// `titan trace` of a fixed greedy run, on this machine alone or with `extra` (the cluster options).
pub fn trace(model: &Path, out: &Path, extra: &[&str]) -> Output {
    let o = titan()
        .args([
            "trace",
            "-p",
            "The quick brown fox",
            "-n",
            "6",
            "--temp",
            "0",
            "--threads",
            "2",
            "-m",
        ])
        .arg(model)
        .arg("-o")
        .arg(out)
        .args(extra)
        .output()
        .unwrap();
    assert!(o.status.success(), "trace {extra:?}: {}", stderr(&o));
    o
}

pub fn trace_diff(a: &Path, b: &Path) -> String {
    let o = titan().arg("trace-diff").arg(a).arg(b).output().unwrap();
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Reads `child`'s stdout until at least `n` bytes arrived, returning them.
pub fn read_at_least(out: &mut impl Read, n: usize) -> Vec<u8> {
    let mut got = vec![0u8; 0];
    let mut buf = [0u8; 256];
    while got.len() < n {
        let k = out.read(&mut buf).unwrap();
        assert!(k > 0, "the run ended after {} bytes", got.len());
        got.extend_from_slice(&buf[..k]);
    }
    got
}

/// A long greedy generation: its text on this machine alone, and the same run started (streaming its output)
/// as the backbone of `n` fresh workers, with `extra` options.
pub fn long_run_on_workers(
    m: &Path,
    dir: &Path,
    n: usize,
    tokens: &str,
    extra: &[&str],
) -> (Vec<u8>, Vec<Worker>, Child) {
    // Past the fixtures' 512-token training context: long enough to kill and restart a worker mid-run.
    let args = [
        "run",
        "-p",
        "Hello",
        "-n",
        tokens,
        "-c",
        "4096",
        "--allow-long-context",
        "--temp",
        "0",
        "--threads",
        "1",
    ];
    let single = titan().args(args).arg("-m").arg(m).output().unwrap();
    assert!(single.status.success(), "{}", stderr(&single));
    let workers: Vec<Worker> = (0..n)
        .map(|i| Worker::start(m, dir, &format!("w{i}"), "127.0.0.1:0"))
        .collect();
    let nodes = workers.iter().map(|w| w.addr.as_str()).collect::<Vec<_>>().join(",");
    let run = titan()
        .args(args)
        .arg("-m")
        .arg(m)
        .args(["--nodes", &nodes, "--token-file", token_file(dir).to_str().unwrap()])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    (single.stdout, workers, run)
}

/// A loopback address with a port nothing listens on now (for nodes that must be named before they start).
pub fn free_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

/// A backbone process, killed when dropped unless it was waited for.
pub struct Backbone(pub Option<Child>);

impl Drop for Backbone {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Workers that fetch their shards from `backbone`, worker `i` into `caches[i]`, listening on `addrs[i]`.
/// All are started before any is waited for: none serves before every node has joined.
pub fn fetching_workers(backbone: &str, caches: &[PathBuf], addrs: &[String], dir: &Path, name: &str) -> Vec<Worker> {
    let mut started = Vec::new();
    for (i, (cache, addr)) in caches.iter().zip(addrs).enumerate() {
        let log = dir.join(format!("{name}{i}.log"));
        let child = titan()
            .args([
                "worker",
                "--backbone",
                backbone,
                "--listen",
                addr,
                "--threads",
                "1",
                "--token-file",
            ])
            .arg(token_file(dir))
            .arg("--cache-dir")
            .arg(cache)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        started.push(Worker {
            child,
            addr: addr.clone(),
            log,
        });
    }
    started
}

/// Waits until each worker says it is listening (60 s at most: a worker whose peers never join would wait).
pub fn wait_listening(workers: &mut [Worker]) {
    for w in workers {
        let stdout = w.child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(Duration::from_secs(60)).unwrap_or_default();
        assert!(line.starts_with("listening on"), "worker said {line:?}: {}", w.log());
    }
}

/// The bytes a fetching worker says it downloaded.
pub fn downloaded(w: &Worker) -> u64 {
    let log = w.log();
    log.lines()
        .find_map(|l| l.split_once(" downloaded ")?.1.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("{log}"))
}

pub fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum()
}

/// Runs a backbone trace that serves slices at `slices` to `nodes`, while `start_workers` starts them.
pub fn trace_serving_slices(
    m: &Path,
    out: &Path,
    nodes: &[String],
    slices: &str,
    dir: &Path,
    start_workers: impl FnOnce() -> Vec<Worker>,
) -> (Output, Vec<Worker>) {
    let nodes = nodes.join(",");
    let backbone = titan()
        .args([
            "trace",
            "-p",
            "The quick brown fox",
            "-n",
            "6",
            "--temp",
            "0",
            "--threads",
            "2",
            "-m",
        ])
        .arg(m)
        .arg("-o")
        .arg(out)
        .args([
            "--nodes",
            &nodes,
            "--token-file",
            token_file(dir).to_str().unwrap(),
            "--serve-slices",
            slices,
            "--join-timeout",
            "120",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Killed if the workers fail to start, rather than left waiting for them to join.
    let mut backbone = Backbone(Some(backbone));
    let workers = start_workers();
    let o = backbone.0.take().unwrap().wait_with_output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    (o, workers)
}

/// The requests a worker's log says it served, over its closed connections ("…: closed (12 requests)").
pub fn requests_served(log: &str) -> u64 {
    log.lines()
        .filter_map(|l| l.split("closed (").nth(1)?.split(' ').next()?.parse::<u64>().ok())
        .sum()
}
