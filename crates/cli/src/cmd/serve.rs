//! `titan serve`: the OpenAI-compatible server.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use titan_server::DraftSource;
use titan_store::plan::{default_ctx, mem_available};
use titan_store::KvPlan;

use crate::args::ModelArgs;
use crate::args::{SpecArgs, SpecKind};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: String,
    /// Require `Authorization: Bearer KEY` on /v1/*.
    #[arg(long = "api-key")]
    api_key: Option<String>,
    /// Sequences served at once.
    #[arg(long, default_value_t = 4)]
    parallel: usize,
    /// KV cache positions of each sequence (default: the model's training context, at most 4096).
    #[arg(short = 'c', long = "ctx-size")]
    ctx_size: Option<usize>,
    /// Allow a --ctx-size past the model's training context.
    #[arg(long)]
    allow_long_context: bool,
    /// Requests that may wait for a slot; past that, new ones are answered 429.
    #[arg(long, default_value_t = 64)]
    queue: usize,
    /// Most tokens one step carries (every decoding sequence's next token, then prompt chunks).
    #[arg(short = 'b', long = "batch-size", default_value_t = 512)]
    batch_size: usize,
    /// Compute every prompt whole: a request reuses nothing of what a free slot's cache holds (by default it
    /// goes to the slot holding the longest prefix of its prompt and computes only the rest).
    #[arg(long = "no-prompt-cache")]
    no_prompt_cache: bool,
    /// A Jinja chat template file, instead of the model's tokenizer.chat_template.
    #[arg(long = "chat-template")]
    chat_template: Option<PathBuf>,
    /// The model id clients use (default: the file name without .gguf).
    #[arg(long)]
    alias: Option<String>,
    /// Largest request body in bytes (larger ones are answered 413).
    #[arg(long = "max-body", default_value_t = 1 << 20)]
    max_body: usize,
    /// Seconds a connection may take to send a request's header whole, counted from when the server starts
    /// waiting for it (so also how long an idle kept-alive connection stays open); then it is closed.
    #[arg(long = "header-timeout", default_value_t = 10, value_name = "SECS")]
    header_timeout: u64,
    /// Seconds a request's body may take to arrive whole after its header (then: 408).
    #[arg(long = "body-timeout", default_value_t = 30, value_name = "SECS")]
    body_timeout: u64,
    /// Drafts after each decoding sequence's row, verified in the same step (--draft-max 0 or --spec off:
    /// none); a draft model or the MTP block drafts for every slot. The output is the same bytes either way.
    #[command(flatten)]
    spec: SpecArgs,
    /// Connections open at once; past it, a new one is answered 503 and closed.
    #[arg(long = "max-connections", default_value_t = 256)]
    max_connections: usize,
}

pub fn run(a: Args) -> Result<()> {
    if a.parallel == 0 || a.parallel > 256 {
        bail!("--parallel {} is outside 1..=256", a.parallel);
    }
    // A timeout of 0 would close every connection at once; a day is past any use and keeps Instant + it sane.
    for (flag, secs) in [
        ("--header-timeout", a.header_timeout),
        ("--body-timeout", a.body_timeout),
    ] {
        if !(1..=86_400).contains(&secs) {
            bail!("{flag} {secs} is outside 1..=86400 seconds");
        }
    }
    if a.max_connections == 0 {
        bail!("--max-connections 0 would refuse every connection");
    }
    let chat_template = a
        .chat_template
        .as_ref()
        .map(|p| {
            std::fs::read_to_string(p)
                .with_context(|| format!("reading {}", p.display()))
                .map(|source| titan_server::TemplateFile {
                    path: p.clone(),
                    source,
                })
        })
        .transpose()?;
    let model = a.model.load(KvPlan {
        sequences: a.parallel,
        ctx: a.ctx_size,
        used: None,
        past_training: a.allow_long_context,
        mtp: a.spec.kind() == SpecKind::Mtp,
    })?;
    let ctx_size = a.ctx_size.unwrap_or_else(|| default_ctx(&model.config));
    // Every slot holds a whole context's KV cache from the start. Unknown memory (no /proc/meminfo) checks
    // the cache against what can be addressed only.
    let memory = mem_available().map_or(u64::MAX, |m| m / a.parallel as u64);
    model
        .check_context(ctx_size, memory, a.allow_long_context)
        .context("--ctx-size (per slot of --parallel)")?;
    // What drafts need, checked once here (and again by each slot's drafter): the draft model, resident,
    // against the model's vocabulary; the MTP block, in the model's file.
    let drafts = match a.spec.kind() {
        SpecKind::Off | SpecKind::Ngram => DraftSource::Lookup,
        SpecKind::Mtp => {
            model.mtp_state(1).context("--spec mtp")?;
            DraftSource::Mtp
        }
        SpecKind::Draft => {
            let p = (a.spec.draft.as_ref()).context("--spec draft needs a draft model: --draft MODEL.gguf")?;
            let d = titan_engine::Model::load(p).with_context(|| format!("--draft {}", p.display()))?;
            titan_engine::draft::ModelDrafter::new(&d, &model, 1).context("--draft")?;
            DraftSource::Model(std::sync::Arc::new(d))
        }
    };
    let max_drafts = match a.spec.kind() {
        SpecKind::Off => 0,
        _ => a.spec.draft_max,
    };
    let name = a.alias.clone().unwrap_or_else(|| {
        a.model
            .model
            .file_stem()
            .map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned())
    });
    tracing::info!(
        "serving {name}: {} slots of {ctx_size} tokens, steps of up to {} tokens, queue of {}, prompt cache {}",
        a.parallel,
        a.batch_size,
        a.queue,
        if a.no_prompt_cache { "off" } else { "on" }
    );
    let served = titan_server::serve(
        model,
        titan_server::ServeOptions {
            listen: a.listen,
            api_key: a.api_key,
            name,
            model_path: a.model.model.clone(),
            chat_template,
            scheduler: titan_server::SchedulerOptions {
                parallel: a.parallel,
                ctx_size,
                step_tokens: a.batch_size.max(1),
                prompt_cache: !a.no_prompt_cache,
                min_drafts: a.spec.draft_min,
                max_drafts,
                drafts,
            },
            queue_len: a.queue,
            body_limit: a.max_body,
            header_timeout: Duration::from_secs(a.header_timeout),
            body_timeout: Duration::from_secs(a.body_timeout),
            max_connections: a.max_connections,
        },
    );
    match (served, &a.chat_template) {
        (Err(e @ titan_server::ServeError::Template(_)), Some(file)) => {
            Err(anyhow::Error::new(e).context(format!("--chat-template {}", file.display())))
        }
        (served, _) => Ok(served?),
    }
}
