//! `titan serve` as its users reach it: a real server process on loopback, driven by the official `openai`
//! Python client (crates/cli/tests/openai_client.py) and by raw HTTP for what the client cannot send.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
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
        Server::launch(model, Some(&fixture("templates/qwen3.jinja")), extra, log)
    }

    /// A server with `template` as its --chat-template (None: the model's own).
    fn launch(model: &Path, template: Option<&Path>, extra: &[&str], log: impl Into<Stdio>) -> Server {
        let mut cmd = titan();
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--threads", "2", "--api-key", KEY]);
        if let Some(template) = template {
            cmd.arg("--chat-template").arg(template);
        }
        let mut child = cmd
            .arg("-m")
            .arg(model)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("titan serve starts");
        let addr = listening_addr(&mut child, "server");
        Server {
            child,
            url: format!("http://{addr}"),
        }
    }

    fn addr(&self) -> &str {
        self.url.trim_start_matches("http://")
    }

    /// `POST path` with a JSON `body` and the API key: the status, the body, and how long it took (at most a
    /// minute: a server that does not answer fails the test rather than hang it).
    fn post(&self, path: &str, body: &str) -> (u16, String, Duration) {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(60)))
            .build()
            .into();
        let started = Instant::now();
        let mut answer = agent
            .post(format!("{}{path}", self.url))
            .header("Authorization", &format!("Bearer {KEY}"))
            .content_type("application/json")
            .send(body.as_bytes())
            .unwrap();
        let text = answer.body_mut().read_to_string().unwrap();
        (answer.status().as_u16(), text, started.elapsed())
    }

    /// The server's peak resident memory in bytes (`VmHWM`).
    #[cfg(target_os = "linux")]
    fn peak_rss(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
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

/// A chat request of `messages` (role, content), 2 tokens long.
fn chat_request(messages: &[(&str, &str)]) -> String {
    let messages: Vec<serde_json::Value> = messages
        .iter()
        .map(|(role, content)| serde_json::json!({"role": role, "content": content}))
        .collect();
    serde_json::json!({"messages": messages, "max_tokens": 2, "temperature": 0}).to_string()
}

/// The `error.message` of an OpenAI-shaped error body.
fn message(body: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    v["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("no error message in {body}"))
        .to_owned()
}

/// A template file whose first message's content chooses how it misbehaves: loop without end, work cubic in
/// the number of messages, print without end, print 100 MB, call an unknown filter, read an undefined value,
/// refuse the conversation itself; any other content is rendered as ChatML.
fn misbehaving_template(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("misbehaving.jinja");
    std::fs::write(
        &path,
        "{%- set c = messages[0].content -%}\n\
         {%- if c == 'endless' -%}{% for i in range(100000) %}{% for j in range(100000) %}{{ '' }}{% endfor %}{% endfor %}\n\
         {%- elif c == 'cubic' -%}{% for a in messages %}{% for b in messages %}{% for m in messages %}{% endfor %}{% endfor %}{% endfor %}\n\
         {%- elif c == 'flood' -%}{% for i in range(100000) %}{{ 'x' * 100000 }}{% endfor %}\n\
         {%- elif c == 'huge' -%}{{ 'x' * 100000000 }}\n\
         {%- elif c == 'filter' -%}{{ c | no_such_filter }}\n\
         {%- elif c == 'undefined' -%}{{ messages[0].nothing.deeper }}\n\
         {%- elif c == 'refuse' -%}{{ raise_exception('this template takes no such conversation') }}\n\
         {%- else -%}<|im_start|>user\n{{ c }}<|im_end|>\n<|im_start|>assistant\n{% endif %}",
    )
    .unwrap();
    path
}

/// Asks `GET /health` every 20 ms until `stop`; returns how many answered and the slowest answer. Each must
/// be a 200.
fn watch_health(addr: String, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<(usize, Duration)> {
    std::thread::spawn(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(10)))
            .build()
            .into();
        let (mut answered, mut slowest) = (0, Duration::ZERO);
        while !stop.load(Ordering::Relaxed) {
            let started = Instant::now();
            let answer = agent.get(format!("http://{addr}/health")).call().unwrap();
            assert_eq!(answer.status().as_u16(), 200);
            slowest = slowest.max(started.elapsed());
            answered += 1;
            std::thread::sleep(Duration::from_millis(20));
        }
        (answered, slowest)
    })
}

/// A chat template that never ends, or whose work is cubic in the messages (a 40 KB body of 1400), or that
/// prints without end, is stopped by its fuel or by the bound on its output: the request is answered 500 in
/// well under a second or two, naming the template, while `/health` answers every 20 ms throughout (it once
/// stopped answering, with every other request, for as long as the template ran: forever).
#[test]
fn a_runaway_chat_template_is_a_500_within_seconds_and_health_answers_meanwhile() {
    let dir = tempfile::tempdir().unwrap();
    let template = misbehaving_template(dir.path());
    let server = Server::launch(&fixture("qwen3moe/q8_0.gguf"), Some(&template), &[], Stdio::inherit());
    let stop = Arc::new(AtomicBool::new(false));
    let health = watch_health(server.addr().to_owned(), stop.clone());
    let mut cubic = vec![("user", "cubic")];
    cubic.extend(std::iter::repeat_n(("user", ""), 1400));
    let requests = [
        ("endless", chat_request(&[("user", "endless")]), "ran out of fuel"),
        ("cubic", chat_request(&cubic), "ran out of fuel"),
        (
            "flood",
            chat_request(&[("user", "flood")]),
            "wrote more than 16777216 bytes",
        ),
    ];
    assert!(requests[1].1.len() > 40_000, "{} bytes", requests[1].1.len());
    // All at once, as they would come.
    let answers: Vec<_> = std::thread::scope(|scope| {
        let running: Vec<_> = requests
            .iter()
            .map(|(what, body, _)| scope.spawn(|| (*what, server.post("/v1/chat/completions", body))))
            .collect();
        running.into_iter().map(|t| t.join().unwrap()).collect()
    });
    for ((what, (status, body, took)), (_, _, why)) in answers.iter().zip(&requests) {
        println!("{what}: {status} after {took:?}: {body}");
        assert_eq!(*status, 500, "{what}: {body}");
        let m = message(body);
        assert!(
            m.contains(why) && m.contains(&format!("--chat-template {}", template.display())),
            "{what}: {m}"
        );
        assert!(*took < Duration::from_secs(5), "{what} took {took:?}");
    }
    stop.store(true, Ordering::Relaxed);
    let (answered, slowest) = health.join().unwrap();
    println!("/health answered {answered} times meanwhile, the slowest in {slowest:?}");
    assert!(answered >= 5, "/health answered {answered} times");
    assert!(slowest < Duration::from_secs(1), "/health took {slowest:?}");
    // And the server serves as before.
    let (status, body, _) = server.post("/v1/chat/completions", &chat_request(&[("user", "hello")]));
    assert_eq!(status, 200, "{body}");
}

/// A template that fails on a well-formed conversation is the server's fault: 500, naming the template. A
/// template's own `raise_exception` refuses the conversation, as malformed messages are refused: 400.
#[test]
fn a_failing_chat_template_is_a_500_and_a_bad_conversation_a_400() {
    let dir = tempfile::tempdir().unwrap();
    let template = misbehaving_template(dir.path());
    let server = Server::launch(&fixture("qwen3moe/q8_0.gguf"), Some(&template), &[], Stdio::inherit());
    let named = format!(
        "(--chat-template {}): a fault of the server's chat template",
        template.display()
    );
    let cases = [
        (
            chat_request(&[("user", "filter")]),
            500,
            "failed at line 6: unknown filter",
        ),
        (
            chat_request(&[("user", "undefined")]),
            500,
            "failed at line 7: undefined value",
        ),
        (
            chat_request(&[("user", "refuse")]),
            400,
            "this template takes no such conversation",
        ),
        (
            r#"{"messages": [{"role": "user", "content": 7}]}"#.to_owned(),
            400,
            "message content must be",
        ),
        (
            r#"{"messages": [{"content": "hi"}]}"#.to_owned(),
            400,
            "missing field `role`",
        ),
    ];
    for (body, want, says) in cases {
        let (status, answer, _) = server.post("/v1/chat/completions", &body);
        let m = message(&answer);
        println!("{status}: {m}");
        assert_eq!(status, want, "{body}: {answer}");
        assert!(m.contains(says), "{m}");
        assert_eq!(status == 500, m.contains(&named), "{m}");
    }
}

/// A `--chat-template` that does not parse stops `titan serve` at start, naming the file and the line; the
/// model's own that does not parse does not (completions still work): the server starts, logs why, and
/// answers chat requests 500 with it.
#[test]
fn a_chat_template_that_does_not_parse_stops_the_server_or_its_chat() {
    let dir = tempfile::tempdir().unwrap();
    let broken = "{% for m in messages %}\n{{ m.content }}\n{% if m.role %}\n{% endfor %}";
    let file = dir.path().join("broken.jinja");
    std::fs::write(&file, broken).unwrap();
    let m = fixture("qwen3moe/q8_0.gguf");
    let o = titan()
        .args(["serve", "--listen", "127.0.0.1:0", "--chat-template"])
        .arg(&file)
        .arg("-m")
        .arg(&m)
        .output()
        .unwrap();
    let err = stderr(&o);
    println!("{err}");
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("--chat-template {}", file.display()))
            && err.contains("the chat template does not parse: chat template syntax error at line 4"),
        "{err}"
    );
    assert!(
        o.stdout.is_empty(),
        "it listened: {}",
        String::from_utf8_lossy(&o.stdout)
    );

    // The fixture model with the same template as its tokenizer.chat_template.
    let src = titan_gguf::GgufFile::open(&m).unwrap();
    let mut w = titan_gguf::GgufWriter::new();
    for (k, v) in src.metadata.iter().filter(|(k, _)| k != "tokenizer.chat_template") {
        w.set(k, v.clone());
    }
    w.set("tokenizer.chat_template", titan_gguf::Value::String(broken.into()));
    for t in &src.tensors {
        w.add_tensor(&t.name, &t.dims, t.ty).unwrap();
    }
    let data: Vec<&[u8]> = src.tensors.iter().map(|t| src.tensor_data(t)).collect();
    let mut bytes = Vec::new();
    w.write_all(&data, &mut bytes).unwrap();
    let model = dir.path().join("broken-template.gguf");
    std::fs::write(&model, bytes).unwrap();
    let log = dir.path().join("serve.log");
    let server = Server::launch(&model, None, &[], std::fs::File::create(&log).unwrap());
    let (status, body, _) = server.post("/v1/chat/completions", &chat_request(&[("user", "hi")]));
    let m = message(&body);
    println!("{status}: {m}");
    assert_eq!(status, 500, "{body}");
    assert!(
        m.starts_with("the model's chat template does not parse: chat template syntax error at line 4"),
        "{m}"
    );
    let (status, body, _) = server.post(
        "/v1/completions",
        r#"{"prompt": "The quick brown fox", "max_tokens": 2}"#,
    );
    assert_eq!(status, 200, "{body}");
    let text = log_with(&log, "does not parse");
    assert!(
        text.lines()
            .any(|l| l.contains(" ERROR ") && l.contains("the model's chat template does not parse")),
        "{text}"
    );
}

/// A prompt text longer than the context could hold whatever its tokens (more than n_ctx × the longest
/// token's bytes) is refused by its length, before tokenising: a template that writes 100 MB once made the
/// tokenizer ask for 2.4 GB at once (it aborted under a 4 GiB limit); now the server's peak memory stays a
/// few hundred MB (the template's string, then its output). The same for a 7 MB completion prompt.
#[test]
fn a_prompt_longer_than_the_context_is_refused_before_tokenising() {
    let dir = tempfile::tempdir().unwrap();
    let template = misbehaving_template(dir.path());
    // A body limit that lets the template write 100 MB (16 × 8 MB) and a completion prompt of 7 MB in.
    let server = Server::launch(
        &fixture("qwen3moe/q8_0.gguf"),
        Some(&template),
        &["--max-body", "8000000"],
        Stdio::inherit(),
    );
    let long = serde_json::json!({"prompt": "x".repeat(7_000_000), "max_tokens": 2}).to_string();
    for (path, body) in [
        ("/v1/chat/completions", chat_request(&[("user", "huge")])),
        ("/v1/completions", long),
    ] {
        let (status, answer, took) = server.post(path, &body);
        let m = message(&answer);
        println!("{path}: {status} after {took:?}: {m}");
        assert_eq!(status, 400, "{answer}");
        assert!(m.starts_with("the prompt is longer than the context: "), "{m}");
        assert!(answer.contains("context_length_exceeded"), "{answer}");
    }
    #[cfg(target_os = "linux")]
    {
        let peak = server.peak_rss();
        println!("peak RSS {} MiB", peak >> 20);
        assert!(peak < 1 << 30, "the server's peak RSS is {} MiB", peak >> 20);
    }
}

/// Whether the server has closed `s`: a read returns 0 (or fails), not a timeout.
fn closed(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 1024];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return false
            }
            Err(_) => return true,
        }
    }
}

/// A request header sent a byte a second is cut off at `--header-timeout`, as is a connection that sends
/// nothing and a kept-alive one left idle after its answer (they once stayed open for ever); a body sent
/// slowly is answered 408 at `--body-timeout`.
#[test]
fn slow_headers_idle_connections_and_slow_bodies_are_cut_off() {
    let server = Server::start(
        &fixture("qwen3moe/q8_0.gguf"),
        &["--header-timeout", "3", "--body-timeout", "3"],
    );
    let connect = || {
        let s = TcpStream::connect(server.addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
        s
    };
    let header = b"GET /health HTTP/1.1\r\nHost: test\r\nX-Padding: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
    std::thread::scope(|scope| {
        // A byte a second.
        let slow = scope.spawn(|| {
            let mut s = connect();
            let started = Instant::now();
            for &b in header.iter() {
                if s.write_all(&[b]).is_err() || closed(&mut s) {
                    return (started.elapsed(), true);
                }
                std::thread::sleep(Duration::from_secs(1));
            }
            (started.elapsed(), false)
        });
        // Nothing at all.
        let silent = scope.spawn(|| {
            let mut s = connect();
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(15) {
                if closed(&mut s) {
                    return (started.elapsed(), true);
                }
            }
            (started.elapsed(), false)
        });
        // One request answered, then idle.
        let idle = scope.spawn(|| {
            let mut s = connect();
            s.write_all(b"GET /health HTTP/1.1\r\nHost: test\r\n\r\n").unwrap();
            let mut answer = Vec::new();
            let mut b = [0u8; 1024];
            while !answer.ends_with(b"{\"status\":\"ok\"}") {
                match s.read(&mut b) {
                    Ok(n) if n > 0 => answer.extend_from_slice(&b[..n]),
                    Ok(_) => panic!("closed before the answer"),
                    Err(_) => {}
                }
            }
            assert!(
                answer.starts_with(b"HTTP/1.1 200"),
                "{}",
                String::from_utf8_lossy(&answer)
            );
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(15) {
                if closed(&mut s) {
                    return (started.elapsed(), true);
                }
            }
            (started.elapsed(), false)
        });
        // A whole header, then a body of 100 bytes a byte a second.
        let slow_body = scope.spawn(|| {
            let mut s = connect();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let started = Instant::now();
            write!(
                s,
                "POST /v1/completions HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer {KEY}\r\n\
                 Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{"
            )
            .unwrap();
            let feeder = s.try_clone().unwrap();
            std::thread::spawn(move || {
                let mut feeder = feeder;
                for _ in 0..99 {
                    std::thread::sleep(Duration::from_secs(1));
                    if feeder.write_all(b" ").is_err() {
                        return;
                    }
                }
            });
            let mut answer = String::new();
            let _ = s.read_to_string(&mut answer);
            (started.elapsed(), answer)
        });
        for (what, task) in [
            ("a byte a second", slow),
            ("silent", silent),
            ("idle after an answer", idle),
        ] {
            let (after, was_closed) = task.join().unwrap();
            println!("{what}: closed {was_closed} after {after:?}");
            assert!(was_closed, "{what}: still open after {after:?}");
            assert!(
                after > Duration::from_millis(2500) && after < Duration::from_secs(6),
                "{what}: closed after {after:?}, with --header-timeout 3"
            );
        }
        let (after, answer) = slow_body.join().unwrap();
        println!("a slow body: after {after:?}: {answer}");
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        assert!(answer.contains("did not arrive whole within 3 s"), "{answer}");
        assert!(after < Duration::from_secs(6), "{after:?}");
    });
    // Still serving.
    let (status, body, _) = server.post("/v1/completions", r#"{"prompt": "The quick", "max_tokens": 2}"#);
    assert_eq!(status, 200, "{body}");
}

/// Past `--max-connections`, a new connection is answered 503 (with Retry-After) at once and closed, however
/// many idle ones hold the rest; once they close, requests are served. Under the default limit (256), 200
/// idle connections do not stop a request from being answered.
#[test]
fn connections_past_the_limit_are_refused_at_once() {
    let m = fixture("qwen3moe/q8_0.gguf");
    let server = Server::start(&m, &["--max-connections", "8"]);
    let idle: Vec<TcpStream> = (0..8).map(|_| TcpStream::connect(server.addr()).unwrap()).collect();
    // The accept loop takes them in order; give it a moment to have taken all eight.
    std::thread::sleep(Duration::from_millis(300));
    for _ in 0..3 {
        let mut s = TcpStream::connect(server.addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let started = Instant::now();
        s.write_all(b"GET /health HTTP/1.1\r\nHost: test\r\n\r\n").unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        let took = started.elapsed();
        println!("past the limit, after {took:?}: {answer}");
        assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
        assert!(
            answer.contains("retry-after: 1") && answer.contains("--max-connections"),
            "{answer}"
        );
        assert!(took < Duration::from_secs(1), "{took:?}");
    }
    drop(idle);
    std::thread::sleep(Duration::from_millis(300));
    let (status, body, _) = server.post("/v1/completions", r#"{"prompt": "The quick", "max_tokens": 2}"#);
    assert_eq!(status, 200, "{body}");
    let metrics = get(&server, "/metrics");
    assert!(metrics.contains("titan_connections_refused_total 3"), "{metrics}");
    // The finished request's slot is not counted as active, though no step has run since (the engine
    // thread updates the gauge just after it sends the answer, so give it a moment).
    let idle_slots = (0..50).any(|_| {
        std::thread::sleep(Duration::from_millis(20));
        get(&server, "/metrics").contains("titan_active_sequences 0\n")
    });
    assert!(idle_slots, "{}", get(&server, "/metrics"));

    let server = Server::start(&m, &[]);
    let idle: Vec<TcpStream> = (0..200).map(|_| TcpStream::connect(server.addr()).unwrap()).collect();
    let (status, body, took) = server.post("/v1/completions", r#"{"prompt": "The quick", "max_tokens": 2}"#);
    println!("with {} idle connections: {status} after {took:?}", idle.len());
    assert_eq!(status, 200, "{body}");
    let metrics = get(&server, "/metrics");
    let open: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("titan_connections_open "))
        .unwrap_or_else(|| panic!("no titan_connections_open in {metrics}"))
        .parse()
        .unwrap();
    assert!(open >= 201.0, "{open} connections open: the 200 idle ones and this one");
}
