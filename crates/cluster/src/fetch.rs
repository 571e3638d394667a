//! The worker's side of the slice endpoint: join the backbone, then make the cache directory hold exactly
//! the node's assignment — reusing every cached shard that is whole and passes its digests, downloading
//! only the rest (resuming a partial download with `Range`), verifying each shard before it is renamed
//! into place.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::auth::{self, Keys, Signed};
use crate::slice::{ShardExperts, SliceSpec};
use crate::slice_http::{Assignment, Join, ANSWER_MAC};
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
    let keys = Keys::new(&o.token);
    let join = serde_json::to_vec(&Join {
        node: o.node.clone(),
        budget: o.budget,
    })
    .map_err(|error| ClusterError::Json {
        what: "writing the join",
        error,
    })?;
    let assignment: Assignment = retrying(o.patience, &o.backbone, "joining the backbone", || {
        let signed = Signed::new(&keys, "POST", "/v1/join", &join)
            .map_err(|e| Retry::Fatal(ClusterError::io("signing the join")(e)))?;
        let mut r = agent
            .post(format!("{}/v1/join", o.backbone))
            .header("Authorization", &signed.header())
            .content_type("application/json")
            .send(&join[..])
            .map_err(|e| Retry::Again(e.into()))?;
        let status = r.status().as_u16();
        let mac = r
            .headers()
            .get(ANSWER_MAC)
            .and_then(|v| v.to_str().ok())
            .and_then(auth::unhex);
        let body = r.body_mut().read_to_string().map_err(|e| Retry::Again(e.into()))?;
        if status != 200 {
            return Err(classify(status, &body));
        }
        // The assignment, and the digests in it, only from a backbone that knows the token.
        if !mac.is_some_and(|m| auth::same(&m, &keys.answer_mac(&signed.nonce, body.as_bytes()))) {
            return Err(Retry::Fatal(ClusterError::BadAssignment(
                "its MAC is not the node token's: it does not come from a backbone that knows the token".into(),
            )));
        }
        serde_json::from_str(&body).map_err(|error| {
            Retry::Fatal(ClusterError::Json {
                what: "reading the assignment",
                error,
            })
        })
    })?;

    let shards = assignment.checked()?;

    let dir = o.cache_dir.display();
    std::fs::create_dir_all(&o.cache_dir).map_err(ClusterError::io(format!("creating {dir}")))?;
    let prefix = blake3::hash(assignment.model.as_bytes()).to_hex()[..16].to_string();
    let wanted: Vec<SliceSpec> = shards.iter().map(|(s, _)| s.clone()).collect();

    // What the cache already holds, whole and verified; a damaged file is removed and fetched again.
    let mut keep: Vec<(PathBuf, SliceSpec)> = Vec::new();
    let reading = || ClusterError::io(format!("reading the cache directory {dir}"));
    for entry in std::fs::read_dir(&o.cache_dir).map_err(reading())? {
        let path = entry.map_err(reading())?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let part = name.ends_with(".part");
        if !(name.starts_with(&prefix) && (name.ends_with(".gguf") || part)) {
            continue;
        }
        // Never through a link, never into a FIFO (opening one blocks until someone writes to it): the type
        // of the entry itself, before anything opens it.
        let ty = std::fs::symlink_metadata(&path)
            .map_err(ClusterError::io(format!("reading {}", path.display())))?
            .file_type();
        if !ty.is_file() {
            if part {
                tracing::warn!("{}: {}, not a partial download: removed", path.display(), describe(ty));
                remove(&path)?;
            } else {
                tracing::warn!("{}: {}, not a shard: skipped", path.display(), describe(ty));
            }
            continue;
        }
        if part {
            continue;
        }
        match ShardExperts::open(&path, true) {
            // A shard is served whole, so it is kept only if all of it is assigned — every expert's digest
            // then checked against the backbone's.
            Ok(s) if s.model == assignment.model && within(&assignment, &s.spec) => match agrees(&assignment, &s) {
                Ok(()) => keep.push((path, s.spec.clone())),
                Err((l, e)) => {
                    tracing::warn!(
                        "cached shard {}: expert {e} of layer {l} is not the backbone's (its digest differs): \
                         fetching it again",
                        path.display()
                    );
                    remove(&path)?;
                }
            },
            Ok(_) => {}
            Err(e) => {
                tracing::warn!("cached shard is damaged, fetching it again: {e}");
                remove(&path)?;
            }
        }
    }
    let have: Vec<SliceSpec> = keep.iter().map(|(_, s)| s.clone()).collect();

    let mut downloaded = 0;
    for spec in missing(&wanted, &have) {
        let name = format!(
            "{prefix}-L{}-{}-E{}-{}.gguf",
            spec.layers.start(),
            spec.layers.end(),
            spec.experts.start(),
            spec.experts.end()
        );
        // A shard cut otherwise than the assignment's (part of it was cached) is no longer than the shards
        // of the assignment it takes cells from: one header instead of several, the same experts.
        let limit = shards
            .iter()
            .filter(|(s, _)| overlap(s, &spec))
            .try_fold(0u64, |sum, (_, size)| Some(sum.saturating_add((*size)?)));
        let path = o.cache_dir.join(name);
        downloaded += download(&agent, o, &keys, &spec, limit, &path, &assignment, progress)?;
        keep.push((path, spec));
    }
    Ok(Fetched {
        shards: keep.into_iter().map(|(p, _)| p).collect(),
        downloaded,
    })
}

/// Whether every cell of `spec` is assigned.
fn within(assignment: &Assignment, spec: &SliceSpec) -> bool {
    spec.layers
        .clone()
        .all(|l| spec.experts.clone().all(|e| assignment.digest(l, e).is_some()))
}

/// Whether every expert of `shard` (its bytes checked against its own digests when opened) has the digest
/// the backbone gives it; else the first that does not, as (layer, expert).
fn agrees(assignment: &Assignment, shard: &ShardExperts) -> Result<(), (usize, usize)> {
    for l in shard.spec.layers.clone() {
        for e in shard.spec.experts.clone() {
            if shard.digest(l, e).is_none() || shard.digest(l, e) != assignment.digest(l, e) {
                return Err((l, e));
            }
        }
    }
    Ok(())
}

/// Whether two rectangles share a cell.
fn overlap(a: &SliceSpec, b: &SliceSpec) -> bool {
    let meet = |x: &RangeInclusive<usize>, y: &RangeInclusive<usize>| x.start() <= y.end() && y.start() <= x.end();
    meet(&a.layers, &b.layers) && meet(&a.experts, &b.experts)
}

/// The cells of `wanted` in none of `have`, as the fewest rectangles `cover` would cut them into: each band
/// of layers' runs of expert ids, merged across consecutive bands with the same run. Computed band by band
/// between the rectangles' edges, and run by run within a band, never cell by cell: the work grows with the
/// number of rectangles, not with how wide they are.
fn missing(wanted: &[SliceSpec], have: &[SliceSpec]) -> Vec<SliceSpec> {
    let mut edges: Vec<usize> = wanted
        .iter()
        .chain(have)
        .flat_map(|s| [*s.layers.start(), s.layers.end().saturating_add(1)])
        .collect();
    edges.sort_unstable();
    edges.dedup();
    let (mut open, mut done): (Vec<SliceSpec>, Vec<SliceSpec>) = (Vec::new(), Vec::new());
    for band in edges.windows(2) {
        let (first, last) = (band[0], band[1] - 1);
        let runs = |specs: &[SliceSpec]| {
            let mut runs: Vec<(usize, usize)> = specs
                .iter()
                .filter(|s| s.layers.contains(&first))
                .map(|s| (*s.experts.start(), *s.experts.end()))
                .collect();
            runs.sort_unstable();
            let mut merged: Vec<(usize, usize)> = Vec::with_capacity(runs.len());
            for (a, b) in runs {
                match merged.last_mut() {
                    Some(m) if a <= m.1.saturating_add(1) => m.1 = m.1.max(b),
                    _ => merged.push((a, b)),
                }
            }
            merged
        };
        let holes = runs(have);
        let mut next = Vec::new();
        for (a, b) in runs(wanted) {
            // What `have` leaves of the run a..=b, piece by piece (both lists ascending and disjoint).
            let (mut pieces, mut at) = (Vec::new(), Some(a));
            for &(x, y) in &holes {
                let Some(from) = at.filter(|&from| x <= b && from <= y) else {
                    continue;
                };
                if from < x {
                    pieces.push(from..=x - 1);
                }
                at = y.checked_add(1).filter(|&next| next <= b);
            }
            pieces.extend(at.map(|from| from..=b));
            for r in pieces {
                match open
                    .iter()
                    .position(|s| s.experts == r && s.layers.end().checked_add(1) == Some(first))
                {
                    Some(i) => {
                        let s = open.swap_remove(i);
                        next.push(SliceSpec {
                            layers: *s.layers.start()..=last,
                            experts: r,
                        });
                    }
                    None => next.push(SliceSpec {
                        layers: first..=last,
                        experts: r,
                    }),
                }
            }
        }
        done.append(&mut open);
        open = next;
    }
    done.append(&mut open);
    done.sort_by_key(|s| (*s.layers.start(), *s.experts.start()));
    done
}

/// A file type as a message names it.
fn describe(ty: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if ty.is_symlink() {
        "a symbolic link"
    } else if ty.is_dir() {
        "a directory"
    } else if ty.is_fifo() {
        "a FIFO (named pipe)"
    } else if ty.is_socket() {
        "a socket"
    } else if ty.is_char_device() || ty.is_block_device() {
        "a device"
    } else {
        "not a regular file"
    }
}

/// Removes a file of the cache directory (a link itself, never what it points to).
fn remove(path: &Path) -> Result<(), ClusterError> {
    std::fs::remove_file(path).map_err(ClusterError::io(format!("removing {}", path.display())))
}

/// The bytes a partial download `part` holds: 0 if there is none, or if what is there is not a regular file
/// (a link, a FIFO…), which is removed rather than written through.
fn partial_len(part: &Path) -> Result<u64, ClusterError> {
    match std::fs::symlink_metadata(part) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(ClusterError::Io {
            what: format!("reading {}", part.display()),
            error: e,
        }),
        Ok(m) if m.file_type().is_file() => Ok(m.len()),
        Ok(m) => {
            tracing::warn!(
                "{}: {}, not a partial download: removed",
                part.display(),
                describe(m.file_type())
            );
            remove(part).map(|()| 0)
        }
    }
}

/// Opens the partial download `part` for writing, from its end (`append`) or emptied: never through a
/// symbolic link (O_NOFOLLOW) and never blocking on a FIFO (O_NONBLOCK), then refused unless it is a regular
/// file, whatever appeared there since it was looked at.
fn open_part(part: &Path, append: bool) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut o = OpenOptions::new();
    o.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
    if append {
        o.append(true);
    } else {
        o.write(true).create(true).truncate(true);
    }
    let file = o.open(part)?;
    if !file.metadata()?.file_type().is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    Ok(file)
}

/// Downloads the shard `spec` into `path` (via `path.part`, resumed if present), verifies it, and renames
/// it into place; at most `limit` bytes (the shard's size, from the assignment), or as many as the backbone
/// says the shard has where the assignment does not say. Returns the bytes received. A download that fails
/// for good leaves no partial file: one is kept only by a process stopped mid-download, to resume.
#[allow(clippy::too_many_arguments)]
fn download(
    agent: &ureq::Agent,
    o: &FetchOptions,
    keys: &Keys,
    spec: &SliceSpec,
    limit: Option<u64>,
    path: &Path,
    assignment: &Assignment,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<u64, ClusterError> {
    let part = path.with_extension("part");
    let result = download_part(agent, o, keys, spec, limit, path, &part, assignment, progress);
    if result.is_err() {
        // Best effort: the error being returned says more than a failure to clean up after it.
        let _ = std::fs::remove_file(&part);
    }
    result
}

#[allow(clippy::too_many_arguments)]
fn download_part(
    agent: &ureq::Agent,
    o: &FetchOptions,
    keys: &Keys,
    spec: &SliceSpec,
    limit: Option<u64>,
    path: &Path,
    part: &Path,
    assignment: &Assignment,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<u64, ClusterError> {
    let target = format!(
        "/v1/slice?node={}&layers={}-{}&experts={}-{}",
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
    let too_long = |what: String| {
        Retry::Fatal(ClusterError::ShardSize {
            path: part.to_path_buf(),
            what,
        })
    };
    let mut received = 0u64;
    for attempt in 0..2 {
        retrying(o.patience, &o.backbone, "downloading a shard", || {
            let have = partial_len(part).map_err(Retry::Fatal)?;
            let signed = Signed::new(keys, "GET", &target, &[])
                .map_err(|e| Retry::Fatal(ClusterError::io("signing a download")(e)))?;
            let mut req = agent
                .get(format!("{}{target}", o.backbone))
                .header("Authorization", &signed.header());
            if have > 0 {
                req = req.header("Range", format!("bytes={have}-"));
            }
            let mut r = req.call().map_err(|e| Retry::Again(e.into()))?;
            let status = r.status().as_u16();
            let header = |name: &str| r.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
            let (file, total, start) = match status {
                200 => {
                    let total = header("content-length").and_then(|v| v.parse().ok());
                    (open_part(part, false).map_err(|e| Retry::Fatal(writing(e)))?, total, 0)
                }
                206 => {
                    let total = header("content-range").and_then(|v| v.rsplit('/').next()?.parse().ok());
                    (
                        open_part(part, true).map_err(|e| Retry::Fatal(writing(e)))?,
                        total,
                        have,
                    )
                }
                416 => {
                    // The partial file is already whole (or longer than the shard): start over.
                    let _ = std::fs::remove_file(part);
                    return Err(Retry::Again(ClusterError::PartialTooLong));
                }
                _ => return Err(classify(status, &r.body_mut().read_to_string().unwrap_or_default())),
            };
            // The assignment's size bounds the body; the backbone's own word for it must keep within it.
            let limit = match (limit, total) {
                (Some(limit), Some(total)) if total > limit => {
                    return Err(too_long(format!(
                        "the backbone sends {total} bytes for a shard of at most {limit}"
                    )))
                }
                (_, Some(total)) => total,
                (Some(limit), None) => limit,
                (None, None) => return Err(too_long("the backbone gives the shard no length".into())),
            };
            let mut file = file;
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
                if at + n as u64 > limit {
                    return Err(too_long(format!(
                        "the backbone sent more than the {limit} bytes of the shard"
                    )));
                }
                file.write_all(&buf[..n]).map_err(|e| Retry::Fatal(writing(e)))?;
                at += n as u64;
                received += n as u64;
                progress(at, limit);
            }
            file.sync_all().map_err(|e| Retry::Fatal(writing(e)))?;
            Ok(())
        })?;
        match ShardExperts::open(part, true) {
            Ok(s) if s.model == assignment.model && s.spec == *spec => {
                if let Err((l, e)) = agrees(assignment, &s) {
                    return Err(ClusterError::ForeignShard {
                        path: part.to_path_buf(),
                        layer: l,
                        expert: e,
                    });
                }
                std::fs::rename(part, path)
                    .map_err(ClusterError::io(format!("renaming {} into place", part.display())))?;
                return Ok(received);
            }
            Ok(_) => {
                return Err(ClusterError::WrongShard {
                    path: part.to_path_buf(),
                })
            }
            Err(e) if attempt == 0 => {
                tracing::warn!("downloaded shard failed its check, fetching it again: {e}");
                remove(part)?;
            }
            Err(e) => return Err(e.into()),
        }
    }
    unreachable!("the second attempt returns")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slice::cover;

    fn spec(l: (usize, usize), e: (usize, usize)) -> SliceSpec {
        SliceSpec {
            layers: l.0..=l.1,
            experts: e.0..=e.1,
        }
    }

    /// Band by band, the same rectangles as `cover` cell by cell, on small random cases.
    #[test]
    fn missing_cuts_what_cover_cuts() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |n: usize| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % n as u64) as usize
        };
        for _ in 0..500 {
            let (w, h) = (1 + next(4), next(4));
            let mut rects = |count: usize| -> Vec<SliceSpec> {
                (0..count)
                    .map(|_| {
                        let (l, e) = (next(6), next(9));
                        spec((l, l + next(3)), (e, e + next(4)))
                    })
                    .collect()
            };
            let (wanted, have) = (rects(w), rects(h));
            let cell =
                |l: usize, e: usize| wanted.iter().any(|s| s.contains(l, e)) && !have.iter().any(|s| s.contains(l, e));
            assert_eq!(missing(&wanted, &have), cover(9, 13, cell), "{wanted:?} less {have:?}");
        }
    }

    /// An assignment as wide as the bounds allow is subtracted at once, not cell by cell (2^32 cells here).
    #[test]
    fn wide_ranges_cost_no_more_than_narrow_ones() {
        let max = (1 << 16) - 1;
        let wanted = [spec((0, max), (0, max))];
        let have = [spec((3, 5), (10, 20))];
        let t = std::time::Instant::now();
        let m = missing(&wanted, &have);
        assert!(t.elapsed() < std::time::Duration::from_secs(1));
        assert_eq!(
            m,
            [
                spec((0, 2), (0, max)),
                spec((3, 5), (0, 9)),
                spec((3, 5), (21, max)),
                spec((6, max), (0, max)),
            ]
        );
    }
}
