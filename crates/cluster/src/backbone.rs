//! Making a model a cluster's backbone: its expert source becomes a [`Cluster`] over the nodes, and its own
//! source stays as the fallback for experts no live node computes.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use titan_engine::experts::{Experts, ResidentExperts};
use titan_engine::Model;
use titan_gguf::GgufFile;
use titan_layout::ModelIdentity;

use crate::slice_http::{SliceServer, SliceServerOptions};
use crate::{Cluster, ClusterError, ClusterOptions, Placement};

pub struct BackboneOptions {
    /// HOST:PORT of each node.
    pub nodes: Vec<String>,
    pub token: Vec<u8>,
    pub placement: Placement,
    /// Copies of each expert across nodes.
    pub replicas: usize,
    /// How long a node may take to answer one layer before it is marked down.
    pub timeout: Duration,
    /// (layer, expert)s to give a second node (the hottest of a routing profile).
    pub hot: Vec<(usize, usize)>,
    /// Whether the backbone computes a share of the experts like a node (when it holds them in memory).
    pub backbone_share: bool,
    /// The share of the nodes' outputs the backbone recomputes to check their bits (0: none).
    pub audit: f64,
    /// Encrypt the connections to the nodes.
    pub encrypt: bool,
    /// Serve the nodes their shards at this address: wait for every node to join, plan from their
    /// budgets, and let each download only its experts.
    pub serve_slices: Option<String>,
    /// How long to wait for the nodes to join, download their shards and start serving.
    pub join_timeout: Duration,
}

/// The nodes listed in a cluster file: one HOST:PORT per line, `#` comments and blank lines ignored.
pub fn read_node_list(path: &Path) -> Result<Vec<String>, ClusterError> {
    let text = std::fs::read_to_string(path).map_err(|error| ClusterError::NodeList {
        path: path.to_path_buf(),
        error,
    })?;
    Ok(text
        .lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect())
}

/// Turns `model` into a cluster's backbone over `opts.nodes`, and returns the cluster (the model holds
/// it too, as its expert source).
pub fn attach(model: &mut Model, opts: BackboneOptions) -> Result<Arc<Cluster>, ClusterError> {
    let cluster_opts = ClusterOptions {
        nodes: opts.nodes,
        token: opts.token,
        placement: opts.placement,
        replicas: opts.replicas,
        timeout: opts.timeout,
        model: ModelIdentity::of(&model.weights.file)?.to_string(),
        hot: opts.hot,
        backbone_share: opts.backbone_share,
        audit: opts.audit,
        encrypt: opts.encrypt,
    };
    let slices = match &opts.serve_slices {
        None => None,
        Some(listen) => {
            let server = SliceServer::start(
                Arc::new(GgufFile::open(model.weights.file.path())?),
                SliceServerOptions {
                    listen: listen.clone(),
                    token: cluster_opts.token.clone(),
                    nodes: cluster_opts.nodes.clone(),
                    placement: cluster_opts.placement,
                    replicas: cluster_opts.replicas,
                    hot: cluster_opts.hot.clone(),
                },
            )?;
            tracing::info!(
                "serving slices on http://{}; waiting for {} nodes to join",
                server.addr,
                cluster_opts.nodes.len()
            );
            server.wait_for_plan(opts.join_timeout)?;
            tracing::info!("plan made; waiting for the nodes to download their shards and start");
            Some(server)
        }
    };
    let own = Box::new(ResidentExperts::new(model.weights.clone()));
    let local = std::mem::replace(&mut model.experts, own);
    let deadline = slices.is_some().then(|| Instant::now() + opts.join_timeout);
    let mut cluster = connect_patiently(local, model, cluster_opts, deadline)?;
    if let Some(server) = slices {
        cluster.keep_serving_slices(server);
    }
    let cluster = Arc::new(cluster);
    model.experts = Box::new(cluster.clone());
    model.rows = Box::new(cluster.clone());
    Ok(cluster)
}

/// Connects to the nodes; with a deadline (nodes still downloading their shards), a node that is not
/// listening yet is waited for.
fn connect_patiently(
    local: Box<dyn Experts>,
    model: &Model,
    opts: ClusterOptions,
    deadline: Option<Instant>,
) -> Result<Cluster, ClusterError> {
    let c = &model.config;
    let mut local = Some(local);
    loop {
        // Reachability first, so that `local` is only handed over for a connection that can succeed.
        let unreachable = opts
            .nodes
            .iter()
            .find(|n| std::net::TcpStream::connect(n.as_str()).is_err());
        match (unreachable, deadline) {
            (Some(_), Some(d)) if Instant::now() < d => std::thread::sleep(Duration::from_millis(200)),
            _ => {
                let local = local.take().expect("connected once");
                return Cluster::connect(local, c.n_layer, c.dense_lead, c.n_expert, opts);
            }
        }
    }
}
