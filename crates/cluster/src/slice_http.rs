//! The backbone's slice endpoint: expert nodes join, receive their assignment, and download exactly the
//! shards of it, over HTTP, each request signed with a key derived from the node token.
//!
//! - `POST /v1/join` `{"node": "HOST:PORT", "budget": BYTES}`: a node of `--nodes` announces itself. Once
//!   every expected node has joined, the plan is made from their budgets, and each join is answered with
//!   the model's identity, the node's shards (layers × expert-id rectangles), each shard's size and every
//!   expert's digest as this backbone computes it from its own model — the digests the node checks its
//!   shards against, not the shards' own.
//! - `GET /v1/slice?node=HOST:PORT&layers=A-B&experts=X-Y`: a shard, cut from the model while it is
//!   sent (never held whole in memory), with `Range` support so a download resumes; only rectangles
//!   inside that node's assignment are served. Its header carries every expert's digest.
//!
//! Every request carries `Authorization: Titan time=T, nonce=N, mac=M` ([`auth::Signed`]): a MAC under a key
//! derived from the node token over its method, path and query, time, nonce and body — the token never
//! crosses the wire. A request without a valid MAC, older or newer than five minutes, or whose nonce was
//! seen before, is a 401. A join's answer carries `X-Titan-Mac`, the MAC of the request's nonce and the
//! answer's body, so that a node trusts an assignment (and its digests) only from a backbone that knows
//! the token. No request names a file; bodies are at most 16 KiB; a client that stops reading for a minute
//! is cut off.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Query, State};
use axum::http::{header, HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::{Deserialize, Serialize};
use titan_gguf::GgufFile;
use tokio::sync::watch;

use crate::auth::{self, Keys, Nonce, Signed};
use crate::plan::{Placement, Plan};
use crate::slice::{cover, parse_range, Digests, Shard, SliceSpec};
use crate::ClusterError;

pub struct SliceServerOptions {
    pub listen: String,
    pub token: Vec<u8>,
    /// The nodes expected to join, as the backbone will dial them.
    pub nodes: Vec<String>,
    pub placement: Placement,
    pub replicas: usize,
    /// (layer, expert)s given a second node, as the backbone's plan does.
    pub hot: Vec<(usize, usize)>,
}

#[derive(Serialize, Deserialize)]
pub struct Join {
    pub node: String,
    pub budget: u64,
}

impl Join {
    /// A join's body as the endpoint reads it (public so the fuzz target reads it the same way).
    pub fn parse(body: &[u8]) -> Result<Join, String> {
        serde_json::from_slice(body)
            .map_err(|e| format!("a join is {{\"node\": \"HOST:PORT\", \"budget\": BYTES}}: {e}"))
    }
}

/// A join's answer: what to download.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Assignment {
    pub model: String,
    pub shards: Vec<crate::proto::Held>,
    /// Each shard's length in bytes, so a node stops a download that runs longer (empty from a backbone
    /// older than the field).
    #[serde(default)]
    pub sizes: Vec<u64>,
    /// Each shard's experts' digests, layer-major, 64 hex digits each, one string per shard: what the
    /// node checks every shard it serves against (a shard's own digests certify only themselves). Missing
    /// is refused by [`Assignment::checked`], with the reason.
    #[serde(default)]
    pub digests: Vec<String>,
}

/// The header of a join's answer that carries its MAC.
pub const ANSWER_MAC: &str = "x-titan-mac";

/// An assignment's bounds: far above any model (a few hundred layers, a few hundred experts a layer, a shard
/// per run of expert ids), and low enough that nothing a node computes from an assignment is large.
pub const MAX_LAYERS: usize = 1 << 16;
pub const MAX_EXPERTS: usize = 1 << 16;
pub const MAX_SHARDS: usize = 1 << 12;

impl Assignment {
    /// The shards, each with its size where the backbone gives one, checked against the bounds before a node
    /// computes anything from them: ranges that run forwards, below [`MAX_LAYERS`] and [`MAX_EXPERTS`], at
    /// most [`MAX_SHARDS`] of them, and a size for each or none at all.
    pub fn checked(&self) -> Result<Vec<(SliceSpec, Option<u64>)>, ClusterError> {
        let bad = |what: String| Err(ClusterError::BadAssignment(what));
        if self.shards.len() > MAX_SHARDS {
            return bad(format!("{} shards, more than {MAX_SHARDS}", self.shards.len()));
        }
        if !self.sizes.is_empty() && self.sizes.len() != self.shards.len() {
            return bad(format!("{} sizes for {} shards", self.sizes.len(), self.shards.len()));
        }
        if self.digests.len() > self.shards.len() {
            return bad(format!(
                "{} digest lists for {} shards",
                self.digests.len(),
                self.shards.len()
            ));
        }
        let mut shards = Vec::with_capacity(self.shards.len());
        for (i, &((l0, l1), (e0, e1))) in self.shards.iter().enumerate() {
            if l0 > l1 || e0 > e1 || l1 >= MAX_LAYERS || e1 >= MAX_EXPERTS {
                return bad(format!(
                    "layers {l0}-{l1} × experts {e0}-{e1} is not a shard of layers below {MAX_LAYERS} and expert \
                     ids below {MAX_EXPERTS}"
                ));
            }
            let cells = (l1 - l0 + 1) * (e1 - e0 + 1);
            let Some(digests) = self.digests.get(i) else {
                return bad(format!("no digests for layers {l0}-{l1} × experts {e0}-{e1}"));
            };
            if digests.len() != 64 * cells || !digests.bytes().all(|b| b.is_ascii_hexdigit()) {
                return bad(format!(
                    "the digests of layers {l0}-{l1} × experts {e0}-{e1} are not {cells} of 64 hex digits"
                ));
            }
            let spec = SliceSpec {
                layers: l0..=l1,
                experts: e0..=e1,
            };
            shards.push((spec, self.sizes.get(i).copied()));
        }
        Ok(shards)
    }

    /// The digest the backbone gives expert `e` of layer `l`, if it assigns it (on a checked assignment).
    pub fn digest(&self, l: usize, e: usize) -> Option<&str> {
        self.shards
            .iter()
            .zip(&self.digests)
            .find_map(|(&((l0, l1), (e0, e1)), d)| {
                let inside = (l0..=l1).contains(&l) && (e0..=e1).contains(&e);
                let i = (l - l0).checked_mul(e1 - e0 + 1)? + (e - e0);
                inside.then(|| d.get(64 * i..64 * i + 64)).flatten()
            })
    }
}

struct Shared {
    model: Arc<GgufFile>,
    identity: String,
    n_layer: usize,
    /// Layers 0..dense have no experts.
    dense: usize,
    /// Which layers have experts (Llama 4 interleaves dense layers between them too).
    moe: Vec<bool>,
    n_expert: usize,
    opts: SliceServerOptions,
    keys: Keys,
    /// The nonces of the requests accepted in the last [`auth::REQUEST_SKEW`] × 2 seconds, with their times:
    /// a request sent again is refused.
    seen: Mutex<HashMap<Nonce, u64>>,
    digests: Digests,
    budgets: Mutex<Vec<Option<u64>>>,
    plan: watch::Sender<Option<Arc<Plan>>>,
}

/// The running endpoint; it stops when dropped.
pub struct SliceServer {
    pub addr: SocketAddr,
    plan: watch::Receiver<Option<Arc<Plan>>>,
    runtime: tokio::runtime::Runtime,
}

impl SliceServer {
    /// Starts serving `model`'s slices on `opts.listen`.
    pub fn start(model: Arc<GgufFile>, opts: SliceServerOptions) -> Result<SliceServer, ClusterError> {
        let config = titan_engine::Config::from_gguf(&model)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(ClusterError::io("starting the slice endpoint's threads"))?;
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind(&opts.listen))
            .map_err(|error| ClusterError::Listen {
                addr: opts.listen.clone(),
                error,
            })?;
        let addr = listener
            .local_addr()
            .map_err(ClusterError::io("reading the slice endpoint's address"))?;
        let (tx, rx) = watch::channel(None);
        let n = opts.nodes.len();
        let shared = Arc::new(Shared {
            identity: titan_layout::ModelIdentity::of(&model)?.to_string(),
            digests: Digests::new(&model)?,
            n_layer: config.n_layer,
            dense: config.dense_lead,
            moe: (0..config.n_layer).map(|l| config.is_moe(l)).collect(),
            n_expert: config.n_expert,
            model,
            keys: Keys::new(&opts.token),
            seen: Mutex::new(HashMap::new()),
            opts,
            budgets: Mutex::new(vec![None; n]),
            plan: tx,
        });
        let app = Router::new()
            .route("/v1/join", post(join))
            .route("/v1/slice", get(slice))
            .layer(DefaultBodyLimit::max(16 << 10))
            .with_state(shared);
        runtime.spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!("the slice endpoint stopped: {e}");
            }
        });
        Ok(SliceServer {
            addr,
            plan: rx,
            runtime,
        })
    }

    /// Waits until every expected node has joined and the plan is made.
    pub fn wait_for_plan(&self, timeout: Duration) -> Result<Arc<Plan>, ClusterError> {
        let mut rx = self.plan.clone();
        self.runtime.block_on(async {
            tokio::time::timeout(timeout, rx.wait_for(Option::is_some))
                .await
                .map_err(|_| ClusterError::JoinTimeout(timeout))?
                .map_err(|_| ClusterError::SliceServerStopped)?;
            Ok(rx.borrow().clone().expect("waited for it"))
        })
    }
}

fn error(status: StatusCode, msg: impl Into<String>) -> Response {
    (status, msg.into()).into_response()
}

/// Requests remembered at most, against replays: far above what any number of nodes sends in ten minutes.
const SEEN_MAX: usize = 1 << 16;

/// The request's nonce if it is signed with the node token's key, recently and for the first time; else
/// its refusal.
fn authorised(
    s: &Shared,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Nonce, Box<Response>> {
    let refuse = |why: &str| Box::new(error(StatusCode::UNAUTHORIZED, why));
    let target = uri.path_and_query().map_or(uri.path(), |p| p.as_str());
    let signed = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(Signed::parse)
        .ok_or_else(|| refuse("a request signed with the node token is required (Authorization: Titan …)"))?;
    if !signed.signs(&s.keys, method.as_str(), target, body) {
        return Err(refuse(
            "the request's signature is not the node token's, or its time is more than five minutes off",
        ));
    }
    let mut seen = s.seen.lock().unwrap_or_else(|e| e.into_inner());
    let now = auth::now();
    seen.retain(|_, &mut t| now.abs_diff(t) <= 2 * auth::REQUEST_SKEW);
    if seen.len() >= SEEN_MAX {
        return Err(Box::new(error(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many requests: try again",
        )));
    }
    if seen.insert(signed.nonce, signed.time).is_some() {
        return Err(refuse("this request was sent before: a replay"));
    }
    Ok(signed.nonce)
}

/// The index of `node` in `--nodes`, or the refusal of a node this backbone does not expect.
fn node_index(s: &Shared, node: &str) -> Result<usize, Box<Response>> {
    s.opts.nodes.iter().position(|n| n == node).ok_or_else(|| {
        Box::new(error(
            StatusCode::FORBIDDEN,
            format!(
                "node {node} is not one this backbone expects ({})",
                s.opts.nodes.join(", ")
            ),
        ))
    })
}

/// The shards of node `i` under `plan`: the rectangles covering what it serves, in the layers that have
/// experts (a shard holds no dense layer, so Llama 4's interleaved ones split them).
fn assignment(s: &Shared, plan: &Plan, i: usize) -> Vec<SliceSpec> {
    cover(s.n_layer, s.n_expert, |l, e| s.moe[l] && plan.owners(l, e).contains(&i))
}

async fn join(
    State(s): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    // The signature before anything else: an unauthorised peer learns nothing, not even how a join looks.
    let nonce = match authorised(&s, &method, &uri, &headers, &body) {
        Ok(n) => n,
        Err(r) => return *r,
    };
    let j = match Join::parse(&body) {
        Ok(j) => j,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    let i = match node_index(&s, &j.node) {
        Ok(i) => i,
        Err(r) => return *r,
    };
    {
        let mut budgets = s.budgets.lock().unwrap_or_else(|e| e.into_inner());
        budgets[i] = Some(j.budget);
        if s.plan.borrow().is_none() && budgets.iter().all(Option::is_some) {
            let b: Vec<u64> = budgets.iter().map(|b| b.unwrap_or(0)).collect();
            match Plan::new(s.n_layer, s.dense, s.n_expert, &b, s.opts.placement, s.opts.replicas) {
                Ok(mut p) => {
                    p.replicate(&s.opts.hot, b.len());
                    let _ = s.plan.send(Some(Arc::new(p)));
                }
                Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
            }
        }
    }
    let mut rx = s.plan.subscribe();
    let plan = match tokio::time::timeout(Duration::from_secs(600), rx.wait_for(Option::is_some)).await {
        Ok(Ok(p)) => p.clone().expect("waited for it"),
        _ => {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "the other nodes have not joined yet: join again",
            )
        }
    };
    let specs = assignment(&s, &plan, i);
    // Each shard's header is laid out to measure it (the model's metadata copied), and its experts' digests
    // computed (each expert's bytes read, the first time): off the async threads.
    let s2 = s.clone();
    let (specs, sizes, digests) = match tokio::task::spawn_blocking(move || {
        let sizes = specs
            .iter()
            .map(|r| Shard::size(&s2.model, r, &s2.digests))
            .collect::<Result<Vec<_>, _>>()?;
        let digests = specs
            .iter()
            .map(|r| s2.digests.of(&s2.model, r).map(|d| d.concat()))
            .collect::<Result<Vec<_>, _>>()?;
        Ok::<_, crate::ShardError>((specs, sizes, digests))
    })
    .await
    {
        Ok(Ok(sized)) => sized,
        Ok(Err(e)) => return error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    let shards = specs
        .into_iter()
        .map(|r| {
            (
                (*r.layers.start(), *r.layers.end()),
                (*r.experts.start(), *r.experts.end()),
            )
        })
        .collect();
    let answer = Assignment {
        model: s.identity.clone(),
        shards,
        sizes,
        digests,
    };
    let body = match serde_json::to_vec(&answer) {
        Ok(b) => b,
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    let mac = auth::hex(&s.keys.answer_mac(&nonce, &body));
    (
        [
            (header::CONTENT_TYPE, "application/json".to_string()),
            (header::HeaderName::from_static(ANSWER_MAC), mac),
        ],
        body,
    )
        .into_response()
}

/// A slice request's query string (`node=HOST:PORT&layers=A-B&experts=X-Y`).
#[derive(Deserialize)]
pub struct SliceQuery {
    pub node: String,
    pub layers: String,
    pub experts: String,
}

impl SliceQuery {
    /// The rectangle asked for; `None` unless both are ranges like 0-47.
    pub fn spec(&self) -> Option<SliceSpec> {
        Some(SliceSpec {
            layers: parse_range(&self.layers).ok()?,
            experts: parse_range(&self.experts).ok()?,
        })
    }
}

/// `Range: bytes=A-` or `bytes=A-B` against a body of `len` bytes -> [start, end).
pub fn byte_range(headers: &HeaderMap, len: u64) -> Result<Option<(u64, u64)>, ClusterError> {
    let Some(v) = headers.get(header::RANGE) else {
        return Ok(None);
    };
    let bad = |why: &str| ClusterError::RangeHeader(why.to_string());
    let v = v
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("bytes="))
        .ok_or_else(|| bad("only byte ranges (bytes=A-B) are served"))?;
    let (a, b) = v.split_once('-').ok_or_else(|| bad("a range is A-B"))?;
    let number = |n: &str| n.parse::<u64>().map_err(|e| bad(&format!("{n:?}: {e}")));
    let start = number(a)?;
    let end = if b.is_empty() {
        len
    } else {
        number(b)?.saturating_add(1).min(len)
    };
    if start >= end {
        return Err(bad("empty range"));
    }
    Ok(Some((start, end)))
}

async fn slice(
    State(s): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    Query(q): Query<SliceQuery>,
) -> Response {
    if let Err(r) = authorised(&s, &method, &uri, &headers, &[]) {
        return *r;
    }
    let i = match node_index(&s, &q.node) {
        Ok(i) => i,
        Err(r) => return *r,
    };
    let Some(plan) = s.plan.borrow().clone() else {
        return error(StatusCode::CONFLICT, "no plan yet: join first");
    };
    let Some(spec) = q.spec() else {
        return error(StatusCode::BAD_REQUEST, "layers and experts are ranges like 0-47");
    };
    if *spec.layers.end() >= s.n_layer || *spec.experts.end() >= s.n_expert {
        return error(
            StatusCode::BAD_REQUEST,
            format!("the model has {} layers of {} experts", s.n_layer, s.n_expert),
        );
    }
    let inside = spec
        .layers
        .clone()
        .all(|l| spec.experts.clone().all(|e| plan.owners(l, e).contains(&i)));
    if !inside {
        return error(
            StatusCode::FORBIDDEN,
            format!(
                "layers {} × experts {} are not all assigned to {}",
                q.layers, q.experts, q.node
            ),
        );
    }
    // Planning reads the experts' bytes for their digests (the first time): off the async threads.
    let (model, s2) = (s.model.clone(), s.clone());
    let shard = match tokio::task::spawn_blocking(move || Shard::plan(&model, &spec, &s2.digests)).await {
        Ok(Ok(shard)) => Arc::new(shard),
        Ok(Err(e)) => return error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    let len = shard.len();
    let (start, end, status) = match byte_range(&headers, len) {
        Ok(None) => (0, len, StatusCode::OK),
        Ok(Some((a, b))) => (a, b, StatusCode::PARTIAL_CONTENT),
        Err(e) => {
            return (
                StatusCode::RANGE_NOT_SATISFIABLE,
                [(header::CONTENT_RANGE, format!("bytes */{len}"))],
                e.to_string(),
            )
                .into_response()
        }
    };
    let mut resp = Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/octet-stream")
        .header(header::CONTENT_LENGTH, end - start)
        .header(header::ACCEPT_RANGES, "bytes");
    if status == StatusCode::PARTIAL_CONTENT {
        resp = resp.header(header::CONTENT_RANGE, format!("bytes {start}-{}/{len}", end - 1));
    }
    resp.body(Body::from_stream(stream_shard(shard, start, end)))
        .unwrap_or_else(|e| error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))
}

/// The bytes [start, end) of `shard` in 1 MiB chunks, cut on a blocking thread; the stream ends early
/// (and the connection with it) when the client has not taken a chunk for a minute.
fn stream_shard(shard: Arc<Shard>, start: u64, end: u64) -> impl futures_util::Stream<Item = std::io::Result<Vec<u8>>> {
    const CHUNK: u64 = 1 << 20;
    let (tx, rx) = tokio::sync::mpsc::channel::<Vec<u8>>(4);
    std::thread::spawn(move || {
        let mut at = start;
        while at < end {
            let mut buf = vec![0u8; (end - at).min(CHUNK) as usize];
            shard.read_at(at, &mut buf);
            at += buf.len() as u64;
            let mut item = buf;
            let since = std::time::Instant::now();
            loop {
                match tx.try_send(item) {
                    Ok(()) => break,
                    Err(tokio::sync::mpsc::error::TrySendError::Full(back))
                        if since.elapsed() < Duration::from_secs(60) =>
                    {
                        item = back;
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(_) => return, // gone, or too slow: stop cutting
                }
            }
        }
    });
    futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|chunk| (Ok(chunk), rx)) })
}
