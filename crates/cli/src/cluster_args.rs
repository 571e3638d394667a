//! Command-line options for running as a cluster's backbone, and `titan worker`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use titan_cluster::slice::ShardExperts;
use titan_cluster::{model_identity, read_token, Cluster, ClusterOptions, NodeModel};
use titan_engine::experts::{ExpertSource, Experts};
use titan_engine::{LoadOptions, Model};

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
}

impl ClusterArgs {
    fn node_list(&self) -> Result<Vec<String>> {
        let Some(path) = &self.cluster else { return Ok(self.nodes.clone()) };
        let text = std::fs::read_to_string(path).with_context(|| format!("reading the cluster file {}", path.display()))?;
        Ok(text.lines().map(|l| l.split('#').next().unwrap_or("").trim()).filter(|l| !l.is_empty()).map(String::from).collect())
    }

    /// Turns `model` into a cluster's backbone when nodes are given: its own expert source stays as
    /// the fallback for experts no live node holds. Prints the plan on stderr.
    pub fn attach(&self, model: &mut Model) -> Result<Option<Arc<Cluster>>> {
        let nodes = self.node_list()?;
        if nodes.is_empty() {
            return Ok(None);
        }
        let Some(token_file) = &self.token_file else { bail!("--nodes needs --token-file (the token the workers were started with)") };
        let opts = ClusterOptions {
            nodes,
            token: read_token(token_file)?,
            placement: self.placement.parse()?,
            replicas: self.replicas,
            timeout: Duration::from_millis(self.node_timeout_ms.max(1)),
            model: model_identity(&model.weights.file),
        };
        let local = std::mem::replace(&mut model.experts, Box::new(ExpertSource::Resident(model.weights.clone())));
        let cluster = Arc::new(Cluster::connect(local, model.config.n_layer, model.config.n_expert, opts)?);
        eprint!("{}", cluster.describe());
        model.experts = Box::new(cluster.clone());
        Ok(Some(cluster))
    }
}

#[derive(Args)]
pub struct WorkerArgs {
    /// Address to listen on (port 0: any free port). Loopback unless you say otherwise.
    #[arg(long, default_value = "127.0.0.1:7471")]
    pub listen: String,
    /// The node token backbones must present.
    #[arg(long = "token-file")]
    pub token_file: PathBuf,
    /// The largest frame accepted, in bytes.
    #[arg(long = "max-frame", default_value_t = titan_net::DEFAULT_MAX_FRAME)]
    pub max_frame: usize,
}

/// Serves the experts of a shard (`titan slice`) until the process is stopped; every expert's digest is
/// checked first.
pub fn serve_shard(shard: &Path, a: &WorkerArgs) -> Result<()> {
    let s = ShardExperts::open(shard, true)?;
    let (c, spec) = (&s.config, &s.spec);
    let holds = Some(((*spec.layers.start(), *spec.layers.end()), (*spec.experts.start(), *spec.experts.end())));
    let budget = s.expert_bytes();
    let node = NodeModel { identity: s.model.clone(), n_layer: c.n_layer, n_expert: c.n_expert, n_embd: c.n_embd, holds, experts: Box::new(s) };
    serve_node(node, budget, a)
}

/// Serves the experts of `model` until the process is stopped; prints `listening on ADDR` on stdout
/// once the socket is bound.
pub fn serve(model: &Path, load: &LoadOptions, a: &WorkerArgs) -> Result<()> {
    let file = titan_gguf::GgufFile::open(model)?;
    let (config, source) = Model::load_experts(model, load)?;
    if let Some(w) = source.cache().and_then(|c| c.warning()) {
        eprintln!("warning: {w}");
    }
    let budget = match source.cache() {
        Some(c) => c.budget_bytes(),
        None => titan_engine::weights::dense_and_expert_bytes(&file).1,
    };
    let node = NodeModel { identity: model_identity(&file), n_layer: config.n_layer, n_expert: config.n_expert, n_embd: config.n_embd, experts: Box::new(source), holds: None };
    serve_node(node, budget, a)
}

fn serve_node(node: NodeModel, budget: u64, a: &WorkerArgs) -> Result<()> {
    let opts = titan_cluster::WorkerOptions { listen: a.listen.clone(), token: read_token(&a.token_file)?, max_frame: a.max_frame, budget };
    titan_cluster::serve(node, opts, |addr| {
        use std::io::Write;
        println!("listening on {addr}");
        let _ = std::io::stdout().flush();
    })
}
