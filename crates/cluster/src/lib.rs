//! Experts spread over machines. One backbone runs attention, routers, shared experts and the head;
//! expert nodes ([`worker`]) hold experts and compute them on request. Per MoE layer the backbone sends
//! each involved node one [`proto`] message with the rows (quantised exactly as its own kernels would
//! quantise them) and the expert ids, computes its own share while it waits, and hands every expert's
//! output to the engine, which combines them in ascending expert-id order — so the result is the
//! single-machine result, bit for bit, for any [`plan`] and any node count. A node that fails is
//! computed around ([`remote`]), and the bytes stay the same. [`backbone`] makes a loaded model a
//! backbone; [`node`] loads what a node serves.
//!
//! Sockets are plain blocking `std::net` streams, one per node, with a thread per connection on the
//! worker: a backbone talks to a handful of nodes with one request in flight to each, so an async
//! runtime would add a hand-off per message and buy nothing.
//!
//! Failures are typed ([`error`]); what happens meanwhile is logged through `tracing`: a node going down
//! (warn) or coming back (info), a worker's connections (one span each, by peer), and each exchange of the
//! backbone with a node (a debug span with the layer and the node, free while debug logging is off).

pub mod auth;
pub mod backbone;
pub mod calibrate;
pub mod error;
pub mod fetch;
pub mod node;
pub mod plan;
pub mod proto;
pub mod remote;
pub mod slice;
pub mod slice_http;
pub mod worker;

pub use backbone::{attach, BackboneOptions};
pub use error::{ClusterError, ExchangeError, ShardError};
pub use plan::{Placement, Plan};
pub use remote::{Cluster, ClusterOptions};
pub use worker::{serve, NodeModel, WorkerOptions};

use std::path::Path;

/// The node token in `path`: its first line, which must be at least 16 bytes (a token is a shared
/// secret, e.g. `openssl rand -hex 32 > node.token`).
pub fn read_token(path: &Path) -> Result<Vec<u8>, ClusterError> {
    let text = std::fs::read_to_string(path).map_err(|error| ClusterError::TokenFile {
        path: path.to_path_buf(),
        error,
    })?;
    let token = text.lines().next().unwrap_or("").trim();
    if token.len() < 16 {
        return Err(ClusterError::TokenTooShort {
            path: path.to_path_buf(),
        });
    }
    Ok(token.as_bytes().to_vec())
}
