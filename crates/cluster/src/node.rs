//! What an expert node serves: a model's experts (resident, or streamed from its store through a budget),
//! shards of a model (`titan slice`), or the shards a backbone assigns it, fetched first.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use titan_gguf::GgufFile;
use titan_layout::ModelIdentity;
use titan_store::StreamPlan;

use crate::fetch::{fetch, FetchOptions};
use crate::slice::{ShardExperts, Shards};
use crate::worker::{serve, NodeModel, WorkerOptions};
use crate::ClusterError;

/// Serves the model at `path` until the process ends: its experts (streamed where `plan` says) and, with
/// `rows`, shares of its dense products (its dense weights are then loaded too, as a backbone loads them);
/// `ready` is told the bound address first.
pub fn serve_model(
    path: &Path,
    plan: Option<&StreamPlan>,
    rows: bool,
    opts: WorkerOptions,
    ready: impl FnOnce(SocketAddr),
) -> Result<(), ClusterError> {
    let identity = ModelIdentity::of(&GgufFile::open(path)?)?.to_string();
    let node = if rows {
        let model = titan_store::load_model(path, plan)?;
        let budget = match plan {
            Some(p) => p.budget_bytes,
            None => titan_layout::dense_and_expert_bytes(&model.weights.file).1,
        };
        let c = &model.config;
        NodeModel {
            identity,
            n_layer: c.n_layer,
            n_expert: c.n_expert,
            n_embd: c.n_embd,
            experts: model.experts,
            holds: None,
            weights: Some(model.weights),
            budget,
        }
    } else {
        let (config, experts, budget) = titan_store::load_experts(path, plan)?;
        NodeModel {
            identity,
            n_layer: config.n_layer,
            n_expert: config.n_expert,
            n_embd: config.n_embd,
            experts,
            holds: None,
            weights: None,
            budget,
        }
    };
    serve(node, opts, ready)
}

/// Serves the experts of shards of one model until the process ends; every expert's digest is checked
/// first.
pub fn serve_shards(
    paths: &[PathBuf],
    opts: WorkerOptions,
    ready: impl FnOnce(SocketAddr),
) -> Result<(), ClusterError> {
    let shards = paths
        .iter()
        .map(|p| ShardExperts::open(p, true))
        .collect::<Result<Vec<_>, _>>()?;
    let first = shards.first().ok_or(ClusterError::NoShards)?;
    if let Some(other) = shards.iter().find(|s| s.model != first.model) {
        return Err(ClusterError::ShardsDiffer(first.model.clone(), other.model.clone()));
    }
    let (c, identity) = (first.config.clone(), first.model.clone());
    let budget = shards.iter().map(ShardExperts::expert_bytes).sum();
    let shards = Shards::new(shards);
    let node = NodeModel {
        identity,
        n_layer: c.n_layer,
        n_expert: c.n_expert,
        n_embd: c.n_embd,
        holds: Some(shards.holdings()),
        weights: None,
        experts: Box::new(shards),
        budget,
    };
    serve(node, opts, ready)
}

/// Joins the backbone of `fetch`, downloads what the cache lacks of this node's assignment
/// (`progress(done, total)` in bytes), and serves it.
pub fn serve_fetched(
    fetch_opts: &FetchOptions,
    opts: WorkerOptions,
    progress: &mut dyn FnMut(u64, u64),
    ready: impl FnOnce(SocketAddr),
) -> Result<(), ClusterError> {
    if opts.listen.ends_with(":0") {
        return Err(ClusterError::FixedPortNeeded);
    }
    let fetched = fetch(fetch_opts, progress)?;
    tracing::info!(
        "downloaded {} bytes; serving {} shards from {}",
        fetched.downloaded,
        fetched.shards.len(),
        fetch_opts.cache_dir.display()
    );
    serve_shards(&fetched.shards, opts, ready)
}
