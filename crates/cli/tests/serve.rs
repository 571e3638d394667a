//! `titan serve` as its users reach it: a real server process on loopback, driven by the official `openai`
//! Python client (crates/cli/tests/openai_client.py) and by raw HTTP for what the client cannot send.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::*;

const KEY: &str = "serve-test-key-0123456789";

/// A `titan serve` child, killed when dropped.
struct Server {
    child: Child,
    url: String,
}

impl Server {
    fn start(model: &Path, extra: &[&str]) -> Server {
        Server::start_with_log(model, extra, Stdio::inherit())
    }

    /// A server whose stderr, its log, goes to `log`.
    fn start_with_log(model: &Path, extra: &[&str], log: impl Into<Stdio>) -> Server {
        let template = fixture("templates/qwen3.jinja");
        let mut child = titan()
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--threads",
                "2",
                "--api-key",
                KEY,
                "--chat-template",
            ])
            .arg(&template)
            .arg("-m")
            .arg(model)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("titan serve starts");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("server said {line:?}"))
            .to_string();
        Server {
            child,
            url: format!("http://{addr}"),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The body of `GET path` (plain HTTP/1.1 over a socket; the response is small and closes).
fn get(server: &Server, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(server.url.trim_start_matches("http://")).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n").unwrap();
    let mut response = String::new();
    s.read_to_string(&mut response).unwrap();
    response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default()
}

/// Runs the client script in `mode` against `server` and returns what it printed, or None when it cannot
/// run here (no python with `openai`).
fn client(server: &Server, model: &str, mode: &str) -> Option<String> {
    let Ok(python) = std::env::var("TITAN_PYTHON") else {
        assert!(
            std::env::var("CI").is_err(),
            "CI must set TITAN_PYTHON to a python with the openai package"
        );
        eprintln!("skipped: TITAN_PYTHON (a python with the openai package) is not set");
        return None;
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/openai_client.py");
    let o = Command::new(python)
        .arg(script)
        .args([&server.url, model, KEY, mode])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    println!("{out}");
    assert!(
        o.status.success() && (mode == "texts" || out.contains("all checks passed")),
        "{out}{}",
        stderr(&o)
    );
    Some(out.into_owned())
}

#[test]
fn the_openai_client_gets_completions_chat_streams_and_errors() {
    let server = Server::start(&fixture("qwen3moe/q8_0.gguf"), &["--parallel", "8"]);
    client(&server, "q8_0", "api");
}

#[test]
fn a_client_that_disconnects_frees_its_slot_and_a_full_queue_is_429() {
    let server = Server::start(
        &fixture("qwen3moe/q8_0.gguf"),
        &["--parallel", "1", "--queue", "1", "-c", "8192", "--allow-long-context"],
    );
    client(&server, "q8_0", "slots");
}

/// The server over a cluster: concurrent requests batched on the backbone, experts computed by two
/// workers, and the same texts as the server on one machine.
#[test]
fn a_server_over_a_cluster_answers_as_on_one_machine() {
    let dir = tempfile::tempdir().unwrap();
    let m = fixture("qwen3moe/q8_0.gguf");
    let workers: Vec<Worker> = (0..2)
        .map(|i| Worker::start(&m, dir.path(), &format!("w{i}"), "127.0.0.1:0"))
        .collect();
    let nodes = workers.iter().map(|w| w.addr.as_str()).collect::<Vec<_>>().join(",");
    let single = Server::start(&m, &[]);
    let Some(alone) = client(&single, "q8_0", "texts") else {
        return;
    };
    let cluster = Server::start(
        &m,
        &[
            "--nodes",
            &nodes,
            "--token-file",
            token_file(dir.path()).to_str().unwrap(),
        ],
    );
    let spread = client(&cluster, "q8_0", "texts").unwrap();
    assert_eq!(spread, alone, "the cluster's texts differ from one machine's");
    // /metrics has each node's exchanges.
    let metrics = get(&cluster, "/metrics");
    for w in &workers {
        let line = metrics
            .lines()
            .find(|l| l.starts_with(&format!("titan_node_exchanges_total{{node=\"{}\"}}", w.addr)))
            .unwrap_or_else(|| panic!("no exchanges of {} in\n{metrics}", w.addr));
        let n: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        assert!(n > 0.0, "{line}");
        assert!(
            metrics.contains(&format!("titan_node_exchange_seconds_total{{node=\"{}\"}}", w.addr)),
            "{metrics}"
        );
    }
    let served: Vec<String> = workers.iter().map(Worker::log).collect();
    drop(cluster);
    for (w, log) in workers.iter().zip(&served) {
        assert!(!w.log().contains("panicked"), "{log}");
    }
    let computed: u64 = workers.iter().map(|w| requests_served(&w.log_with("requests)"))).sum();
    assert!(computed > 0, "the workers computed nothing: {served:?}");
}

/// Every answer names its request in `x-request-id`, and the server's log has that request's access-log line
/// (method, path, status) and, for a completion, the engine's line with its token counts.
#[test]
fn each_answer_has_a_request_id_that_the_log_lines_carry() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("serve.log");
    let server = Server::start_with_log(
        &fixture("qwen3moe/q8_0.gguf"),
        &[],
        std::fs::File::create(&log).unwrap(),
    );
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    let url = |p: &str| format!("{}{p}", server.url);
    let bearer = format!("Bearer {KEY}");
    let answers = [
        (
            "GET",
            "/v1/models",
            200,
            agent.get(url("/v1/models")).header("Authorization", &bearer).call(),
        ),
        ("GET", "/v1/models", 401, agent.get(url("/v1/models")).call()),
        ("GET", "/no/such/route", 404, agent.get(url("/no/such/route")).call()),
        (
            "POST",
            "/v1/completions",
            200,
            agent
                .post(url("/v1/completions"))
                .header("Authorization", &bearer)
                .content_type("application/json")
                .send(&br#"{"prompt": "The quick brown fox", "max_tokens": 3, "temperature": 0}"#[..]),
        ),
    ];
    let mut ids = Vec::new();
    for (method, path, status, answer) in answers {
        let answer = answer.unwrap();
        assert_eq!(answer.status().as_u16(), status, "{method} {path}");
        let id = answer
            .headers()
            .get("x-request-id")
            .unwrap_or_else(|| panic!("{method} {path}: no x-request-id in {:?}", answer.headers()))
            .to_str()
            .unwrap()
            .to_string();
        let span = format!("request{{id={id} method={method} path={path}}}: ");
        let access = format!("{span}answered status={status} ms=");
        let text = log_with(&log, &access);
        assert!(
            text.lines().any(|l| l.contains(" INFO ") && l.contains(&access)),
            "no access line of {id} ({method} {path} {status}) in\n{text}"
        );
        if method == "POST" {
            let engine = format!("{span}generated finish=length prompt_tokens=");
            let line = text.lines().find(|l| l.contains(&engine));
            assert!(
                line.is_some_and(|l| l.contains(" generated=3 ms=")),
                "no engine line of {id} in\n{text}"
            );
        }
        ids.push(id);
    }
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 4, "request ids repeat: {ids:?}");
}

/// The file at `log` once it contains `needle` (a response's line is written just after it is sent), or as
/// it is after 10 s.
fn log_with(log: &Path, needle: &str) -> String {
    let start = Instant::now();
    loop {
        let text = std::fs::read_to_string(log).unwrap();
        if text.contains(needle) || start.elapsed() > Duration::from_secs(10) {
            return text;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
