//! `titan worker`: an expert node of a cluster, serving a model's experts, shards of it, or the shards a
//! backbone assigns it, to backbones that present the node token.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Result};
use titan_cluster::fetch::FetchOptions;
use titan_cluster::node::{serve_fetched, serve_model, serve_shards};
use titan_cluster::{read_token, WorkerOptions};
use titan_store::{BudgetChoice, KvPlan};

use crate::args::StreamArgs;
use crate::output::progress_bar;

#[derive(clap::Args)]
pub struct Args {
    /// The GGUF model whose experts this node serves.
    #[arg(short = 'm', long = "model", required_unless_present_any = ["shard", "backbone"], conflicts_with_all = ["shard", "backbone"])]
    model: Option<PathBuf>,
    /// Shards of the model (`titan slice`), comma-separated: the node serves the experts they hold.
    #[arg(long, value_delimiter = ',')]
    shard: Vec<PathBuf>,
    /// Fetch this node's shards from a backbone's slice endpoint (`--serve-slices`), e.g.
    /// http://127.0.0.1:7470, instead of loading a model or shard from disk.
    #[arg(long)]
    backbone: Option<String>,
    /// Where fetched shards are kept (with --backbone); a restart with a complete cache downloads nothing.
    #[arg(long = "cache-dir", requires = "backbone")]
    cache_dir: Option<PathBuf>,
    /// Address to listen on (port 0: any free port). Loopback unless you say otherwise.
    #[arg(long, default_value = "127.0.0.1:7471")]
    listen: String,
    /// The node token backbones must present.
    #[arg(long = "token-file")]
    token_file: PathBuf,
    /// The largest frame accepted, in bytes.
    #[arg(long = "max-frame", default_value_t = titan_net::DEFAULT_MAX_FRAME)]
    max_frame: usize,
    /// Worker threads (default: all cores).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    /// Accept only backbones that encrypt their connection (`--encrypt` on the backbone): activations never
    /// cross the network in the clear.
    #[arg(long)]
    encrypt: bool,
    /// Serve the model's experts only: leave its dense weights unloaded, and take no share of a backbone's
    /// dense products (projections, LM head). Less memory, less speed-up.
    #[arg(long = "experts-only", requires = "model")]
    experts_only: bool,
    #[command(flatten)]
    stream: StreamArgs,
}

/// Prints `listening on ADDR` on stdout once the socket is bound: what scripts and tests wait for.
fn ready(addr: SocketAddr) {
    println!("listening on {addr}");
    let _ = std::io::stdout().flush();
}

pub fn run(a: Args) -> Result<()> {
    let opts = WorkerOptions {
        listen: a.listen.clone(),
        token: read_token(&a.token_file)?,
        max_frame: a.max_frame,
        encrypt: a.encrypt,
    };
    if let Some(m) = &a.model {
        let plan = a.stream.plan(m, KvPlan::NONE)?;
        return Ok(serve_model(m, plan.as_ref(), !a.experts_only, opts, ready)?);
    }
    let Some(backbone) = &a.backbone else {
        return Ok(serve_shards(&a.shard, opts, ready)?);
    };
    let Some(cache_dir) = &a.cache_dir else {
        bail!("--backbone needs --cache-dir (where the shards are kept)")
    };
    let budget = match a.stream.expert_budget.as_deref().map(str::parse::<BudgetChoice>) {
        None => 0,
        Some(Ok(BudgetChoice::Bytes(b))) => b,
        Some(Ok(BudgetChoice::Auto)) => bail!("--expert-budget auto is for a node with a model; give a size"),
        Some(Err(e)) => bail!("--expert-budget: {e}"),
    };
    let fetch = FetchOptions {
        backbone: backbone.trim_end_matches('/').to_string(),
        token: opts.token.clone(),
        node: a.listen.clone(),
        budget,
        cache_dir: cache_dir.clone(),
        patience: Duration::from_secs(3600),
    };
    let mut bar = None;
    let mut progress = |done, total| {
        let bar = bar.get_or_insert_with(|| progress_bar(total, "fetching shards"));
        bar.set_position(done);
        if done >= total {
            bar.finish_and_clear();
        }
    };
    Ok(serve_fetched(&fetch, opts, &mut progress, ready)?)
}
