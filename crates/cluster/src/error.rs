//! How the cluster fails, in three enums, one per concern: [`ClusterError`] for what a caller of this crate
//! sets up and runs (a backbone, a node, a fetch, the slice endpoint), [`ExchangeError`] for one connection
//! between a backbone and a node going wrong (why a node is marked down, why a worker ends a connection),
//! and [`ShardError`] for cutting, reading and checking shards.
//!
//! Every message is whole on its own: an error that wraps another prints it in its own text and does not
//! also expose it as [`source`](std::error::Error::source) — so a log line, or a chain of causes printed
//! one after another, names each cause once. Errors passed on unchanged are `#[error(transparent)]`.

use std::io;
use std::num::ParseIntError;
use std::path::PathBuf;
use std::time::Duration;

use titan_net::{FrameError, Kind, PayloadError};

/// A cluster's setup or service failing: reading its files, planning, connecting to the nodes, serving as
/// a node, fetching shards from a backbone, the backbone's slice endpoint.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The node token file cannot be read.
    #[error("reading the node token {path}: {error}", path = path.display())]
    TokenFile { path: PathBuf, error: io::Error },
    /// The node token is shorter than 16 characters.
    #[error(
        "{path}: the node token must be at least 16 characters on the first line (e.g. `openssl rand -hex 32 > {path}`)",
        path = path.display()
    )]
    TokenTooShort { path: PathBuf },
    /// The file listing the nodes cannot be read.
    #[error("reading the cluster file {path}: {error}", path = path.display())]
    NodeList { path: PathBuf, error: io::Error },
    /// A placement that is neither `contiguous` nor `interleaved`.
    #[error("unknown placement {0:?}: use contiguous or interleaved")]
    UnknownPlacement(String),
    /// A plan over no nodes.
    #[error("a plan needs at least one node")]
    NoNodes,
    /// More copies of each expert than there are nodes, or none.
    #[error("{replicas} copies of each expert asked for: each expert needs between 1 and {nodes} (the node count)")]
    Replicas { replicas: usize, nodes: usize },
    /// A node could not be reached, refused the backbone, or answered its hello wrongly.
    #[error("node {addr}: {error}")]
    Node { addr: String, error: ExchangeError },
    /// A node accepted the backbone but did not answer its pings.
    #[error("node {addr}: ping: {error}")]
    Ping { addr: String, error: ExchangeError },
    /// A node holds a model of another shape than the backbone's.
    #[error("node {addr}: has {node_layers} layers of {node_experts} experts, the model {n_layer} of {n_expert}")]
    NodeShape {
        addr: String,
        node_layers: usize,
        node_experts: usize,
        n_layer: usize,
        n_expert: usize,
    },
    /// The address to listen on cannot be bound.
    #[error("listening on {addr}: {error}")]
    Listen { addr: String, error: io::Error },
    /// Another I/O failure; `what` says what was being done.
    #[error("{what}: {error}")]
    Io { what: String, error: io::Error },
    /// Not every node of the cluster joined the slice endpoint in time.
    #[error("the expected nodes did not all join within {0:?}")]
    JoinTimeout(Duration),
    /// The slice endpoint stopped before the plan was made.
    #[error("the slice endpoint stopped before every node joined")]
    SliceServerStopped,
    /// A `Range` header the slice endpoint does not serve.
    #[error("unsupported Range header: {0}")]
    RangeHeader(String),
    /// A node serving shards was given none.
    #[error("no shard given")]
    NoShards,
    /// A node's shards were cut from different models.
    #[error("the shards come from different models ({0} and {1})")]
    ShardsDiffer(String, String),
    /// A node that fetches its shards must listen on a port the backbone can dial.
    #[error(
        "a node that fetches its shards needs a fixed listening port: the backbone dials the address it joins with"
    )]
    FixedPortNeeded,
    /// An HTTP request to the backbone's slice endpoint failed (unreachable, cut off, timed out).
    #[error(transparent)]
    Http(#[from] ureq::Error),
    /// The slice endpoint answered with an error status.
    #[error("the backbone answered {status}: {body}")]
    BackboneAnswered { status: u16, body: String },
    /// A shard download stopped before its end.
    #[error("download cut at byte {at}: {error}")]
    DownloadCut { at: u64, error: io::Error },
    /// A resumed download's partial file is longer than the shard; it is removed.
    #[error("partial download did not fit the shard; starting over")]
    PartialTooLong,
    /// The shard downloaded is of another model or another range than the one asked for.
    #[error("{path}: the backbone sent a shard of another model or range", path = path.display())]
    WrongShard { path: PathBuf },
    /// The shard downloaded holds an expert whose bytes (and the digest the shard gives them) are not the ones
    /// the backbone's assignment names: altered on the way, or not the backbone's.
    #[error(
        "{path}: expert {expert} of layer {layer} is not the one the backbone's assignment names (its digest differs)",
        path = path.display()
    )]
    ForeignShard { path: PathBuf, layer: usize, expert: usize },
    /// The backbone kept being unreachable or not ready for longer than the node's patience.
    #[error("{what} at {backbone}: gave up after {patience:?}: {last}")]
    GaveUp {
        what: &'static str,
        backbone: String,
        patience: Duration,
        last: Box<ClusterError>,
    },
    /// JSON that cannot be read or written; `what` names it.
    #[error("{what}: {error}")]
    Json {
        what: &'static str,
        error: serde_json::Error,
    },
    /// A shard failed.
    #[error(transparent)]
    Shard(#[from] ShardError),
    /// The model file cannot be read.
    #[error(transparent)]
    Gguf(#[from] titan_gguf::GgufError),
    /// The model's experts cannot be located in its file.
    #[error(transparent)]
    Layout(#[from] titan_layout::LayoutError),
    /// The model cannot be loaded.
    #[error(transparent)]
    Engine(#[from] titan_engine::EngineError),
    /// A node's experts cannot be loaded or streamed.
    #[error(transparent)]
    Store(#[from] titan_store::StoreError),
    /// A join's answer that is no assignment a node can take (ranges past any model, too many shards, sizes
    /// that do not match them); nothing is fetched.
    #[error("the backbone's assignment is refused: {0}")]
    BadAssignment(String),
    /// A shard's download that is longer than the shard's size, or has no size; the partial file is removed.
    #[error("{path}: {what}; the download is stopped and its partial file removed", path = path.display())]
    ShardSize { path: PathBuf, what: String },
}

impl ClusterError {
    /// An I/O error with what was being done.
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(io::Error) -> ClusterError {
        let what = what.into();
        move |error| ClusterError::Io { what, error }
    }
}

/// One connection between a backbone and a node going wrong: on the backbone, the reason a node is marked
/// down (its share is then computed elsewhere); on a worker, the reason it ends a backbone's connection.
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    /// The address resolves to nothing.
    #[error("{0} resolves to no address")]
    Unresolved(String),
    /// The socket failed (connecting, sending, or setting it up).
    #[error(transparent)]
    Io(#[from] io::Error),
    /// A frame could not be read: the connection closed or broke, or the frame is malformed.
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// The first frame of a connection could not be read.
    #[error("reading the hello: {0}")]
    Hello(FrameError),
    /// The node did not answer a layer within the backbone's deadline.
    #[error("no answer within the deadline ({0:?})")]
    Timeout(Duration),
    /// An answer held a NaN or an infinity, which the kernels never make from finite inputs.
    #[error("the answer holds {0}, which no expert computes from finite weights and rows")]
    NonFinite(f32),
    /// An audit recomputed one of the node's outputs and got other bits: the node is faulty or lying.
    #[error("its output of expert {expert} of layer {layer} differs from the backbone's own, bit for bit")]
    AuditFailed { layer: usize, expert: u32 },
    /// An audit recomputed the node's rows of a dense product and got other bits.
    #[error("its rows of the dense product at file offset {start} differ from the backbone's own, bit for bit")]
    RowsAuditFailed { start: u64 },
    /// The node could not prove that it knows the token: an impostor at its address, or a node given
    /// another token. The backbone sends it nothing more.
    #[error("the node did not prove that it knows the token (an impostor at its address, or another token)")]
    Impostor,
    /// The peer refused the connection (a wrong token, another model, no hello), in its words.
    #[error("refused: {0}")]
    Refused(String),
    /// The node failed a layer's request, in its words.
    #[error("the node failed: {0}")]
    NodeFailed(String),
    /// This worker failed a request (sent to the backbone as an Error frame too).
    #[error("request {id} failed: {why}")]
    RequestFailed { id: u64, why: String },
    /// An answer to another request than the one pending.
    #[error("answered request {got} while request {pending} was pending")]
    WrongRequest { got: u64, pending: u64 },
    /// An answer of the wrong kind; `to` names the request ("the hello", "a ping", "a layer's request").
    #[error("answered {to} with a {kind:?} frame")]
    WrongAnswer { to: &'static str, kind: Kind },
    /// A frame a worker does not take from a backbone.
    #[error("unexpected {0:?} frame")]
    Unexpected(Kind),
    /// A body that does not decode as the message it must be.
    #[error(transparent)]
    Malformed(#[from] PayloadError),
    /// JSON that cannot be read or written; `what` names it.
    #[error("{what}: {error}")]
    Json {
        what: &'static str,
        error: serde_json::Error,
    },
}

impl ExchangeError {
    /// Whether nothing listens at the node's address (yet): it is down, not refusing.
    pub fn is_unreachable(&self) -> bool {
        use io::ErrorKind::*;
        match self {
            ExchangeError::Io(e) => matches!(
                e.kind(),
                ConnectionRefused | TimedOut | HostUnreachable | NetworkUnreachable | AddrNotAvailable
            ),
            _ => false,
        }
    }
}

/// A shard failing: cutting it from a model, writing it, opening it, or checking its experts' digests.
#[derive(Debug, thiserror::Error)]
pub enum ShardError {
    /// A range of layers or experts that is not `A-B` or `A`.
    #[error("{text:?} is not a range like 0-31: {error}")]
    NotARange { text: String, error: ParseIntError },
    /// A range whose end comes before its start.
    #[error("range {0:?} runs backwards")]
    Backwards(String),
    /// Layers or experts the model does not have.
    #[error("layers {layers:?} × experts {experts:?} is outside the model ({n_layer} layers of {n_expert} experts)")]
    OutsideModel {
        layers: std::ops::RangeInclusive<usize>,
        experts: std::ops::RangeInclusive<usize>,
        n_layer: usize,
        n_expert: usize,
    },
    /// Layers that start among the model's dense (expert-less) first layers.
    #[error("layers {layers:?}: the model's first {dense} layers are dense and have no experts; start the layers at {dense}")]
    DenseLayers {
        layers: std::ops::RangeInclusive<usize>,
        dense: usize,
    },
    /// Layers that include a dense layer of a model whose MoE layers are interleaved with dense ones.
    #[error("layers {layers:?}: layer {layer} is dense (one layer in {every} has experts); a shard holds MoE layers only, so give each shard one MoE layer")]
    InterleavedDense {
        layers: std::ops::RangeInclusive<usize>,
        layer: usize,
        every: usize,
    },
    /// A layer without expert tensors.
    #[error("layer {0} has no experts")]
    NoExperts(usize),
    /// An expert the model's layout does not hold.
    #[error("{path}: no expert {expert} in layer {layer}", path = path.display())]
    NoExpert { path: PathBuf, layer: usize, expert: usize },
    /// A file that is not a shard, or whose keys and tensors disagree; `what` says how.
    #[error("{path}: {what}", path = path.display())]
    Invalid { path: PathBuf, what: String },
    /// An expert whose bytes do not match its digest: the shard is damaged.
    #[error(
        "{path}: expert {expert} of layer {layer} failed its digest check: the shard is damaged (fetch or slice it again)",
        path = path.display()
    )]
    Damaged { path: PathBuf, layer: usize, expert: usize },
    /// An I/O failure; `what` says what was being done.
    #[error("{what}: {error}")]
    Io { what: String, error: io::Error },
    /// The file cannot be read as a GGUF.
    #[error(transparent)]
    Gguf(#[from] titan_gguf::GgufError),
    /// The model's (or the shard's) experts cannot be located in its file.
    #[error(transparent)]
    Layout(#[from] titan_layout::LayoutError),
    /// The model's (or the shard's) hyper-parameters do not read.
    #[error(transparent)]
    Engine(#[from] titan_engine::EngineError),
}

impl ShardError {
    /// An I/O error with what was being done.
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(io::Error) -> ShardError {
        let what = what.into();
        move |error| ShardError::Io { what, error }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The error and its sources, one after another, as `anyhow`'s `{:#}` prints them.
    fn chain(e: &dyn std::error::Error) -> String {
        let mut out = e.to_string();
        let mut source = e.source();
        while let Some(s) = source {
            out = format!("{out}: {s}");
            source = s.source();
        }
        out
    }

    /// A node whose connection was reset: the OS error is named once, on its own and with its sources.
    #[test]
    fn a_wrapped_error_is_named_once() {
        let reset = || io::Error::from(io::ErrorKind::ConnectionReset);
        let text = reset().to_string();
        let exchange = ExchangeError::from(FrameError::from(reset()));
        let node = ClusterError::Node {
            addr: "127.0.0.1:7471".into(),
            error: ExchangeError::from(FrameError::from(reset())),
        };
        for e in [&exchange as &dyn std::error::Error, &node] {
            assert_eq!(e.to_string().matches(&text).count(), 1, "{e}");
            assert_eq!(chain(e).matches(&text).count(), 1, "{}", chain(e));
        }
        let gave_up = ClusterError::GaveUp {
            what: "joining the backbone",
            backbone: "http://127.0.0.1:7470".into(),
            patience: Duration::from_secs(1),
            last: Box::new(ClusterError::DownloadCut { at: 3, error: reset() }),
        };
        assert_eq!(chain(&gave_up).matches(&text).count(), 1, "{}", chain(&gave_up));
    }
}
