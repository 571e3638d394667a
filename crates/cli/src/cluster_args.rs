//! Command-line options for running as a cluster's backbone, and `titan worker`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use titan_cluster::fetch::{fetch, FetchOptions};
use titan_cluster::slice::{ShardExperts, Shards};
use titan_cluster::slice_http::{SliceServer, SliceServerOptions};
use titan_cluster::{model_identity, read_token, Cluster, ClusterOptions, NodeModel};
use titan_engine::experts::{ExpertSource, Experts};
use titan_engine::{LoadOptions, Model};
use titan_gguf::GgufFile;

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
}

impl ClusterArgs {
    /// The hottest `--hot-share` of each layer's experts in the `--replicate-hot` profile.
    fn hot_experts(&self, model: &Model) -> Result<Vec<(usize, usize)>> {
        let Some(path) = &self.replicate_hot else {
            return Ok(Vec::new());
        };
        let profile = titan_store::Profile::load(path)?;
        let (n_layer, n_expert) = (model.config.n_layer, model.config.n_expert);
        if profile.counts.len() != n_layer || profile.counts.iter().any(|r| r.len() != n_expert) {
            bail!(
                "{}: a profile of another model ({} layers; this one has {n_layer} of {n_expert} experts)",
                path.display(),
                profile.counts.len()
            );
        }
        let per_layer = ((n_expert as f64 * self.hot_share.clamp(0.0, 1.0)).ceil() as usize).min(n_expert);
        let mut hot = Vec::new();
        for (l, counts) in profile.counts.iter().enumerate() {
            let mut order: Vec<usize> = (0..n_expert).filter(|&e| counts[e] > 0).collect();
            order.sort_by(|&a, &b| counts[b].cmp(&counts[a]).then(a.cmp(&b)));
            hot.extend(order.into_iter().take(per_layer).map(|e| (l, e)));
        }
        Ok(hot)
    }

    fn node_list(&self) -> Result<Vec<String>> {
        let Some(path) = &self.cluster else {
            return Ok(self.nodes.clone());
        };
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading the cluster file {}", path.display()))?;
        Ok(text
            .lines()
            .map(|l| l.split('#').next().unwrap_or("").trim())
            .filter(|l| !l.is_empty())
            .map(String::from)
            .collect())
    }

    /// Turns `model` into a cluster's backbone when nodes are given: its own expert source stays as
    /// the fallback for experts no live node holds. Prints the plan on stderr.
    pub fn attach(&self, model: &mut Model) -> Result<Option<Arc<Cluster>>> {
        let nodes = self.node_list()?;
        if nodes.is_empty() {
            return Ok(None);
        }
        let Some(token_file) = &self.token_file else {
            bail!("--nodes needs --token-file (the token the workers were started with)")
        };
        let opts = ClusterOptions {
            nodes,
            token: read_token(token_file)?,
            placement: self.placement.parse()?,
            replicas: self.replicas,
            timeout: Duration::from_millis(self.node_timeout_ms.max(1)),
            model: model_identity(&model.weights.file),
            hot: self.hot_experts(model)?,
        };
        let (placement, replicas) = (opts.placement, opts.replicas);
        let slices = match &self.serve_slices {
            None => None,
            Some(listen) => {
                let server = SliceServer::start(
                    Arc::new(GgufFile::open(model.weights.file.path())?),
                    SliceServerOptions {
                        listen: listen.clone(),
                        token: opts.token.clone(),
                        nodes: opts.nodes.clone(),
                        placement,
                        replicas,
                        hot: opts.hot.clone(),
                    },
                )?;
                eprintln!(
                    "serving slices on http://{}; waiting for {} nodes to join",
                    server.addr,
                    opts.nodes.len()
                );
                server.wait_for_plan(Duration::from_secs(self.join_timeout_s))?;
                eprintln!("plan made; waiting for the nodes to download their shards and start");
                Some(server)
            }
        };
        let local = std::mem::replace(
            &mut model.experts,
            Box::new(ExpertSource::Resident(model.weights.clone())),
        );
        let deadline = Instant::now() + Duration::from_secs(self.join_timeout_s);
        let mut cluster = connect_patiently(local, model, opts, slices.is_some().then_some(deadline))?;
        if let Some(server) = slices {
            cluster.keep_serving_slices(server);
        }
        let cluster = Arc::new(cluster);
        eprint!("{}", cluster.describe());
        model.experts = Box::new(cluster.clone());
        Ok(Some(cluster))
    }
}

/// Connects to the nodes; with a deadline (nodes still downloading their shards), a node that is not
/// listening yet is waited for.
fn connect_patiently(
    local: Box<dyn Experts>,
    model: &Model,
    opts: ClusterOptions,
    deadline: Option<Instant>,
) -> Result<Cluster> {
    let (n_layer, dense, n_expert) = (model.config.n_layer, model.config.dense_lead, model.config.n_expert);
    let mut local = Some(local);
    loop {
        // Reachability first, so that `local` is only handed over for a connection that can succeed.
        let unreachable = opts
            .nodes
            .iter()
            .find(|n| std::net::TcpStream::connect(n.as_str()).is_err());
        match (unreachable, deadline) {
            (Some(_), Some(d)) if Instant::now() < d => std::thread::sleep(Duration::from_millis(200)),
            _ => return Cluster::connect(local.take().expect("connected once"), n_layer, dense, n_expert, opts),
        }
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
    /// Fetch this node's shards from a backbone's slice endpoint (`--serve-slices`), e.g.
    /// http://127.0.0.1:7470, instead of loading a model or shard from disk.
    #[arg(long)]
    pub backbone: Option<String>,
    /// Where fetched shards are kept (with --backbone); a restart with a complete cache downloads nothing.
    #[arg(long = "cache-dir", requires = "backbone")]
    pub cache_dir: Option<PathBuf>,
}

/// Joins the backbone, fetches what the cache lacks of this node's assignment, and serves it.
pub fn serve_fetched(budget: u64, a: &WorkerArgs) -> Result<()> {
    let backbone = a.backbone.as_deref().expect("called with --backbone");
    let Some(cache_dir) = &a.cache_dir else {
        bail!("--backbone needs --cache-dir (where the shards are kept)")
    };
    if a.listen.ends_with(":0") {
        bail!("--backbone needs a fixed --listen port: the backbone dials the address this node joins with");
    }
    let opts = FetchOptions {
        backbone: backbone.trim_end_matches('/').to_string(),
        token: read_token(&a.token_file)?,
        node: a.listen.clone(),
        budget,
        cache_dir: cache_dir.clone(),
        patience: Duration::from_secs(3600),
    };
    let bar = crate::progress_bar(0, "fetching shards");
    let fetched = fetch(&opts, &mut |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    })?;
    bar.finish_and_clear();
    eprintln!(
        "worker: downloaded {} bytes; serving {} shards from {}",
        fetched.downloaded,
        fetched.shards.len(),
        cache_dir.display()
    );
    serve_shards(&fetched.shards, a)
}

/// Serves the experts of shards (`titan slice`) of one model until the process is stopped; every
/// expert's digest is checked first.
pub fn serve_shards(paths: &[PathBuf], a: &WorkerArgs) -> Result<()> {
    let shards = paths
        .iter()
        .map(|p| ShardExperts::open(p, true))
        .collect::<Result<Vec<_>>>()?;
    let first = shards.first().context("no shard given")?;
    if let Some(other) = shards.iter().find(|s| s.model != first.model) {
        bail!(
            "the shards come from different models ({} and {})",
            first.model,
            other.model
        );
    }
    let (c, identity) = (first.config.clone(), first.model.clone());
    let budget = shards.iter().map(ShardExperts::expert_bytes).sum();
    let shards = Shards(shards);
    let node = NodeModel {
        identity,
        n_layer: c.n_layer,
        n_expert: c.n_expert,
        n_embd: c.n_embd,
        holds: Some(shards.holdings()),
        experts: Box::new(shards),
    };
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
    let node = NodeModel {
        identity: model_identity(&file),
        n_layer: config.n_layer,
        n_expert: config.n_expert,
        n_embd: config.n_embd,
        experts: Box::new(source),
        holds: None,
    };
    serve_node(node, budget, a)
}

fn serve_node(node: NodeModel, budget: u64, a: &WorkerArgs) -> Result<()> {
    let opts = titan_cluster::WorkerOptions {
        listen: a.listen.clone(),
        token: read_token(&a.token_file)?,
        max_frame: a.max_frame,
        budget,
    };
    titan_cluster::serve(node, opts, |addr| {
        use std::io::Write;
        println!("listening on {addr}");
        let _ = std::io::stdout().flush();
    })
}
