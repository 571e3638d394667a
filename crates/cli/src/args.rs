//! Argument groups several commands share — the model and where its experts come from, the cluster it
//! leads, sampling, a prompt — and loading a model as they ask.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use titan_cluster::{attach, ClusterError};
use titan_engine::{EngineError, GenerateOptions, Model, SamplerOptions};
use titan_store::plan::{decide, default_ctx, default_store, mem_available};
use titan_store::{check_output, BudgetChoice, ExpertChoice, KvPlan, Layout, OutputKind, Policy, ReadMode};
use titan_store::{EXPERTS_FILE, MANIFEST_FILE};

use crate::output::progress_bar;

mod cluster;
mod spec;
pub use cluster::ClusterArgs;
pub use spec::{SpecArgs, SpecKind};

#[derive(Args)]
pub struct ModelArgs {
    /// The GGUF model file.
    #[arg(short = 'm', long = "model")]
    pub model: PathBuf,
    /// Worker threads (default: all cores).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    /// A Hugging Face tokenizer.json to use instead of the GGUF's vocabulary.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    #[command(flatten)]
    pub stream: StreamArgs,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

impl ModelArgs {
    /// Loads the model, streaming its experts where its weights do not fit beside the KV caches of `kv`,
    /// and makes it a cluster's backbone when nodes are given.
    pub fn load(&self, kv: KvPlan) -> Result<Model> {
        let plan = self.stream.plan(&self.model, kv)?;
        let mut model = titan_store::load_model(&self.model, plan.as_ref())?;
        if let Some(p) = &self.tokenizer {
            // The option, not the path: the errors that come from the file name it themselves.
            model.tokenizer = titan_tokenizer::Tokenizer::from_tokenizer_json(p).context("--tokenizer")?;
        }
        if let Some(opts) = self.cluster.options(&model)? {
            let cluster = attach(&mut model, opts).map_err(|e| match e {
                // The library names the copies; the flag that asked for them is the command line's.
                ClusterError::Replicas { .. } => anyhow::Error::new(e).context("--replicas"),
                e => e.into(),
            })?;
            eprint!("{}", cluster.describe());
        }
        Ok(model)
    }

    /// Refuses `out` as the command's output file before anything is loaded: it must be none of the files
    /// the command reads (the model, its stores, the tokenizer, the profiles, the cluster's files), under any
    /// name, and no device, FIFO, socket or directory.
    pub fn check_output(&self, out: &Path) -> Result<()> {
        let mut inputs: Vec<PathBuf> = [&self.tokenizer, &self.stream.pin, &self.cluster.cluster]
            .into_iter()
            .chain([&self.cluster.token_file, &self.cluster.replicate_hot])
            .flatten()
            .cloned()
            .collect();
        inputs.push(self.model.clone());
        inputs.push(default_store(&self.model, Layout::InPlace));
        for store in self
            .stream
            .store
            .iter()
            .cloned()
            .chain([default_store(&self.model, Layout::Copy)])
        {
            inputs.extend([store.join(MANIFEST_FILE), store.join(EXPERTS_FILE)]);
            inputs.push(store);
        }
        let inputs: Vec<&Path> = inputs.iter().map(PathBuf::as_path).collect();
        Ok(check_output(out, &inputs, OutputKind::File)?)
    }
}

#[derive(Args, Clone, Default)]
pub struct StreamArgs {
    /// Keep at most this many bytes of experts in memory and stream the rest from the expert store
    /// (e.g. 4GiB, 512MiB, or `auto` to size it from free memory). Dense weights stay resident.
    #[arg(long = "expert-budget")]
    pub expert_budget: Option<String>,
    /// The expert store: a store directory or an in-place index, written by `titan convert` (default:
    /// MODEL.titan beside the model, else MODEL.titan-index).
    #[arg(long)]
    pub store: Option<PathBuf>,
    /// Read experts with O_DIRECT, bypassing the page cache (the default with an automatic budget, where
    /// the filesystem allows it).
    #[arg(long = "direct-io")]
    pub direct_io: bool,
    /// Read experts through the page cache (the default with a budget of a given size, where memory
    /// outside it can cache the file).
    #[arg(long = "buffered-io", conflicts_with = "direct_io")]
    pub buffered_io: bool,
    /// Skip the BLAKE3 check of each expert record as it is read.
    #[arg(long = "no-verify")]
    pub no_verify: bool,
    /// Which resident expert to evict first.
    #[arg(long = "cache-policy", value_enum, default_value = "lru")]
    pub policy: PolicyArg,
    /// Pin the hottest experts of a routing profile (from `titan profile`), up to half the budget.
    #[arg(long)]
    pub pin: Option<PathBuf>,
    /// Do not read the next layer's likely experts ahead of time (by default they are read while this
    /// layer computes: 12–24% faster decode on the Zen 4 EPYC's disk, a wash on a slower one).
    #[arg(long = "no-prefetch")]
    pub no_prefetch: bool,
    /// Load every weight into memory even when the model does not fit (by default such a model streams
    /// its experts, from an in-place index made beside it on first use).
    #[arg(long, conflicts_with_all = ["expert_budget", "store"])]
    pub resident: bool,
}

#[derive(ValueEnum, Clone, Copy, Default)]
pub enum PolicyArg {
    #[default]
    Lru,
    Lfu,
}

impl StreamArgs {
    fn choice(&self) -> Result<ExpertChoice> {
        let budget = self
            .expert_budget
            .as_deref()
            .map(|b| b.parse::<BudgetChoice>().map_err(anyhow::Error::msg))
            .transpose()
            .context("--expert-budget")?;
        let io = match (self.direct_io, self.buffered_io) {
            (true, _) => Some(ReadMode::Direct),
            (_, true) => Some(ReadMode::Buffered),
            _ => None,
        };
        Ok(ExpertChoice {
            budget,
            store: self.store.clone(),
            io,
            verify_digests: !self.no_verify,
            policy: match self.policy {
                PolicyArg::Lru => Policy::Lru,
                PolicyArg::Lfu => Policy::Lfu,
            },
            pin: self.pin.clone(),
            prefetch: !self.no_prefetch,
            resident: self.resident,
        })
    }

    /// Whether and how `model`'s experts stream beside the KV caches of `kv` (a progress bar while an
    /// index is made on first use).
    pub fn plan(&self, model: &std::path::Path, kv: KvPlan) -> Result<Option<titan_store::StreamPlan>> {
        let mut bar = None;
        let plan = decide(model, &self.choice()?, kv, &mut |done, total| {
            let bar = bar.get_or_insert_with(|| progress_bar(total, "indexing"));
            bar.set_position(done);
        });
        if let Some(bar) = bar {
            bar.finish_and_clear();
        }
        Ok(plan?)
    }
}

#[derive(Args, Clone)]
pub struct SamplingArgs {
    /// Number of tokens to generate.
    #[arg(short = 'n', long = "n-predict", default_value_t = 128)]
    pub n_predict: usize,
    // The numbers below may be written negative: a value such as `--temp -1` is then the sampler's to refuse,
    // with its range, rather than read as an unknown flag.
    /// Sampling temperature; 0 is greedy.
    #[arg(long = "temp", default_value_t = 0.8, allow_negative_numbers = true)]
    pub temperature: f32,
    #[arg(long = "top-k", default_value_t = 40, allow_negative_numbers = true)]
    pub top_k: usize,
    #[arg(long = "top-p", default_value_t = 0.95, allow_negative_numbers = true)]
    pub top_p: f32,
    #[arg(long = "min-p", default_value_t = 0.05, allow_negative_numbers = true)]
    pub min_p: f32,
    #[arg(long = "repeat-penalty", default_value_t = 1.0, allow_negative_numbers = true)]
    pub repeat_penalty: f32,
    /// Seed of the sampler's random generator.
    #[arg(short = 's', long, default_value_t = 0)]
    pub seed: u64,
    /// KV cache size in tokens (default: the model's training context, at most 4096; at most the training
    /// context unless --allow-long-context).
    #[arg(short = 'c', long = "ctx-size")]
    pub ctx_size: Option<usize>,
    /// Allow a --ctx-size past the model's training context (positions it never saw: quality degrades).
    #[arg(long)]
    pub allow_long_context: bool,
}

impl SamplingArgs {
    /// The one sequence a run holds: its context, of which it can use at most the prompt and `-n` tokens.
    pub fn kv_plan(&self, prompt_tokens_at_most: usize) -> KvPlan {
        KvPlan {
            sequences: 1,
            ctx: self.ctx_size,
            used: Some(prompt_tokens_at_most.saturating_add(self.n_predict)),
            past_training: self.allow_long_context,
            mtp: false,
        }
    }

    /// The options for a prompt of `prompt_len` tokens, checked before anything is allocated: the sampler's
    /// values, and a context within the model's and within memory (the KV cache is sized for what the
    /// run can use: the prompt and `-n` tokens, at most the context).
    pub fn options(&self, model: &Model, prompt_len: usize) -> Result<GenerateOptions> {
        let n_ctx = self.ctx_size.unwrap_or_else(|| default_ctx(&model.config));
        let used = n_ctx.min(prompt_len.saturating_add(self.n_predict));
        check_context(model, n_ctx, used, self.allow_long_context).context("--ctx-size")?;
        let opts = GenerateOptions {
            max_tokens: self.n_predict,
            n_ctx,
            sampler: SamplerOptions {
                temperature: self.temperature,
                top_k: self.top_k,
                top_p: self.top_p,
                min_p: self.min_p,
                repeat_penalty: self.repeat_penalty,
                seed: self.seed,
                ..Default::default()
            },
        };
        opts.sampler.check().map_err(|e| anyhow::anyhow!("sampling: {e}"))?;
        Ok(opts)
    }
}

/// Checks a sequence of `n_ctx` positions, of which a run uses at most `used`, before anything is allocated for
/// it: within the model's training context (unless `past_training`), and its KV cache for the positions used
/// within the memory available. Every command that sizes a sequence from its options checks it here; the
/// caller names the options in the error's context.
pub fn check_context(model: &Model, n_ctx: usize, used: usize, past_training: bool) -> Result<(), EngineError> {
    // Unknown memory (no /proc/meminfo) checks the cache against what can be addressed only.
    let memory = mem_available().unwrap_or(u64::MAX);
    model
        .check_context(n_ctx, u64::MAX, past_training)
        .and_then(|()| model.check_context(used, memory, past_training))
}

#[derive(Args)]
pub struct PromptArgs {
    /// Text to tokenize (BOS added as the model's vocabulary asks).
    #[arg(short = 'p', long, conflicts_with = "tokens", required_unless_present = "tokens")]
    pub prompt: Option<String>,
    /// Comma-separated token ids, used as given.
    #[arg(long, value_delimiter = ',')]
    pub tokens: Option<Vec<u32>>,
}

/// At most how many tokens `text` encodes to: each token of a vocabulary covers at least one byte of the
/// text, but for the few the vocabulary adds itself (BOS, EOS, a leading space).
pub fn tokens_at_most(text: &str) -> usize {
    text.len().saturating_add(8)
}

impl PromptArgs {
    pub fn tokens_at_most(&self) -> usize {
        match (&self.prompt, &self.tokens) {
            (Some(p), _) => tokens_at_most(p),
            (_, Some(t)) => t.len(),
            (None, None) => unreachable!("clap requires one"),
        }
    }

    pub fn tokens(&self, model: &Model) -> Result<Vec<u32>> {
        let tokens = match (&self.prompt, &self.tokens) {
            (Some(p), _) => model.tokenizer.encode(p, true, true),
            (_, Some(t)) => t.clone(),
            (None, None) => unreachable!("clap requires one"),
        };
        if tokens.is_empty() {
            bail!("the prompt has no tokens");
        }
        Ok(tokens)
    }
}

/// An engine error in the command line's terms: a full context names the option that sizes it.
pub fn with_hint(e: EngineError) -> anyhow::Error {
    match e {
        EngineError::ContextFull { .. } => anyhow::anyhow!("{e}: use a larger --ctx-size or a shorter prompt"),
        e => e.into(),
    }
}
