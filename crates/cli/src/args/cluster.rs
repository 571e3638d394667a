//! The cluster a command leads as its backbone: the nodes, the token, placement, failover and audit
//! options, turned into the backbone's options for a loaded model.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::Args;
use titan_cluster::backbone::read_node_list;
use titan_cluster::{read_token, BackboneOptions};
use titan_engine::profile::Profile;
use titan_engine::Model;

#[derive(Args, Clone, Default)]
pub struct ClusterArgs {
    /// Expert nodes (`titan worker`), HOST:PORT,HOST:PORT,…: this process becomes the backbone and
    /// sends each MoE layer's experts to the nodes that hold them.
    #[arg(long, value_delimiter = ',')]
    pub nodes: Vec<String>,
    /// A file listing the nodes, one HOST:PORT per line (# comments allowed), instead of --nodes.
    #[arg(long, conflicts_with = "nodes")]
    pub cluster: Option<PathBuf>,
    /// The node token (a shared secret of at least 16 characters; first line of the file).
    #[arg(long = "token-file")]
    pub token_file: Option<PathBuf>,
    /// How experts are spread: contiguous (id ranges sized by each node's budget) or interleaved.
    #[arg(long, default_value = "contiguous")]
    pub placement: String,
    /// Copies of each expert across nodes: with 2, any one node can die without the backbone
    /// computing its share.
    #[arg(long, default_value_t = 1)]
    pub replicas: usize,
    /// Milliseconds a node may take to answer one layer before it is marked down.
    #[arg(long = "node-timeout", default_value_t = 10_000)]
    pub node_timeout_ms: u64,
    /// A routing profile (`titan profile`): its hottest experts of each layer get a second node.
    #[arg(long = "replicate-hot")]
    pub replicate_hot: Option<PathBuf>,
    /// With --replicate-hot: the share of each layer's experts to replicate, hottest first.
    #[arg(long = "hot-share", default_value_t = 0.125)]
    pub hot_share: f64,
    /// Serve the nodes their shards at this address (`titan worker --backbone http://ADDR`): wait for every
    /// node of --nodes to join, plan from their budgets, and let each download only its experts.
    #[arg(long = "serve-slices")]
    pub serve_slices: Option<String>,
    /// Seconds to wait for the nodes to join, download their shards and start serving.
    #[arg(long = "join-timeout", default_value_t = 3600)]
    pub join_timeout_s: u64,
    /// Leave every expert to the nodes (by default a backbone that holds the experts in memory computes a
    /// share of them like a node; one that streams them never does).
    #[arg(long = "no-backbone-share")]
    pub no_backbone_share: bool,
    /// Recompute this share of the nodes' work here and compare the bits (e.g. 0.01: one expert answer in
    /// 100, with all its rows, and one dense product in 100): outputs are the same bits on every machine, so
    /// one that differs proves a node faulty or lying; it is never used again.
    #[arg(long, default_value_t = 0.0)]
    pub audit: f64,
    /// Encrypt the connections to the nodes (ChaCha20-Poly1305 under each connection's own key), so that
    /// nobody on the network sees activations; without it they are authenticated only.
    #[arg(long)]
    pub encrypt: bool,
}

impl ClusterArgs {
    /// The backbone's options for `model`, when nodes are given.
    pub(super) fn options(&self, model: &Model) -> Result<Option<BackboneOptions>> {
        let nodes = match &self.cluster {
            Some(path) => read_node_list(path)?,
            None => self.nodes.clone(),
        };
        if nodes.is_empty() {
            return Ok(None);
        }
        let Some(token_file) = &self.token_file else {
            bail!("--nodes needs --token-file (the token the workers were started with)")
        };
        let hot = match &self.replicate_hot {
            None => Vec::new(),
            Some(path) => {
                let profile = Profile::load(path)?;
                profile.check_shape(path, model.config.n_layer, model.config.n_expert)?;
                profile.hottest_share(self.hot_share)
            }
        };
        Ok(Some(BackboneOptions {
            nodes,
            token: read_token(token_file)?,
            placement: self.placement.parse()?,
            replicas: self.replicas,
            timeout: Duration::from_millis(self.node_timeout_ms.max(1)),
            hot,
            serve_slices: self.serve_slices.clone(),
            join_timeout: Duration::from_secs(self.join_timeout_s),
            backbone_share: !self.no_backbone_share
                && model.weights.residency() == titan_engine::weights::Residency::All,
            audit: {
                if !(0.0..=1.0).contains(&self.audit) {
                    bail!(
                        "--audit {} is outside 0..=1 (the share of the nodes' work recomputed)",
                        self.audit
                    );
                }
                self.audit
            },
            encrypt: self.encrypt,
        }))
    }
}
