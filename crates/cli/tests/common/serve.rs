//! A `titan serve` child for the server tests, and plain HTTP to it.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use super::{fixture, titan};

/// A `titan serve` child on a loopback port, killed when dropped. Its `--api-key`, if it was given one, goes
/// with the requests that ask for it.
pub struct Server {
    child: Child,
    pub url: String,
    agent: ureq::Agent,
    key: Option<String>,
}

impl Server {
    /// `titan serve` on `model` with the fixture chat template `template` (relative to tests/fixtures), two
    /// threads and `extra`.
    pub fn start(model: &Path, template: &str, extra: &[&str]) -> Server {
        let mut child = titan()
            .args(["serve", "--listen", "127.0.0.1:0", "--threads", "2"])
            .arg("--chat-template")
            .arg(fixture(template))
            .arg("-m")
            .arg(model)
            .args(extra)
            .stdout(Stdio::piped())
            .spawn()
            .expect("titan serve starts");
        let addr = super::listening_addr(&mut child, "server");
        Server {
            url: format!("http://{addr}"),
            child,
            agent: ureq::Agent::config_builder()
                .http_status_as_error(false)
                .timeout_global(Some(Duration::from_secs(120)))
                .build()
                .into(),
            key: extra.windows(2).find(|w| w[0] == "--api-key").map(|w| w[1].to_string()),
        }
    }

    /// A POST of `body` (a GET without one), with the API key when `key`: the status and the body's text.
    pub fn send(&self, path: &str, body: Option<&Value>, key: bool) -> (u16, String) {
        let url = format!("{}{path}", self.url);
        let auth = self.key.as_ref().filter(|_| key).map(|k| format!("Bearer {k}"));
        let answer = match body {
            Some(b) => {
                let mut req = self.agent.post(url).content_type("application/json");
                if let Some(a) = &auth {
                    req = req.header("Authorization", a);
                }
                req.send(b.to_string().as_bytes())
            }
            None => {
                let mut req = self.agent.get(url);
                if let Some(a) = &auth {
                    req = req.header("Authorization", a);
                }
                req.call()
            }
        };
        let mut answer = answer.unwrap();
        let text = answer.body_mut().read_to_string().unwrap();
        (answer.status().as_u16(), text)
    }

    /// `POST path` with the API key: the status and the body, JSON or (a stream of server-sent events) its
    /// text as a string.
    pub fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.post_with(path, body, true)
    }

    /// [`Server::post`], with the API key only when `key`.
    pub fn post_with(&self, path: &str, body: &Value, key: bool) -> (u16, Value) {
        let (status, text) = self.send(path, Some(body), key);
        (status, json_or_text(text))
    }

    /// `GET path`, with the API key when `key`: the status and the body, JSON or text.
    pub fn get(&self, path: &str, key: bool) -> (u16, Value) {
        let (status, text) = self.send(path, None, key);
        (status, json_or_text(text))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn json_or_text(text: String) -> Value {
    serde_json::from_str(&text).unwrap_or(Value::String(text))
}

/// The python `TITAN_PYTHON` names (one with `packages`), or none when it is not set: the caller then skips
/// its client checks, which CI may not do.
pub fn python(packages: &str) -> Option<String> {
    let python = std::env::var("TITAN_PYTHON").ok();
    if python.is_none() {
        assert!(
            std::env::var("CI").is_err(),
            "CI must set TITAN_PYTHON to a python with {packages}"
        );
        eprintln!("skipped: TITAN_PYTHON (a python with {packages}) is not set");
    }
    python
}

/// Runs the Python `script` with `args`; it must exit 0 having printed "all checks passed".
pub fn python_checks(python: &str, script: &str, args: &[&str]) {
    let o = Command::new(python).arg("-c").arg(script).args(args).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    println!("{out}");
    assert!(
        o.status.success() && out.contains("all checks passed"),
        "{out}{}",
        super::stderr(&o)
    );
}
