//! The worker's side of the slice endpoint: join the backbone, then make the cache directory hold exactly
//! the node's assignment — reusing every cached shard that is whole and passes its digests, downloading
//! only the rest (resuming a partial download with `Range`), verifying each shard before it is renamed
//! into place.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::slice::{cover, ShardExperts, SliceSpec};
use crate::slice_http::{Assignment, Join};
use crate::ClusterError;

pub struct FetchOptions {
    /// The backbone's slice endpoint, e.g. `http://127.0.0.1:7470`.
    pub backbone: String,
    pub token: Vec<u8>,
    /// This node's address as the backbone dials it (its `--listen`).
    pub node: String,
    pub budget: u64,
    pub cache_dir: PathBuf,
    /// How long to keep trying while the backbone is unreachable or the other nodes have not joined.
    pub patience: Duration,
}

pub struct Fetched {
    /// The shard files to serve.
    pub shards: Vec<PathBuf>,
    /// Bytes received over the network this time.
    pub downloaded: u64,
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_connect(Some(Duration::from_secs(5)))
        .timeout_recv_body(Some(Duration::from_secs(60)))
        .build()
        .into()
}

/// `f` again while it fails with something worth retrying (unreachable, or not ready), until `patience`.
/// `what` names the step in the log and in the error; `backbone` is the endpoint waited for. A node started
/// before its backbone waits quietly: the first failure is logged at info, the same failure again only at
/// debug, and the answer that ends the wait at info.
fn retrying<T>(
    patience: Duration,
    backbone: &str,
    what: &'static str,
    mut f: impl FnMut() -> Result<T, Retry>,
) -> Result<T, ClusterError> {
    let start = Instant::now();
    let mut wait = Duration::from_millis(100);
    let mut last: Option<String> = None;
    loop {
        match f() {
            Ok(v) => {
                if last.is_some() {
                    tracing::info!(
                        "{what}: the backbone at {backbone} answered after {:.1?} of waiting",
                        start.elapsed()
                    );
                }
                return Ok(v);
            }
            Err(Retry::Fatal(e)) => return Err(e),
            Err(Retry::Again(e)) if start.elapsed() >= patience => {
                return Err(ClusterError::GaveUp {
                    what,
                    backbone: backbone.to_string(),
                    patience,
                    last: Box::new(e),
                })
            }
            Err(Retry::Again(e)) => {
                let why = e.to_string();
                if last.as_deref() == Some(why.as_str()) {
                    tracing::debug!("waiting for the backbone at {backbone}: {what}: {why}; again in {wait:?}");
                } else {
                    tracing::info!("waiting for the backbone at {backbone}: {what}: {why}");
                    last = Some(why);
                }
                std::thread::sleep(wait);
                wait = (wait * 2).min(Duration::from_secs(5));
            }
        }
    }
}

enum Retry {
    Again(ClusterError),
    Fatal(ClusterError),
}

/// A response's status and text: 401/403/400 are final, 5xx and 409 are worth another try.
fn classify(status: u16, body: &str) -> Retry {
    let e = ClusterError::BackboneAnswered {
        status,
        body: body.trim().to_string(),
    };
    if status >= 500 || status == 409 {
        Retry::Again(e)
    } else {
        Retry::Fatal(e)
    }
}

/// Joins the backbone and brings `cache_dir` to the node's assignment; `progress(done, total)` in bytes.
pub fn fetch(o: &FetchOptions, progress: &mut dyn FnMut(u64, u64)) -> Result<Fetched, ClusterError> {
    let agent = agent();
    let auth = format!("Bearer {}", String::from_utf8_lossy(&o.token));
    let join = serde_json::to_vec(&Join {
        node: o.node.clone(),
        budget: o.budget,
    })
    .map_err(|error| ClusterError::Json {
        what: "writing the join",
        error,
    })?;
    let assignment: Assignment = retrying(o.patience, &o.backbone, "joining the backbone", || {
        let mut r = agent
            .post(format!("{}/v1/join", o.backbone))
            .header("Authorization", &auth)
            .content_type("application/json")
            .send(&join[..])
            .map_err(|e| Retry::Again(e.into()))?;
        let status = r.status().as_u16();
        let body = r.body_mut().read_to_string().map_err(|e| Retry::Again(e.into()))?;
        if status != 200 {
            return Err(classify(status, &body));
        }
        serde_json::from_str(&body).map_err(|error| {
            Retry::Fatal(ClusterError::Json {
                what: "reading the assignment",
                error,
            })
        })
    })?;

    let dir = o.cache_dir.display();
    std::fs::create_dir_all(&o.cache_dir).map_err(ClusterError::io(format!("creating {dir}")))?;
    let prefix = blake3::hash(assignment.model.as_bytes()).to_hex()[..16].to_string();
    let wanted: Vec<SliceSpec> = assignment
        .shards
        .iter()
        .map(|&((l0, l1), (e0, e1))| SliceSpec {
            layers: l0..=l1,
            experts: e0..=e1,
        })
        .collect();
    let want = |l: usize, e: usize| wanted.iter().any(|s| s.contains(l, e));

    // What the cache already holds, whole and verified; a damaged file is removed and fetched again.
    let mut keep: Vec<(PathBuf, SliceSpec)> = Vec::new();
    let reading = || ClusterError::io(format!("reading the cache directory {dir}"));
    for entry in std::fs::read_dir(&o.cache_dir).map_err(reading())? {
        let path = entry.map_err(reading())?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if !(name.starts_with(&prefix) && name.ends_with(".gguf")) {
            continue;
        }
        match ShardExperts::open(&path, true) {
            Ok(s) if s.model == assignment.model => {
                let useful = s
                    .spec
                    .layers
                    .clone()
                    .any(|l| s.spec.experts.clone().any(|e| want(l, e)));
                if useful {
                    keep.push((path, s.spec.clone()));
                }
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!("cached shard is damaged, fetching it again: {e}");
                std::fs::remove_file(&path).map_err(ClusterError::io(format!("removing {}", path.display())))?;
            }
        }
    }
    let (n_layer, n_expert) = wanted.iter().fold((0, 0), |(l, e), s| {
        (l.max(s.layers.end() + 1), e.max(s.experts.end() + 1))
    });
    let missing = cover(n_layer, n_expert, |l, e| {
        want(l, e) && !keep.iter().any(|(_, s)| s.contains(l, e))
    });

    let mut downloaded = 0;
    for spec in &missing {
        let name = format!(
            "{prefix}-L{}-{}-E{}-{}.gguf",
            spec.layers.start(),
            spec.layers.end(),
            spec.experts.start(),
            spec.experts.end()
        );
        let path = o.cache_dir.join(name);
        downloaded += download(&agent, o, &auth, spec, &path, &assignment.model, progress)?;
        keep.push((path, spec.clone()));
    }
    Ok(Fetched {
        shards: keep.into_iter().map(|(p, _)| p).collect(),
        downloaded,
    })
}

/// Downloads the shard `spec` into `path` (via `path.part`, resumed if present), verifies it, and renames
/// it into place. Returns the bytes received.
fn download(
    agent: &ureq::Agent,
    o: &FetchOptions,
    auth: &str,
    spec: &SliceSpec,
    path: &Path,
    model: &str,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<u64, ClusterError> {
    let part = path.with_extension("part");
    let url = format!(
        "{}/v1/slice?node={}&layers={}-{}&experts={}-{}",
        o.backbone,
        o.node,
        spec.layers.start(),
        spec.layers.end(),
        spec.experts.start(),
        spec.experts.end()
    );
    let writing = |error: std::io::Error| ClusterError::Io {
        what: format!("writing {}", part.display()),
        error,
    };
    let mut received = 0u64;
    for attempt in 0..2 {
        retrying(o.patience, &o.backbone, "downloading a shard", || {
            let have = std::fs::metadata(&part).map_or(0, |m| m.len());
            let mut req = agent.get(&url).header("Authorization", auth);
            if have > 0 {
                req = req.header("Range", format!("bytes={have}-"));
            }
            let mut r = req.call().map_err(|e| Retry::Again(e.into()))?;
            let status = r.status().as_u16();
            let (mut file, total, start) = match status {
                200 => {
                    let total = r
                        .headers()
                        .get("content-length")
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0);
                    (File::create(&part).map_err(|e| Retry::Fatal(writing(e)))?, total, 0)
                }
                206 => {
                    let total = r
                        .headers()
                        .get("content-range")
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.rsplit('/').next())
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0);
                    (
                        OpenOptions::new()
                            .append(true)
                            .open(&part)
                            .map_err(|e| Retry::Fatal(writing(e)))?,
                        total,
                        have,
                    )
                }
                416 => {
                    // The partial file is already whole (or longer than the shard): start over.
                    let _ = std::fs::remove_file(&part);
                    return Err(Retry::Again(ClusterError::PartialTooLong));
                }
                _ => return Err(classify(status, &r.body_mut().read_to_string().unwrap_or_default())),
            };
            let mut reader = r.body_mut().as_reader();
            let mut buf = vec![0u8; 1 << 20];
            let mut at = start;
            loop {
                let n = reader
                    .read(&mut buf)
                    .map_err(|error| Retry::Again(ClusterError::DownloadCut { at, error }))?;
                if n == 0 {
                    break;
                }
                file.write_all(&buf[..n]).map_err(|e| Retry::Fatal(writing(e)))?;
                at += n as u64;
                received += n as u64;
                progress(at, total);
            }
            file.sync_all().map_err(|e| Retry::Fatal(writing(e)))?;
            Ok(())
        })?;
        match ShardExperts::open(&part, true) {
            Ok(s) if s.model == model && s.spec == *spec => {
                std::fs::rename(&part, path)
                    .map_err(ClusterError::io(format!("renaming {} into place", part.display())))?;
                return Ok(received);
            }
            Ok(_) => return Err(ClusterError::WrongShard { path: part }),
            Err(e) if attempt == 0 => {
                tracing::warn!("downloaded shard failed its check, fetching it again: {e}");
                std::fs::remove_file(&part).map_err(ClusterError::io(format!("removing {}", part.display())))?;
            }
            Err(e) => return Err(e.into()),
        }
    }
    unreachable!("the second attempt returns")
}
