//! `titan`: the command line. Parsing arguments and printing only; the work happens in the library crates.

mod cluster_args;
mod demo;
mod npy;
mod store_args;

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use titan_engine::{GenerateOptions, Model, Outputs, SamplerOptions, StopReason};
use titan_gguf::GgufFile;
use titan_store::{convert, write_index, ConvertOptions, Layout, Profile, Store, StoreOptions};

use cluster_args::{ClusterArgs, WorkerArgs};
use store_args::{default_store, KvPlan, LayoutArg, StreamArgs};

#[derive(Parser)]
#[command(
    name = "titan",
    version,
    about = "Run mixture-of-experts language models from GGUF files"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt, streaming it to stdout (speed on stderr).
    Run(RunArgs),
    /// Write the logits of every prompt position as a float32 .npy of shape [positions, vocab].
    Logits(LogitsArgs),
    /// Perplexity of a text file, computed as llama.cpp's llama-perplexity computes it.
    Perplexity(PerplexityArgs),
    /// Print the token ids of a text as a JSON array.
    Tokenize(TokenizeArgs),
    /// Describe a GGUF model: architecture, dimensions, experts, tensor types, dense vs expert bytes.
    Inspect(InspectArgs),
    /// Write a GGUF with random, calibrated weights and a real model's dimensions (no download needed).
    Synth(SynthArgs),
    /// Measure prompt and decode speed (as llama-bench does), peak memory and weight bytes per token.
    Bench(BenchArgs),
    /// Write the expert store of a model: an index of the experts' bytes inside the model and their
    /// digests (no copy), or (--layout copy) a copy of every expert as one aligned record.
    Convert(ConvertArgs),
    /// Check every record of an expert store (a copy, or an in-place index) against its digest.
    Verify(VerifyArgs),
    /// Record which experts a run routes to, per layer (for `--pin`).
    Profile(ProfileArgs),
    /// Record a run's internals, per step and layer, into a trace file (safetensors).
    Trace(TraceArgs),
    /// Compare two traces: IDENTICAL (exit 0), or the first divergence (exit 1); unreadable input exits 2.
    TraceDiff(TraceDiffArgs),
    /// Write a shard: the experts of some layers and expert ids, as a GGUF a worker can serve (`--shard`).
    Slice(SliceArgs),
    /// Serve a model's experts to cluster backbones (`--nodes`) over TCP.
    Worker(WorkerCmdArgs),
    /// Start three workers on loopback, generate on one machine and on the cluster, and compare.
    Demo(demo::DemoArgs),
    /// Serve the OpenAI API (completions, chat completions, models), metrics and a chat page over HTTP,
    /// batching concurrent requests.
    Serve(ServeArgs),
}

#[derive(Args)]
struct ServeArgs {
    #[command(flatten)]
    model: ModelArgs,
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
    /// A Jinja chat template file, instead of the model's tokenizer.chat_template.
    #[arg(long = "chat-template")]
    chat_template: Option<PathBuf>,
    /// The model id clients use (default: the file name without .gguf).
    #[arg(long)]
    alias: Option<String>,
    /// Largest request body in bytes (larger ones are answered 413).
    #[arg(long = "max-body", default_value_t = 1 << 20)]
    max_body: usize,
}

#[derive(Args)]
struct SliceArgs {
    /// The GGUF model (never modified).
    model: PathBuf,
    /// Layers to keep, e.g. 0-47.
    #[arg(long)]
    layers: String,
    /// Expert ids to keep, e.g. 0-42.
    #[arg(long)]
    experts: String,
    #[arg(short = 'o', long)]
    output: PathBuf,
}

#[derive(Args)]
struct WorkerCmdArgs {
    #[command(flatten)]
    worker: WorkerArgs,
    /// The GGUF model whose experts this node serves.
    #[arg(short = 'm', long = "model", required_unless_present_any = ["shard", "backbone"], conflicts_with_all = ["shard", "backbone"])]
    model: Option<PathBuf>,
    /// Shards of the model (`titan slice`), comma-separated: the node serves the experts they hold.
    #[arg(long, value_delimiter = ',')]
    shard: Vec<PathBuf>,
    /// Worker threads (default: all cores).
    #[arg(short = 't', long)]
    threads: Option<usize>,
    #[command(flatten)]
    stream: StreamArgs,
}

#[derive(Args)]
struct ModelArgs {
    /// The GGUF model file.
    #[arg(short = 'm', long = "model")]
    model: PathBuf,
    /// Worker threads (default: all cores).
    #[arg(short = 't', long)]
    threads: Option<usize>,
    /// A Hugging Face tokenizer.json to use instead of the GGUF's vocabulary.
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    #[command(flatten)]
    stream: StreamArgs,
    #[command(flatten)]
    cluster: ClusterArgs,
}

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The prompt text.
    #[arg(short = 'p', long)]
    prompt: String,
    #[command(flatten)]
    sampling: SamplingArgs,
}

#[derive(Args, Clone)]
struct SamplingArgs {
    /// Number of tokens to generate.
    #[arg(short = 'n', long = "n-predict", default_value_t = 128)]
    n_predict: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long = "temp", default_value_t = 0.8)]
    temperature: f32,
    #[arg(long = "top-k", default_value_t = 40)]
    top_k: usize,
    #[arg(long = "top-p", default_value_t = 0.95)]
    top_p: f32,
    #[arg(long = "min-p", default_value_t = 0.05)]
    min_p: f32,
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    repeat_penalty: f32,
    /// Seed of the sampler's random generator.
    #[arg(short = 's', long, default_value_t = 0)]
    seed: u64,
    /// KV cache size in tokens (default: the model's training context, at most 4096; at most the training
    /// context unless --allow-long-context).
    #[arg(short = 'c', long = "ctx-size")]
    ctx_size: Option<usize>,
    /// Allow a --ctx-size past the model's training context (positions it never saw: quality degrades).
    #[arg(long)]
    allow_long_context: bool,
}

impl SamplingArgs {
    /// The one sequence a run holds: its context, of which it can use at most the prompt and `-n` tokens.
    fn kv_plan(&self, prompt_tokens_at_most: usize) -> KvPlan {
        KvPlan {
            sequences: 1,
            ctx: self.ctx_size,
            used: Some(prompt_tokens_at_most.saturating_add(self.n_predict)),
            past_training: self.allow_long_context,
        }
    }

    /// The options for a prompt of `prompt_len` tokens, checked before anything is allocated: the sampler's
    /// values, and a context within the model's and within memory (the KV cache is sized for what the
    /// run can use: the prompt and `-n` tokens, at most the context).
    fn options(&self, model: &Model, prompt_len: usize) -> Result<GenerateOptions> {
        let n_ctx = self.ctx_size.unwrap_or_else(|| store_args::default_ctx(&model.config));
        let used = n_ctx.min(prompt_len.saturating_add(self.n_predict));
        let past = self.allow_long_context;
        model
            .check_context(n_ctx, u64::MAX, past)
            .and_then(|()| model.check_context(used, store_args::mem_available().unwrap_or(u64::MAX), past))
            .context("--ctx-size")?;
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

#[derive(Args)]
struct PromptArgs {
    /// Text to tokenize (BOS added as the model's vocabulary asks).
    #[arg(short = 'p', long, conflicts_with = "tokens", required_unless_present = "tokens")]
    prompt: Option<String>,
    /// Comma-separated token ids, used as given.
    #[arg(long, value_delimiter = ',')]
    tokens: Option<Vec<u32>>,
}

/// At most how many tokens `text` encodes to: each token of a vocabulary covers at least one byte of the
/// text, but for the few the vocabulary adds itself (BOS, EOS, a leading space).
fn tokens_at_most(text: &str) -> usize {
    text.len().saturating_add(8)
}

impl PromptArgs {
    fn tokens_at_most(&self) -> usize {
        match (&self.prompt, &self.tokens) {
            (Some(p), _) => tokens_at_most(p),
            (_, Some(t)) => t.len(),
            (None, None) => unreachable!("clap requires one"),
        }
    }

    fn tokens(&self, model: &Model) -> Result<Vec<u32>> {
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

#[derive(Args)]
struct LogitsArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    prompt: PromptArgs,
    /// Output .npy path.
    #[arg(short = 'o', long)]
    output: PathBuf,
}

#[derive(Args)]
struct PerplexityArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The text file.
    #[arg(short = 'f', long = "file")]
    file: PathBuf,
    /// Tokens per chunk (llama-perplexity's -c): each chunk starts from an empty cache, and its second half
    /// is scored.
    #[arg(short = 'c', long = "ctx-size", default_value_t = 512)]
    ctx_size: usize,
}

#[derive(Args)]
struct TokenizeArgs {
    /// The GGUF model file.
    #[arg(short = 'm', long = "model")]
    model: PathBuf,
    text: String,
    /// Do not add BOS/EOS even if the vocabulary asks for them.
    #[arg(long)]
    no_special: bool,
    /// Match special-token text (like "<|im_end|>") as those tokens.
    #[arg(long)]
    parse_special: bool,
}

#[derive(Args)]
struct InspectArgs {
    model: PathBuf,
}

#[derive(Args)]
struct SynthArgs {
    /// Which model's dimensions: olmoe-1b-7b, qwen3-30b-a3b, qwen1.5-moe-a2.7b, mixtral-8x7b, qwen3.6-35b-a3b,
    /// qwen3.5-122b-a10b, gpt-oss-20b, deepseek-v2-lite.
    #[arg(long)]
    preset: String,
    /// Tensor type of the file: q4_0, q8_0, q4_k_m, q6_k, f16, mxfp4 (experts MXFP4, the rest F16, as the
    /// converter writes gpt-oss), mxfp4_moe (llama-quantize's: experts MXFP4, the rest Q8_0).
    #[arg(long = "type")]
    ty: String,
    #[arg(short = 'o', long)]
    output: PathBuf,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Fewer layers than the real model (for quick experiments).
    #[arg(long)]
    layers: Option<usize>,
    /// Tokens of the routing check run on the written file (0 skips it).
    #[arg(long = "routing-tokens", default_value_t = 128)]
    routing_tokens: usize,
}

#[derive(Args)]
struct BenchArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt length in tokens (processed as one batch).
    #[arg(short = 'p', long = "n-prompt", default_value_t = 64)]
    n_prompt: usize,
    /// Tokens to decode, one at a time, from an empty context.
    #[arg(short = 'n', long = "n-gen", default_value_t = 32)]
    n_gen: usize,
    /// Repetitions; the medians are reported.
    #[arg(short = 'r', long = "repetitions", default_value_t = 3)]
    repetitions: usize,
    /// Print one JSON object as the last line.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct TraceArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    prompt: PromptArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Output trace path.
    #[arg(short = 'o', long)]
    output: PathBuf,
}

#[derive(Args)]
struct ConvertArgs {
    /// The GGUF model (never modified).
    model: PathBuf,
    /// The store to write (default beside the model: MODEL.titan for a copy, MODEL.titan-index for an
    /// in-place index).
    #[arg(short = 'o', long)]
    output: Option<PathBuf>,
    /// in-place: an index of the experts inside the model (three reads per expert, no second copy).
    /// copy: every expert copied into an aligned record (one read per expert, twice the disk; measured
    /// no faster, see the README).
    #[arg(long, value_enum, default_value = "in-place")]
    layout: LayoutArg,
    /// Record alignment in bytes (a power of two, at least 512; the copy layout only).
    #[arg(long, default_value_t = titan_store::DEFAULT_ALIGNMENT)]
    alignment: u64,
    /// Replace an existing store.
    #[arg(long)]
    force: bool,
}

#[derive(Args)]
struct VerifyArgs {
    /// The store: a directory written by `titan convert`, or an in-place index file.
    store: PathBuf,
    /// Also check that every expert's bytes in this model are the ones the store holds.
    #[arg(short = 'm', long)]
    model: Option<PathBuf>,
}

#[derive(Args)]
struct ProfileArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    prompt: PromptArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Output profile (JSON).
    #[arg(short = 'o', long)]
    output: PathBuf,
}

#[derive(Args)]
struct TraceDiffArgs {
    a: PathBuf,
    b: PathBuf,
    /// Compare values within this absolute tolerance instead of bit for bit.
    #[arg(long)]
    tolerance: Option<f32>,
}

fn main() {
    let cli = Cli::parse();
    let result = start_pool(cli.command.threads()).and_then(|()| {
        // The command runs on a worker of the pool: the forward pass enters parallel regions several
        // times per layer, and from a worker each is a push onto the worker's own queue, where from
        // outside the pool it is a hand-over to another thread (slower, and it allocates).
        // Except a worker: its accept loop blocks for good, and its connections' threads use the pool.
        if let Command::Worker(a) = cli.command {
            return worker(a);
        }
        // And the server: its engine thread enters the pool itself, and its HTTP side never needs it.
        if let Command::Serve(a) = cli.command {
            return serve(a);
        }
        rayon::scope(|_| match cli.command {
            Command::Run(a) => run(a),
            Command::Logits(a) => logits(a),
            Command::Perplexity(a) => perplexity(a),
            Command::Tokenize(a) => tokenize(a),
            Command::Inspect(a) => inspect(a),
            Command::Synth(a) => synth(a),
            Command::Bench(a) => bench(a),
            Command::Convert(a) => convert_store(a),
            Command::Verify(a) => verify_store(a),
            Command::Profile(a) => profile(a),
            Command::Trace(a) => trace(a),
            Command::TraceDiff(a) => std::process::exit(trace_diff(a)),
            Command::Worker(_) | Command::Serve(_) => unreachable!("served outside the pool"),
            Command::Slice(a) => slice(a),
            Command::Demo(a) => demo::demo(a),
        })
    });
    if let Err(e) = result {
        eprintln!("error: {}", one_line(&e));
        std::process::exit(1);
    }
}

/// The error and its causes on one line, each cause once: many errors already quote their source in
/// their own message (`path: No such file…`), and repeating it would only add noise.
fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain().map(|c| c.to_string()) {
        if !line.contains(&cause) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&cause);
        }
    }
    line
}

impl Command {
    /// The `--threads` the command asks for, if it takes one.
    fn threads(&self) -> Option<usize> {
        match self {
            Command::Run(a) => a.model.threads,
            Command::Logits(a) => a.model.threads,
            Command::Perplexity(a) => a.model.threads,
            Command::Bench(a) => a.model.threads,
            Command::Trace(a) => a.model.threads,
            Command::Profile(a) => a.model.threads,
            Command::Worker(a) => a.threads,
            Command::Demo(a) => a.threads,
            Command::Serve(a) => a.model.threads,
            _ => None,
        }
    }
}

/// Sizes rayon's global pool: `threads` workers, or one per core.
fn start_pool(threads: Option<usize>) -> Result<()> {
    if let Some(n) = threads {
        // More threads than cores only adds contention; thousands take minutes just to start.
        let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
        if n == 0 || n > 4 * cores {
            bail!(
                "--threads {n} is outside 1..={} (4 × the {cores} cores of this machine)",
                4 * cores
            );
        }
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build_global()
            .context("setting up the thread pool")?;
    }
    Ok(())
}

/// Load the model, streaming its experts where its weights do not fit beside the KV caches of `kv`.
fn load(a: &ModelArgs, kv: KvPlan) -> Result<Model> {
    let mut model = Model::load_with(&a.model, &a.stream.load_options(&a.model, kv)?)?;
    if let Some(w) = model.experts.cache().and_then(|c| c.warning()) {
        eprintln!("warning: {w}");
    }
    if let Some(p) = &a.tokenizer {
        model.tokenizer =
            titan_tokenizer::Tokenizer::from_tokenizer_json(p).with_context(|| format!("{}", p.display()))?;
    }
    a.cluster.attach(&mut model)?;
    Ok(model)
}

fn worker(a: WorkerCmdArgs) -> Result<()> {
    match (&a.model, &a.worker.backbone) {
        (Some(m), _) => cluster_args::serve(m, &a.stream.load_options(m, KvPlan::NONE)?, &a.worker),
        (None, Some(_)) => {
            let budget = a
                .stream
                .expert_budget
                .as_deref()
                .map(store_args::parse_size)
                .transpose()?
                .unwrap_or(0);
            cluster_args::serve_fetched(budget, &a.worker)
        }
        (None, None) => cluster_args::serve_shards(&a.shard, &a.worker),
    }
}

fn slice(a: SliceArgs) -> Result<()> {
    use titan_cluster::slice::{parse_range, write_shard, SliceSpec};
    let f = std::sync::Arc::new(GgufFile::open(&a.model)?);
    let spec = SliceSpec {
        layers: parse_range(&a.layers)?,
        experts: parse_range(&a.experts)?,
    };
    let bar = progress_bar(0, "slicing");
    let bytes = write_shard(&f, &spec, &a.output, &mut |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    })?;
    bar.finish_and_clear();
    eprintln!(
        "wrote {} ({}: layers {}, experts {} of {})",
        a.output.display(),
        human(bytes),
        a.layers,
        a.experts,
        a.model.display()
    );
    Ok(())
}

fn serve(a: ServeArgs) -> Result<()> {
    if a.parallel == 0 || a.parallel > 256 {
        bail!("--parallel {} is outside 1..=256", a.parallel);
    }
    let chat_template = a
        .chat_template
        .as_ref()
        .map(|p| std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display())))
        .transpose()?;
    let model = load(
        &a.model,
        KvPlan {
            sequences: a.parallel,
            ctx: a.ctx_size,
            used: None,
            past_training: a.allow_long_context,
        },
    )?;
    let ctx_size = a.ctx_size.unwrap_or_else(|| store_args::default_ctx(&model.config));
    // Every slot holds a whole context's KV cache from the start.
    let memory = store_args::mem_available().unwrap_or(u64::MAX) / a.parallel as u64;
    model
        .check_context(ctx_size, memory, a.allow_long_context)
        .context("--ctx-size (per slot of --parallel)")?;
    let name = a.alias.clone().unwrap_or_else(|| {
        a.model
            .model
            .file_stem()
            .map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned())
    });
    eprintln!(
        "serving {name}: {} slots of {ctx_size} tokens, steps of up to {} tokens, queue of {}",
        a.parallel, a.batch_size, a.queue
    );
    titan_server::serve(
        model,
        titan_server::ServeOptions {
            listen: a.listen,
            api_key: a.api_key,
            name,
            chat_template,
            scheduler: titan_server::SchedulerOptions {
                parallel: a.parallel,
                ctx_size,
                step_tokens: a.batch_size.max(1),
            },
            queue_len: a.queue,
            body_limit: a.max_body,
        },
    )
}

fn run(a: RunArgs) -> Result<()> {
    let model = load(&a.model, a.sampling.kv_plan(tokens_at_most(&a.prompt)))?;
    let prompt = model.tokenizer.encode(&a.prompt, true, true);
    let opts = a.sampling.options(&model, prompt.len())?;
    let mut stdout = std::io::stdout().lock();
    let g = model.generate(&prompt, &opts, |text| {
        let _ = stdout.write_all(text.as_bytes());
        let _ = stdout.flush();
    })?;
    let _ = writeln!(stdout);
    let rate = |n: usize, t: std::time::Duration| n as f64 / t.as_secs_f64().max(1e-9);
    eprintln!(
        "prompt: {} tokens, {:.2} tok/s | generation: {} tokens, {:.2} tok/s{}",
        g.prompt_tokens,
        rate(g.prompt_tokens, g.prompt_time),
        g.tokens.len(),
        rate(g.tokens.len().saturating_sub(1), g.gen_time),
        if g.stop == StopReason::EndOfGeneration {
            " (end of generation)"
        } else {
            ""
        }
    );
    if let Some(c) = model.experts.cache() {
        let t = c.stats().total;
        eprintln!(
            "experts: budget {}, hit rate {:.1}% ({} hits, {} misses), {} read in {:.2} s, stalled {:.2} s, prefetch {} issued / {} used",
            human(c.budget_bytes()),
            100.0 * t.hit_rate(),
            t.hits,
            t.misses,
            human(t.bytes_read),
            t.read_ns as f64 / 1e9,
            t.stall_ns as f64 / 1e9,
            t.prefetch_issued,
            t.prefetch_used
        );
    }
    if let Some(r) = model.experts.report() {
        eprint!("{r}");
    }
    Ok(())
}

fn logits(a: LogitsArgs) -> Result<()> {
    let model = load(&a.model, KvPlan::positions(a.prompt.tokens_at_most()))?;
    let tokens = a.prompt.tokens(&model)?;
    model
        .check_context(tokens.len(), store_args::mem_available().unwrap_or(u64::MAX), false)
        .context("--tokens")?;
    let mut seq = model.new_sequence(tokens.len());
    let logits = model.forward(&tokens, 0, &mut seq, Outputs::All)?;
    let mut f = std::io::BufWriter::new(
        std::fs::File::create(&a.output).with_context(|| format!("creating {}", a.output.display()))?,
    );
    npy::write_f32(&mut f, &[tokens.len(), model.config.n_vocab], logits)
        .and_then(|_| f.flush())
        .with_context(|| format!("writing {}", a.output.display()))?;
    eprintln!(
        "wrote {} × {} logits to {}",
        tokens.len(),
        model.config.n_vocab,
        a.output.display()
    );
    Ok(())
}

fn perplexity(a: PerplexityArgs) -> Result<()> {
    let model = load(&a.model, KvPlan::positions(a.ctx_size))?;
    let text = std::fs::read_to_string(&a.file).with_context(|| format!("reading {}", a.file.display()))?;
    // As llama-perplexity: special tokens added as the vocabulary asks, control-token text kept as text.
    let tokens = model.tokenizer.encode(&text, true, false);
    model
        .check_context(a.ctx_size, store_args::mem_available().unwrap_or(u64::MAX), false)
        .context("--ctx-size")?;
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template("perplexity [{bar:40}] chunk {pos}/{len} eta {eta} {msg}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    let t = std::time::Instant::now();
    let p = titan_engine::perplexity::perplexity(&model, &tokens, a.ctx_size, |done, total, running| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
        bar.set_message(format!("running {running:.4}"));
    })?;
    bar.finish_and_clear();
    let chunks: Vec<String> = (1..=p.chunks.len())
        .map(|i| format!("[{i}]{:.4}", p.after(i)))
        .collect();
    println!("{}", chunks.join(","));
    println!(
        "perplexity: {:.4} over {} chunks of {} tokens ({} tokens scored, {} in the file), {:.1} s",
        p.value(),
        p.chunks.len(),
        a.ctx_size,
        p.chunks.iter().map(|c| c.1).sum::<usize>(),
        tokens.len(),
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

fn tokenize(a: TokenizeArgs) -> Result<()> {
    let f = GgufFile::open(&a.model)?;
    let tok = titan_engine::vocab::tokenizer_from_gguf(&f)?;
    let ids = tok.encode(&a.text, !a.no_special, a.parse_special);
    println!("{}", serde_json::to_string(&ids)?);
    Ok(())
}

fn inspect(a: InspectArgs) -> Result<()> {
    let f = GgufFile::open(&a.model)?;
    let c = titan_engine::Config::from_gguf(&f)?;
    println!(
        "file:          {} (GGUF v{}, {} tensors, {} bytes)",
        a.model.display(),
        f.version,
        f.tensors.len(),
        f.file_len()
    );
    if let Some(name) = f.get_str("general.name")? {
        println!("name:          {name}");
    }
    println!("architecture:  {} ({:?})", c.arch_name, c.arch);
    println!("layers:        {}", c.n_layer);
    println!("embedding:     {}", c.n_embd);
    println!(
        "heads:         {} query, {} key/value, head size {}",
        c.n_head, c.n_head_kv, c.head_dim
    );
    if let Some(s) = &c.delta_net {
        let n = c.n_layer - c.n_attention_layers();
        println!(
            "linear attn:   {n} of {} layers, {} key / {} value heads of {}, {}-tap convolution",
            c.n_layer, s.n_k_heads, s.n_v_heads, s.head_dim, s.conv_kernel
        );
    }
    if c.dense_lead == c.n_layer {
        println!(
            "experts:       none (a dense feed-forward of {} in every layer)",
            c.dense_ff
        );
    } else {
        println!(
            "experts:       {} per layer, {} used per token, expert FFN {}",
            c.n_expert, c.n_expert_used, c.expert_ff
        );
    }
    if c.dense_lead > 0 && c.dense_lead < c.n_layer {
        println!("dense layers:  the first {}, feed-forward {}", c.dense_lead, c.dense_ff);
    }
    if c.shared_ff > 0 {
        println!("shared expert: FFN {}", c.shared_ff);
    }
    println!(
        "vocabulary:    {} tokens ({})",
        c.n_vocab,
        f.get_str("tokenizer.ggml.model")?.unwrap_or("none")
    );
    println!("context:       {} (training)", c.n_ctx_train);
    let mut types: std::collections::BTreeMap<&str, (usize, u64)> = Default::default();
    for t in &f.tensors {
        let e = types.entry(t.ty.name()).or_default();
        e.0 += 1;
        e.1 += t.size;
    }
    let (dense, expert) = titan_engine::weights::dense_and_expert_bytes(&f);
    let types: Vec<String> = types
        .iter()
        .map(|(n, (count, bytes))| format!("{n} ×{count} ({})", human(*bytes)))
        .collect();
    println!("tensor types:  {}", types.join(", "));
    match (c.n_layer - c.dense_lead) * c.n_expert {
        0 => println!("weights:       {} dense, no experts", human(dense)),
        n => println!(
            "weights:       {} dense, {} experts ({} per expert per layer)",
            human(dense),
            human(expert),
            human(expert / n as u64)
        ),
    }
    Ok(())
}

fn bench(a: BenchArgs) -> Result<()> {
    use titan_engine::bench::{bench, median, BenchOptions};
    // The bench's longest sequence: the prompt's, or the decode's, with one more position.
    let model = load(&a.model, KvPlan::positions(a.n_prompt.max(a.n_gen) + 1))?;
    let r = bench(
        &model,
        &BenchOptions {
            prompt_tokens: a.n_prompt,
            gen_tokens: a.n_gen,
            repetitions: a.repetitions,
        },
    )?;
    let (pp, tg) = (median(&r.prompt_tok_s), median(&r.decode_tok_s));
    let threads = rayon::current_num_threads();
    println!("model:    {} ({})", a.model.model.display(), model.config.arch_name);
    println!("threads:  {threads} ({} kernels)", titan_kernels::isa().name());
    println!(
        "prompt:   pp{} {pp:8.2} tok/s (median of {})",
        a.n_prompt,
        r.prompt_tok_s.len()
    );
    println!(
        "decode:   tg{} {tg:8.2} tok/s (median of {})",
        a.n_gen,
        r.decode_tok_s.len()
    );
    let steady = median(&r.decode_steady_tok_s);
    if let Some(c) = &r.steady_cache {
        let per_token = c.bytes_read / r.steady_tokens.max(1) as u64;
        println!("steady:   second half of each decode {steady:8.2} tok/s, expert hit rate {:.3}, {} read from disk per token", c.hit_rate(), human(per_token));
    }
    println!(
        "weights:  {} read per decoded token",
        human(r.decode_bytes_per_token as u64)
    );
    let shares = |p: &[(&str, f64)]| {
        p.iter()
            .map(|(n, s)| format!("{n} {:.0}%", s * 100.0))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!(
        "phases:   decode {}; prompt {}",
        shares(&r.decode_phases),
        shares(&r.prompt_phases)
    );
    println!("peak RSS: {}", human(r.peak_rss_bytes));
    if let Some(r) = model.experts.report() {
        eprint!("{r}");
    }
    if a.json {
        let to_map = |p: &[(&str, f64)]| -> serde_json::Map<String, serde_json::Value> {
            p.iter().map(|(n, s)| (n.to_string(), (*s).into())).collect()
        };
        let j = serde_json::json!({
            "model": a.model.model.display().to_string(),
            "threads": threads,
            "isa": titan_kernels::isa().name(),
            "n_prompt": a.n_prompt,
            "n_gen": a.n_gen,
            "prompt_tok_s": pp,
            "decode_tok_s": tg,
            "prompt_tok_s_runs": r.prompt_tok_s,
            "decode_tok_s_runs": r.decode_tok_s,
            "decode_steady_tok_s": steady,
            "steady_tokens": r.steady_tokens,
            "steady_expert_cache": r.steady_cache,
            "peak_rss_bytes": r.peak_rss_bytes,
            "decode_bytes_per_token": r.decode_bytes_per_token,
            "decode_phase_share": to_map(&r.decode_phases),
            "prompt_phase_share": to_map(&r.prompt_phases),
            "expert_cache": model.experts.cache().map(|c| c.stats()),
        });
        println!("{j}");
    }
    Ok(())
}

pub(crate) fn progress_bar(total: u64, what: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_message(what.to_string());
    bar
}

fn synth(a: SynthArgs) -> Result<()> {
    let preset = titan_synth::preset(&a.preset).with_context(|| {
        let names: Vec<_> = titan_synth::presets().iter().map(|p| p.name).collect();
        format!("unknown preset {:?}: use one of {}", a.preset, names.join(", "))
    })?;
    let ty: titan_synth::FileType = a.ty.parse().map_err(anyhow::Error::msg)?;
    let mut opts = titan_synth::SynthOptions::new(preset.clone(), ty);
    opts.seed = a.seed;
    opts.layers = a.layers;
    let bar = progress_bar(0, "writing");
    let info = titan_synth::synth(&opts, &a.output, &mut |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    })?;
    bar.finish_and_clear();
    eprintln!(
        "wrote {} ({}, {} {}, {} tensors) in {:.1} s",
        a.output.display(),
        human(info.bytes),
        preset.name,
        ty,
        info.tensors,
        info.elapsed.as_secs_f64()
    );
    if a.routing_tokens > 0 {
        eprintln!(
            "routing check: sampling {} tokens with TITAN on the written file…",
            a.routing_tokens
        );
        print!("{}", titan_synth::routing_report(&a.output, a.routing_tokens, a.seed)?);
    }
    Ok(())
}

fn convert_store(a: ConvertArgs) -> Result<()> {
    let f = GgufFile::open(&a.model)?;
    let layout = a.layout.into();
    let out = a.output.clone().unwrap_or_else(|| default_store(&a.model, layout));
    let bar = progress_bar(
        0,
        if layout == Layout::Copy {
            "converting"
        } else {
            "indexing"
        },
    );
    let mut progress = |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    };
    match layout {
        Layout::Copy => {
            let m = convert(
                &f,
                &out,
                &ConvertOptions {
                    alignment: a.alignment,
                    force: a.force,
                },
                &mut progress,
            )?;
            bar.finish_and_clear();
            let bytes: u64 = m.records.iter().map(|r| r.length).sum();
            eprintln!(
                "wrote {} ({} expert records, {}) from {}",
                out.display(),
                m.records.len(),
                human(bytes),
                a.model.display()
            );
        }
        Layout::InPlace => {
            let index = write_index(&f, &out, a.force, &mut progress)?;
            bar.finish_and_clear();
            let bytes: u64 = index
                .layers
                .iter()
                .map(|l| l.record_length() * index.n_expert as u64)
                .sum();
            let size = std::fs::metadata(&out).map(|m| m.len()).unwrap_or(0);
            eprintln!(
                "wrote {} ({}: where {} experts, {}, are in {}, and their digests; no copy)",
                out.display(),
                human(size),
                index.digests.len(),
                human(bytes),
                a.model.display()
            );
        }
    }
    Ok(())
}

fn verify_store(a: VerifyArgs) -> Result<()> {
    let (store, model) = match &a.model {
        Some(m) => {
            let gguf = titan_gguf::GgufFile::open(m)?;
            (Store::open(&a.store, &gguf)?, Some(gguf))
        }
        None => (Store::open_unchecked(&a.store, &StoreOptions::default())?, None),
    };
    let whence = match store.layout() {
        Layout::Copy => String::new(),
        Layout::InPlace => format!(" in place in {}", store.file_path().display()),
    };
    let bar = progress_bar(0, "verifying");
    let r = store.verify(&mut |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    })?;
    bar.finish_and_clear();
    for e in &r.bad {
        eprintln!("error: {e}");
    }
    if !r.is_ok() {
        bail!(
            "{}: {} of {} records failed verification",
            a.store.display(),
            r.bad.len(),
            r.records
        );
    }
    if let Some(gguf) = &model {
        let bad = store.source_mismatches(gguf, true)?;
        if let Some((layer, expert)) = bad.first() {
            bail!(
                "{} was not made from {}: {} experts differ, the first expert {expert} of layer {layer}",
                a.store.display(),
                gguf.path().display(),
                bad.len()
            );
        }
        println!(
            "OK: {} records, {} verified{whence}, every expert equal to {}'s",
            r.records,
            human(r.bytes),
            gguf.path().display()
        );
        return Ok(());
    }
    println!("OK: {} records, {} verified{whence}", r.records, human(r.bytes));
    Ok(())
}

fn profile(a: ProfileArgs) -> Result<()> {
    let model = load(&a.model, a.sampling.kv_plan(a.prompt.tokens_at_most()))?;
    let prompt = a.prompt.tokens(&model)?;
    let opts = a.sampling.options(&model, prompt.len())?;
    // The trace already records every routing decision; the profile counts them.
    let mut t = titan_engine::trace::Trace::default();
    model.generate_traced(&prompt, &opts, Some(&mut t), |_| {})?;
    let (n_layer, n_expert, k) = (model.config.n_layer, model.config.n_expert, model.config.n_expert_used);
    let mut p = Profile::new(n_layer, n_expert);
    // Per layer, every token's chosen experts in order (prompt rows, then each generated token).
    let mut per_layer: Vec<Vec<u32>> = vec![Vec::new(); n_layer];
    for r in t.records.iter().filter(|r| r.name.ends_with(".topk_ids")) {
        let layer: usize = r
            .name
            .split('.')
            .nth(1)
            .and_then(|l| l.strip_prefix('l'))
            .and_then(|l| l.parse().ok())
            .expect("trace names carry the layer");
        let ids: Vec<u32> = r.u32s().collect();
        p.record(layer, &ids);
        per_layer[layer].extend(ids);
    }
    p.save(&a.output)?;
    let tokens = per_layer[0].len() / k;
    eprintln!("wrote the routing profile of {tokens} tokens to {}", a.output.display());
    println!("layer  experts used  hottest expert's share  overlap of consecutive tokens");
    let (mut used_sum, mut overlap_sum) = (0.0, 0.0);
    for (l, ids) in per_layer.iter().enumerate() {
        let mut counts = vec![0usize; n_expert];
        for &e in ids {
            counts[e as usize] += 1;
        }
        let used = counts.iter().filter(|&&c| c > 0).count();
        let hottest = *counts.iter().max().unwrap_or(&0) as f64 / ids.len().max(1) as f64;
        let rows: Vec<&[u32]> = ids.chunks_exact(k).collect();
        let overlap = rows
            .windows(2)
            .map(|w| w[1].iter().filter(|e| w[0].contains(e)).count() as f64 / k as f64)
            .sum::<f64>()
            / rows.len().saturating_sub(1).max(1) as f64;
        println!(
            "{l:>5}  {used:>5} of {n_expert:<5}  {:>21.1}%  {overlap:>29.2}",
            hottest * 100.0
        );
        (used_sum, overlap_sum) = (used_sum + used as f64, overlap_sum + overlap);
    }
    println!(
        "mean   {:>5.1} of {n_expert:<5}  {:>22}  {:>29.2} (independent uniform choice: {:.2})",
        used_sum / n_layer as f64,
        "",
        overlap_sum / n_layer as f64,
        k as f64 / n_expert as f64
    );
    Ok(())
}

fn trace(a: TraceArgs) -> Result<()> {
    let model = load(&a.model, a.sampling.kv_plan(a.prompt.tokens_at_most()))?;
    let prompt = a.prompt.tokens(&model)?;
    let opts = a.sampling.options(&model, prompt.len())?;
    let f = &model.weights.file;
    let header = f
        .bytes(0, f.data_offset as usize)
        .expect("the header lies inside the file");
    let identity = serde_json::json!({
        "file": a.model.model.file_name().map(|n| n.to_string_lossy().into_owned()),
        "bytes": f.file_len(),
        "header_blake3": titan_engine::trace::digest(header),
        "architecture": model.config.arch_name,
    });
    let options = serde_json::json!({
        "prompt_tokens": prompt,
        "n_predict": opts.max_tokens,
        "temperature": opts.sampler.temperature,
        "top_k": opts.sampler.top_k,
        "top_p": opts.sampler.top_p,
        "min_p": opts.sampler.min_p,
        "repeat_penalty": opts.sampler.repeat_penalty,
        "seed": opts.sampler.seed,
        "threads": rayon::current_num_threads(),
        "isa": titan_kernels::isa().name(),
    });
    let mut t = titan_engine::trace::Trace::new(identity, options);
    let g = model.generate_traced(&prompt, &opts, Some(&mut t), |_| {})?;
    t.write(&a.output)?;
    eprintln!(
        "wrote {} records ({} steps, {} generated tokens) to {}",
        t.records.len(),
        g.tokens.len() + 1,
        g.tokens.len(),
        a.output.display()
    );
    Ok(())
}

/// Exit code: 0 identical, 1 different, 2 unreadable input.
fn trace_diff(a: TraceDiffArgs) -> i32 {
    use titan_engine::trace::{diff, Trace};
    let (ta, tb) = match (Trace::read(&a.a), Trace::read(&a.b)) {
        (Ok(x), Ok(y)) => (x, y),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("error: {e}");
            return 2;
        }
    };
    if ta.model != tb.model {
        println!(
            "note: the traces come from different model files ({} vs {})",
            ta.model, tb.model
        );
    }
    let r = diff(&ta, &tb, a.tolerance);
    let counts = format!(
        "{} tensors, {} elements, {} decisions",
        r.tensors, r.elements, r.decisions
    );
    if r.identical() {
        let how = a.tolerance.map(|t| format!(" (within {t:e})")).unwrap_or_default();
        println!("IDENTICAL{how}: {counts}");
        return 0;
    }
    println!("DIFFERENT ({counts} compared)");
    if let Some(s) = &r.structural {
        println!("structure: {s}");
    }
    if let Some(d) = &r.first_tensor {
        println!(
            "first divergence: {} ({}): {} of {} elements differ, max |Δ| {:e}, max {} ULP",
            d.name,
            describe(&d.name),
            d.differing,
            d.elements,
            d.max_abs,
            d.max_ulp
        );
    }
    match &r.first_decision {
        Some(dec) => println!("first differing decision: {dec}"),
        None => println!("decisions: all {} identical", r.decisions),
    }
    1
}

/// "s0002.l013.moe_out" -> "step 2, layer 13, moe_out".
fn describe(name: &str) -> String {
    let mut parts = Vec::new();
    for p in name.split('.') {
        match (p.strip_prefix('s'), p.strip_prefix('l')) {
            (Some(n), _) if n.parse::<u64>().is_ok() => parts.push(format!("step {}", n.parse::<u64>().unwrap())),
            (_, Some(n)) if n.parse::<u64>().is_ok() => parts.push(format!("layer {}", n.parse::<u64>().unwrap())),
            _ => parts.push(p.to_string()),
        }
    }
    parts.join(", ")
}

pub(crate) fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}
