//! `titan`: the command line. Each command parses its arguments, calls the library crates and prints; one
//! file per command in `cmd/`.

mod args;
mod cmd;
mod npy;
mod output;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "titan",
    version,
    about = "Run mixture-of-experts language models from GGUF files"
)]
struct Cli {
    /// How much the libraries log on stderr: error, warn, info, debug or trace (RUST_LOG, in tracing's
    /// filter syntax, overrides it).
    #[arg(long = "log-level", global = true, default_value = "info")]
    log_level: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt, streaming it to stdout (speed on stderr).
    Run(cmd::run::Args),
    /// Write the logits of every prompt position as a float32 .npy of shape [positions, vocab].
    Logits(cmd::logits::Args),
    /// Perplexity of a text file, computed as llama.cpp's llama-perplexity computes it.
    Perplexity(cmd::perplexity::Args),
    /// Print the token ids of a text as a JSON array.
    Tokenize(cmd::tokenize::Args),
    /// Describe a GGUF model: architecture, dimensions, experts, tensor types, dense vs expert bytes.
    Inspect(cmd::inspect::Args),
    /// Write a GGUF with random, calibrated weights and a real model's dimensions (no download needed).
    Synth(cmd::synth::Args),
    /// Measure prompt and decode speed (as llama-bench does), peak memory and weight bytes per token.
    Bench(cmd::bench::Args),
    /// Write the expert store of a model: an index of the experts' bytes inside the model and their
    /// digests (no copy), or (--layout copy) a copy of every expert as one aligned record.
    Convert(cmd::convert::Args),
    /// Check every record of an expert store (a copy, or an in-place index) against its digest.
    Verify(cmd::verify::Args),
    /// Record which experts a run routes to, per layer (for `--pin`).
    Profile(cmd::profile::Args),
    /// Record a run's internals, per step and layer, into a trace file (safetensors).
    Trace(cmd::trace::Args),
    /// Compare two traces: IDENTICAL (exit 0), or the first divergence (exit 1); unreadable input exits 2.
    TraceDiff(cmd::trace_diff::Args),
    /// Write a shard: the experts of some layers and expert ids, as a GGUF a worker can serve (`--shard`).
    Slice(cmd::slice::Args),
    /// Serve a model's experts to cluster backbones (`--nodes`) over TCP.
    Worker(cmd::worker::Args),
    /// Start three workers on loopback, generate on one machine and on the cluster, and compare.
    Demo(cmd::demo::Args),
    /// Serve the OpenAI API (completions, chat completions, models), metrics and a chat page over HTTP,
    /// batching concurrent requests.
    Serve(cmd::serve::Args),
}

fn main() {
    let cli = Cli::parse();
    let service = matches!(cli.command, Command::Worker(_) | Command::Serve(_));
    output::start_log(&cli.log_level, service);
    let result = start_pool(cli.command.threads()).and_then(|()| match cli.command {
        // A worker's accept loop blocks for good, and its connections' threads use the pool; the server's
        // engine thread enters the pool itself, and its HTTP side never needs it.
        Command::Worker(a) => cmd::worker::run(a),
        Command::Serve(a) => cmd::serve::run(a),
        // Everything else runs on a worker of the pool: the forward pass enters parallel regions several
        // times per layer, and from a worker each is a push onto the worker's own queue, where from
        // outside the pool it is a hand-over to another thread (slower, and it allocates).
        command => rayon::scope(|_| match command {
            Command::Run(a) => cmd::run::run(a),
            Command::Logits(a) => cmd::logits::run(a),
            Command::Perplexity(a) => cmd::perplexity::run(a),
            Command::Tokenize(a) => cmd::tokenize::run(a),
            Command::Inspect(a) => cmd::inspect::run(a),
            Command::Synth(a) => cmd::synth::run(a),
            Command::Bench(a) => cmd::bench::run(a),
            Command::Convert(a) => cmd::convert::run(a),
            Command::Verify(a) => cmd::verify::run(a),
            Command::Profile(a) => cmd::profile::run(a),
            Command::Trace(a) => cmd::trace::run(a),
            Command::TraceDiff(a) => std::process::exit(cmd::trace_diff::run(a)),
            Command::Slice(a) => cmd::slice::run(a),
            Command::Demo(a) => cmd::demo::run(a),
            Command::Worker(_) | Command::Serve(_) => unreachable!("run outside the pool"),
        }),
    });
    if let Err(e) = result {
        eprintln!("error: {}", output::one_line(&e));
        std::process::exit(1);
    }
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
            Command::Serve(a) => a.model.threads,
            Command::Worker(a) => a.threads,
            Command::Demo(a) => a.threads,
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
