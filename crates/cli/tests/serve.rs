//! `titan serve` as its users reach it: a real server process on loopback, driven by the official `openai`
//! Python client (crates/cli/tests/openai_client.py) and by raw HTTP for what the client cannot send.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

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
        let template = fixture("templates/qwen3.jinja");
        let mut child = titan()
            .args(["serve", "--listen", "127.0.0.1:0", "--threads", "2", "--api-key", KEY, "--chat-template"])
            .arg(&template)
            .arg("-m")
            .arg(model)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("titan serve starts");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let addr = line.trim().strip_prefix("listening on ").unwrap_or_else(|| panic!("server said {line:?}")).to_string();
        Server { child, url: format!("http://{addr}") }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs the client script in `mode` against `server`, or says why it cannot (no python with `openai`).
fn client(server: &Server, model: &str, mode: &str) {
    let Ok(python) = std::env::var("TITAN_PYTHON") else {
        assert!(std::env::var("CI").is_err(), "CI must set TITAN_PYTHON to a python with the openai package");
        eprintln!("skipped: TITAN_PYTHON (a python with the openai package) is not set");
        return;
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/openai_client.py");
    let o = Command::new(python).arg(script).args([&server.url, model, KEY, mode]).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    println!("{out}");
    assert!(o.status.success() && out.contains("all checks passed"), "{out}{}", stderr(&o));
}

#[test]
fn the_openai_client_gets_completions_chat_streams_and_errors() {
    let server = Server::start(&fixture("qwen3moe/q8_0.gguf"), &["--parallel", "8"]);
    client(&server, "q8_0", "api");
}

#[test]
fn a_client_that_disconnects_frees_its_slot_and_a_full_queue_is_429() {
    let server = Server::start(&fixture("qwen3moe/q8_0.gguf"), &["--parallel", "1", "--queue", "1", "-c", "8192", "--allow-long-context"]);
    client(&server, "q8_0", "slots");
}
