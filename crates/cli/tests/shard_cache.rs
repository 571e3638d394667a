//! A fetching worker's shard cache against what it did not write: links and FIFOs in its cache directory (with
//! a real backbone), and a backbone that sends more than a shard or assigns layers no model has (a stand-in
//! that answers as a broken or hostile backbone would). Every worker is a real `titan worker` process.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::*;

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mkfifo reads the NUL-terminated path only.
    let made = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
    assert_eq!(made, 0, "mkfifo {}", path.display());
}

/// A `.part` link to a file outside the cache (once written through: 20 bytes grew to the shard's 2.9 MB), and a
/// FIFO named like the cached shard (once blocked the worker for good): the link is removed, never followed; the
/// FIFO is skipped and reported, never opened; the shard is fetched again and the trace is one machine's.
#[test]
fn links_and_fifos_in_the_cache_are_never_followed_or_opened() {
    let dir = tempfile::tempdir().unwrap();
    let m = fixture("qwen3moe/q8_0.gguf");
    let single = dir.path().join("single.trace");
    trace(&m, &single, &[]);
    let nodes = [free_addr()];
    let caches = [dir.path().join("cache")];
    let run = |name: &str| {
        let slices = free_addr();
        let url = format!("http://{slices}");
        let out = dir.path().join(format!("{name}.trace"));
        let (_, workers) = trace_serving_slices(&m, &out, &nodes, &slices, dir.path(), || {
            let mut w = fetching_workers(&url, &caches, &nodes, dir.path(), name);
            wait_listening(&mut w);
            w
        });
        let verdict = trace_diff(&single, &out);
        assert!(verdict.starts_with("IDENTICAL"), "{verdict}");
        workers
    };
    drop(run("first"));
    let shard = std::fs::read_dir(&caches[0]).unwrap().next().unwrap().unwrap().path();
    let bytes = std::fs::read(&shard).unwrap();
    std::fs::remove_file(&shard).unwrap();
    mkfifo(&shard);
    let outside = dir.path().join("outside.txt");
    std::fs::write(&outside, b"twenty bytes, mine.\n").unwrap();
    std::os::unix::fs::symlink(&outside, shard.with_extension("part")).unwrap();

    let workers = run("second");
    let log = workers[0].log();
    println!("{log}");
    assert!(log.contains("a FIFO (named pipe), not a shard: skipped"), "{log}");
    assert!(
        log.contains("a symbolic link, not a partial download: removed"),
        "{log}"
    );
    assert_eq!(std::fs::read(&outside).unwrap(), b"twenty bytes, mine.\n");
    assert!(std::fs::symlink_metadata(&shard).unwrap().is_file());
    assert_eq!(std::fs::read(&shard).unwrap(), bytes);
    assert_eq!(downloaded(&workers[0]), bytes.len() as u64, "{log}");
}

/// A stand-in backbone on loopback: every join is answered with `assignment` (JSON), every slice request by
/// `slice`, which writes the whole response; each connection is closed after its answer.
fn backbone(assignment: String, slice: impl Fn(&mut TcpStream) + Send + 'static) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { continue };
            let mut head = Vec::new();
            let mut byte = [0u8];
            while !head.ends_with(b"\r\n\r\n") && s.read(&mut byte).unwrap_or(0) == 1 {
                head.push(byte[0]);
            }
            let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:")?.trim().parse().ok())
                .unwrap_or(0);
            let _ = s.read_exact(&mut vec![0; length]);
            if head.starts_with("post /v1/join") {
                // It knows the token: its answer carries the MAC a node checks.
                let nonce = head
                    .split("nonce=")
                    .nth(1)
                    .and_then(|n| titan_cluster::auth::unhex(n.get(..64)?))
                    .expect("a signed join");
                let mac = titan_cluster::auth::Keys::new(TOKEN.as_bytes()).answer_mac(&nonce, assignment.as_bytes());
                let _ = write!(
                    s,
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
                     X-Titan-Mac: {}\r\nConnection: close\r\n\r\n{}",
                    assignment.len(),
                    titan_cluster::auth::hex(&mac),
                    assignment
                );
            } else {
                slice(&mut s);
            }
        }
    });
    url
}

/// A fetching worker of `backbone` into `cache`, run to its end (at most `limit`).
fn fetch_from(backbone: &str, cache: &Path, dir: &Path, limit: Duration) -> Output {
    let mut child = titan()
        .args([
            "worker",
            "--backbone",
            backbone,
            "--listen",
            &free_addr(),
            "--token-file",
        ])
        .arg(token_file(dir))
        .arg("--cache-dir")
        .arg(cache)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            let o = child.wait_with_output().unwrap();
            panic!("the worker still runs after {limit:?}: {}", stderr(&o));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let o = child.wait_with_output().unwrap();
    println!("{}", stderr(&o).trim_end());
    o
}

fn cache_files(cache: &Path) -> Vec<(PathBuf, u64)> {
    std::fs::read_dir(cache)
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            let len = std::fs::symlink_metadata(&p).unwrap().len();
            (p, len)
        })
        .collect()
}

/// A backbone that streams 300 MB in place of a shard (once filled the cache and left the `.part`): the download
/// stops at the size the assignment gives the shard, and its partial file is removed; one that announces more
/// than that is refused before a byte is written.
#[test]
fn a_download_longer_than_its_shard_is_stopped_and_removed() {
    let dir = tempfile::tempdir().unwrap();
    let assignment = format!(
        r#"{{"model": "m.gguf:1:00", "shards": [[[0, 1], [0, 3]]], "sizes": [2900000], "digests": ["{}"]}}"#,
        "0".repeat(64 * 8)
    );
    let assignment = assignment.as_str();
    // No length announced: chunks of 1 MiB until the worker hangs up (300 at most).
    let endless = backbone(assignment.into(), |s| {
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n");
        let chunk = vec![0u8; 1 << 20];
        for _ in 0..300 {
            if write!(s, "{:x}\r\n", chunk.len())
                .and_then(|()| s.write_all(&chunk))
                .and_then(|()| s.write_all(b"\r\n"))
                .is_err()
            {
                return;
            }
        }
    });
    let cache = dir.path().join("cache");
    let o = fetch_from(&endless, &cache, dir.path(), Duration::from_secs(60));
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains(
            "the backbone sent more than the 2900000 bytes of the shard; the download is stopped and its partial \
             file removed"
        ),
        "{err}"
    );
    assert_eq!(cache_files(&cache), [], "the cache keeps nothing");

    // A length announced past the assignment's size: refused at the header.
    let announced = backbone(assignment.into(), |s| {
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 300000000\r\nConnection: close\r\n\r\n");
        let _ = s.write_all(&[0u8; 1 << 16]);
    });
    let o = fetch_from(&announced, &cache, dir.path(), Duration::from_secs(60));
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("the backbone sends 300000000 bytes for a shard of at most 2900000"),
        "{err}"
    );
    assert_eq!(cache_files(&cache), [], "the cache keeps nothing");
}

/// A join answered with layers 0–4e9 (once spun the worker at 100% CPU for good, walking the rectangle cell by
/// cell) or with more shards than any model has: refused before anything is computed from it.
#[test]
fn an_assignment_past_any_model_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let no_slices = |_: &mut TcpStream| panic!("a slice was asked for");
    let cases = [
        (
            r#"{"model": "m", "shards": [[[0, 4000000000], [0, 7]]]}"#.to_string(),
            "the backbone's assignment is refused: layers 0-4000000000 × experts 0-7 is not a shard of layers below \
             65536 and expert ids below 65536",
        ),
        (
            format!(
                r#"{{"model": "m", "shards": [{}]}}"#,
                vec!["[[0, 0], [0, 0]]"; 5000].join(",")
            ),
            "the backbone's assignment is refused: 5000 shards, more than 4096",
        ),
        (
            r#"{"model": "m", "shards": [[[0, 1], [0, 7]]], "sizes": [1, 2]}"#.to_string(),
            "the backbone's assignment is refused: 2 sizes for 1 shards",
        ),
    ];
    for (assignment, want) in cases {
        let url = backbone(assignment, no_slices);
        let o = fetch_from(&url, &dir.path().join("cache"), dir.path(), Duration::from_secs(20));
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(err.contains(want), "{err}");
    }
}

/// Something at the backbone's address that does not know the token answers a join: however well-formed its
/// assignment, the node refuses it (its MAC is not the token's) and downloads nothing.
#[test]
fn an_assignment_without_the_tokens_mac_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let body = format!(
        r#"{{"model": "m", "shards": [[[0, 1], [0, 7]]], "sizes": [100], "digests": ["{}"]}}"#,
        "0".repeat(64 * 16)
    );
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { continue };
            let _ = s.read(&mut [0u8; 4096]);
            let mac = "ab".repeat(32);
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nX-Titan-Mac: {mac}\r\n\
                 Connection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    let cache = dir.path().join("cache");
    let o = fetch_from(&url, &cache, dir.path(), Duration::from_secs(20));
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("its MAC is not the node token's: it does not come from a backbone that knows the token"),
        "{err}"
    );
    assert!(!cache.exists() || cache_files(&cache).is_empty());
}

/// A man in the middle between a node and its backbone swaps the shard for one cut from a copy of the model
/// with one expert's bytes changed — a shard whose own digests match its bytes, since they were computed from
/// them. The node checks every expert against the digests of the backbone's (MACed) assignment, refuses it
/// naming the expert, and keeps nothing.
#[test]
fn a_shard_swapped_on_the_way_is_refused_by_the_assignments_digests() {
    let dir = tempfile::tempdir().unwrap();
    let m = fixture("qwen3moe/q8_0.gguf");
    // The copy: one byte of expert 5 of layer 1 changed, the header (and so the model's identity) intact.
    let copy = dir.path().join("copy.gguf");
    std::fs::copy(&m, &copy).unwrap();
    let at = {
        let file = titan_gguf::GgufFile::open(&copy).unwrap();
        let t = file
            .tensor("blk.1.ffn_down_exps.weight")
            .expect("the fixture's experts");
        file.data_offset + t.offset + t.size / 8 * 5 + 40
    };
    let mut bytes = std::fs::read(&copy).unwrap();
    bytes[at as usize] ^= 0x10;
    std::fs::write(&copy, bytes).unwrap();
    let forged = dir.path().join("forged.gguf");
    let o = titan()
        .args(["slice", "--layers", "0-1", "--experts", "0-7", "-o"])
        .arg(&forged)
        .arg(&copy)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let forged = std::fs::read(&forged).unwrap();

    // The backbone, and a relay in front of it that passes joins through and answers slices with the forgery.
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
    let relay = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", relay.local_addr().unwrap());
    let swapped = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = swapped.clone();
    std::thread::spawn(move || {
        for client in relay.incoming() {
            let Ok(mut client) = client else { continue };
            let Ok(mut up) = TcpStream::connect(&slices) else {
                continue;
            };
            let (forged, flag) = (forged.clone(), flag.clone());
            std::thread::spawn(move || {
                while let Some(request) = http_message(&mut client) {
                    let slice = request.starts_with(b"GET /v1/slice");
                    if up.write_all(&request).is_err() {
                        return;
                    }
                    let Some(mut answer) = http_message(&mut up) else {
                        return;
                    };
                    let head = answer.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
                    if slice && answer.len() - head == forged.len() {
                        answer.truncate(head);
                        answer.extend_from_slice(&forged);
                        flag.store(true, std::sync::atomic::Ordering::SeqCst);
                    }
                    if client.write_all(&answer).is_err() {
                        return;
                    }
                }
            });
        }
    });
    let mut worker = titan()
        .args(["worker", "--backbone", &url, "--listen", &node, "--token-file"])
        .arg(&token)
        .arg("--cache-dir")
        .arg(dir.path().join("cache"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while worker.try_wait().unwrap().is_none() && start.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = worker.kill();
    let o = worker.wait_with_output().unwrap();
    let _ = backbone.kill();
    let _ = backbone.wait();
    let err = stderr(&o);
    assert!(
        swapped.load(std::sync::atomic::Ordering::SeqCst),
        "the relay swapped nothing: {err}"
    );
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("expert 5 of layer 1 is not the one the backbone's assignment names (its digest differs)"),
        "{err}"
    );
    assert!(
        cache_files(&dir.path().join("cache")).is_empty(),
        "the cache keeps the forgery"
    );
}

/// One HTTP/1.1 message (its head and a body of its Content-Length) read whole from `s`, if one comes.
fn http_message(s: &mut TcpStream) -> Option<Vec<u8>> {
    let mut message = Vec::new();
    let mut byte = [0u8];
    while !message.ends_with(b"\r\n\r\n") {
        if s.read(&mut byte).ok()? == 0 {
            return None;
        }
        message.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&message).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:")?.trim().parse().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    s.read_exact(&mut body).ok()?;
    message.extend_from_slice(&body);
    Some(message)
}
