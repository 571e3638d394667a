//! `titan demo`: the cluster in one command, with nothing but the repository. It starts expert workers
//! as separate processes on loopback, generates the same greedy text on this machine alone and as the
//! backbone of those workers, and shows that the two runs' traces are identical, byte for byte.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use titan_cluster::{Cluster, ClusterOptions};
use titan_engine::experts::ResidentExperts;
use titan_engine::trace::{diff, Trace};
use titan_engine::{GenerateOptions, Generation, Model, SamplerOptions};
use titan_layout::ModelIdentity;

use crate::args::check_context;

#[derive(clap::Args)]
pub struct Args {
    /// The model (default: the trained demo model in models/demo/, else the qwen3moe test fixture).
    #[arg(short = 'm', long = "model")]
    model: Option<PathBuf>,
    /// How many expert workers to start.
    #[arg(long, default_value_t = 3)]
    workers: usize,
    #[arg(short = 'p', long, default_value = "ROMEO: What light through yonder window")]
    prompt: String,
    #[arg(short = 'n', long = "n-predict", default_value_t = 48)]
    n_predict: usize,
    /// Threads of this process (each worker uses one).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    /// contiguous or interleaved.
    #[arg(long, default_value = "contiguous")]
    placement: String,
}

/// The first of the default models that exists, from the working directory or the source tree.
fn default_model() -> Result<PathBuf> {
    let roots = [PathBuf::from("."), Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")];
    for rel in ["models/demo/demo-q8_0.gguf", "tests/fixtures/qwen3moe/q8_0.gguf"] {
        if let Some(p) = roots.iter().map(|r| r.join(rel)).find(|p| p.exists()) {
            // Shown to the user: the source tree's `crates/cli/../..` resolved, and relative where it can be.
            let p = p.canonicalize().unwrap_or(p);
            let here = std::env::current_dir().ok().and_then(|d| d.canonicalize().ok());
            return Ok(here
                .and_then(|d| Some(p.strip_prefix(d).ok()?.to_path_buf()))
                .unwrap_or(p));
        }
    }
    bail!("no default model found (models/demo/demo-q8_0.gguf): pass one with -m")
}

/// Worker processes, killed when dropped.
struct Workers(Vec<Child>);

impl Drop for Workers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Starts `n` workers on loopback ports chosen by the system; returns them and their addresses.
fn start_workers(n: usize, model: &Path, token: &Path, log: &Path) -> Result<(Workers, Vec<String>)> {
    let exe = std::env::current_exe().context("finding the titan executable")?;
    let mut workers = Workers(Vec::new());
    let mut addrs = Vec::new();
    for i in 0..n {
        let log_file = std::fs::File::create(log.join(format!("worker{i}.log")))?;
        let mut child = Command::new(&exe)
            .args(["worker", "--listen", "127.0.0.1:0", "--threads", "1", "--token-file"])
            .arg(token)
            .arg("--model")
            .arg(model)
            .stdout(Stdio::piped())
            .stderr(log_file)
            .spawn()
            .context("starting a worker")?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line)?;
        workers.0.push(child);
        match line.trim().strip_prefix("listening on ") {
            Some(addr) => addrs.push(addr.to_string()),
            None => bail!(
                "worker {i} did not start (see {})",
                log.join(format!("worker{i}.log")).display()
            ),
        }
    }
    Ok((workers, addrs))
}

/// The context of a greedy run of `n` tokens after `prompt_len`.
fn context(prompt_len: usize, n: usize) -> usize {
    prompt_len.saturating_add(n).max(16)
}

fn greedy(model: &Model, prompt: &[u32], n: usize) -> Result<(Generation, Trace, String)> {
    let opts = GenerateOptions {
        max_tokens: n,
        n_ctx: context(prompt.len(), n),
        sampler: SamplerOptions {
            temperature: 0.0,
            ..Default::default()
        },
    };
    let mut trace = Trace::default();
    let mut text = String::new();
    let g = model.generate_traced(prompt, &opts, Some(&mut trace), |t| text.push_str(t))?;
    Ok((g, trace, text))
}

pub fn run(a: Args) -> Result<()> {
    let path = match a.model {
        Some(p) => p,
        None => default_model()?,
    };
    if a.workers == 0 {
        bail!("--workers must be at least 1");
    }
    let dir = tempfile::tempdir()?;
    let token_path = dir.path().join("node.token");
    let mut token = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut token))
        .context("reading /dev/urandom for a node token")?;
    let token_hex: String = token.iter().map(|b| format!("{b:02x}")).collect();
    std::fs::write(&token_path, &token_hex)?;

    // The context is checked as `titan run` checks it, before any worker starts or any cache is allocated.
    let single = Model::load(&path)?;
    let prompt = single.tokenizer.encode(&a.prompt, true, true);
    let n_ctx = context(prompt.len(), a.n_predict);
    check_context(&single, n_ctx, n_ctx, false)
        .with_context(|| format!("-n {}: the prompt and the text generated", a.n_predict))?;

    eprintln!("starting {} workers on loopback for {} …", a.workers, path.display());
    let (_workers, addrs) = start_workers(a.workers, &path, &token_path, dir.path())?;

    let (g1, t1, text1) = greedy(&single, &prompt, a.n_predict)?;
    drop(single);

    let mut model = Model::load(&path)?;
    let opts = ClusterOptions {
        nodes: addrs.clone(),
        token: token_hex.into_bytes(),
        placement: a.placement.parse()?,
        replicas: 1,
        timeout: Duration::from_secs(10),
        model: ModelIdentity::of(&model.weights.file)?.to_string(),
        hot: Vec::new(),
        backbone_share: true,
        audit: 0.0,
        encrypt: false,
    };
    let local = std::mem::replace(
        &mut model.experts,
        Box::new(ResidentExperts::new(model.weights.clone())),
    );
    let cluster = Arc::new(Cluster::connect(
        local,
        model.config.n_layer,
        model.config.dense_lead,
        model.config.n_expert,
        opts,
    )?);
    model.experts = Box::new(cluster.clone());
    model.rows = Box::new(cluster.clone());
    let (g2, t2, text2) = greedy(&model, &prompt, a.n_predict)?;

    let mut out = std::io::stdout().lock();
    writeln!(out, "{}{}", a.prompt, text2)?;
    writeln!(out)?;
    writeln!(
        out,
        "model:      {} ({}, {} layers × {} experts, top-{})",
        path.display(),
        model.config.arch_name,
        model.config.n_layer,
        model.config.n_expert,
        model.config.n_expert_used
    )?;
    write!(out, "{}", cluster.describe())?;
    let rate = |g: &Generation| g.tokens.len().saturating_sub(1) as f64 / g.gen_time.as_secs_f64().max(1e-9);
    writeln!(
        out,
        "decode:     single node {:.1} tok/s, cluster {:.1} tok/s ({} workers on loopback)",
        rate(&g1),
        rate(&g2),
        a.workers
    )?;
    // The two figures are not a benchmark of the cluster: the workers are processes on this machine's own
    // cores, and on a small model a layer's round trip costs more than its experts' arithmetic.
    writeln!(
        out,
        "            (the workers share this machine's cores, and each layer waits for a round trip: these \
         speeds show the exchange at work, not what machines on a network gain; see docs/cluster.md)"
    )?;
    let m = cluster.metrics();
    let steps = (g2.tokens.len()).max(1) as f64;
    let (trips, bytes): (u64, u64) = m.iter().fold((0, 0), |(t, b), (_, n)| {
        (t + n.round_trips, b + n.bytes_out + n.bytes_in)
    });
    let exchange: u64 = m.iter().map(|(_, n)| n.exchange_ns).sum();
    writeln!(
        out,
        "network:    {:.1} round trips and {:.1} KiB per token (prompt included), {:.3} ms per round trip",
        trips as f64 / steps,
        bytes as f64 / 1024.0 / steps,
        exchange as f64 / 1e6 / trips.max(1) as f64
    )?;
    let d = diff(&t1, &t2, None);
    let verdict = if d.identical() && text1 == text2 {
        "IDENTICAL"
    } else {
        "DIFFERENT"
    };
    writeln!(
        out,
        "trace:      {verdict} ({} tensors, {} decisions compared with the single-node run)",
        d.tensors, d.decisions
    )?;
    if verdict != "IDENTICAL" {
        bail!("the cluster's trace differs from the single-node trace");
    }
    Ok(())
}
