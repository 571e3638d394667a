//! `titan bench`: prompt and decode speed measured as llama-bench measures them, memory and bytes per token.

use anyhow::{bail, Context, Result};
use titan_store::KvPlan;

use crate::args::{check_context, ModelArgs};
use crate::output::human;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt length in tokens (processed as one batch).
    #[arg(short = 'p', long = "n-prompt", default_value_t = 64)]
    n_prompt: usize,
    /// Tokens to decode, one at a time, from an empty context.
    #[arg(short = 'n', long = "n-gen", default_value_t = 32)]
    n_gen: usize,
    /// Repetitions; the medians are reported.
    #[arg(short = 'r', long = "repetitions", default_value_t = 3)]
    repetitions: usize,
    /// Allow a prompt or a decode past the model's training context (positions it never saw).
    #[arg(long)]
    allow_long_context: bool,
    /// Print one JSON object as the last line.
    #[arg(long)]
    json: bool,
    /// Measure speculative decoding instead, at these acceptance rates (e.g. 0.8,0.6): decode drafting
    /// the plain run's own continuation with that share of its drafts right, against plain decoding of
    /// the same text (sampled at temperature 1 from a -p token prompt, -n tokens).
    #[arg(long = "spec-rate", value_delimiter = ',')]
    spec_rate: Vec<f64>,
    /// The most tokens drafted per step, with --spec-rate (the length is chosen below it as `titan run`
    /// chooses it).
    #[arg(long = "draft-max", default_value_t = 8)]
    draft_max: usize,
    /// The fewest tokens drafted per step (--draft-min 4 --draft-max 4: always four).
    #[arg(long = "draft-min", default_value_t = 0)]
    draft_min: usize,
}

pub fn run(a: Args) -> Result<()> {
    use titan_engine::bench::{bench, median, BenchOptions};
    if a.repetitions == 0 {
        bail!("-r 0: the bench reports the medians of its repetitions, and needs at least one");
    }
    // The bench's one sequence: the prompt (at least one token) and the warm-up's decode step after it, or
    // the decode, with one more position.
    // --spec-rate decodes after the prompt, in one sequence.
    let positions = match a.spec_rate.is_empty() {
        true => a.n_prompt.max(1).max(a.n_gen),
        false => a.n_prompt.max(1).saturating_add(a.n_gen),
    }
    .saturating_add(1);
    let model = a.model.load(KvPlan {
        past_training: a.allow_long_context,
        ..KvPlan::positions(positions)
    })?;
    check_context(&model, positions, positions, a.allow_long_context).with_context(|| {
        format!(
            "-p {} -n {}: the bench's sequence holds {positions} positions",
            a.n_prompt, a.n_gen
        )
    })?;
    if !a.spec_rate.is_empty() {
        return speculative(&a, &model);
    }
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
    let steady_count = |name: &str| r.steady_counters.get(name).copied();
    if let (Some(hits), Some(misses), Some(read)) = (
        steady_count("expert_cache_hits_total"),
        steady_count("expert_cache_misses_total"),
        steady_count("expert_cache_read_bytes_total"),
    ) {
        let per_token = read as u64 / r.steady_tokens.max(1) as u64;
        println!(
            "steady:   second half of each decode {steady:8.2} tok/s, expert hit rate {:.3}, {} read from disk \
             per token",
            hits / (hits + misses).max(1.0),
            human(per_token)
        );
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
    if let Some(s) = model.experts.summary() {
        eprint!("{s}");
    }
    if a.json {
        let to_map = |p: &[(&str, f64)]| -> serde_json::Map<String, serde_json::Value> {
            p.iter().map(|(n, s)| (n.to_string(), (*s).into())).collect()
        };
        // Every unlabelled counter and gauge the expert source keeps (a store's cache: its budget, hits…).
        let mut samples = Vec::new();
        model.experts.samples(&mut samples);
        let experts: serde_json::Map<String, serde_json::Value> = samples
            .iter()
            .filter(|s| s.label.is_none())
            .map(|s| (s.name.to_string(), s.value.into()))
            .collect();
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
            "steady_expert_cache": (!r.steady_counters.is_empty()).then_some(&r.steady_counters),
            "peak_rss_bytes": r.peak_rss_bytes,
            "decode_bytes_per_token": r.decode_bytes_per_token,
            "decode_phase_share": to_map(&r.decode_phases),
            "prompt_phase_share": to_map(&r.prompt_phases),
            "experts": experts,
        });
        println!("{j}");
    }
    Ok(())
}

/// `--spec-rate`: one line per rate, plain decoding first.
fn speculative(a: &Args, model: &titan_engine::Model) -> Result<()> {
    use titan_engine::bench::{bench_speculative, median, SpecBenchOptions};
    if let Some(r) = a.spec_rate.iter().find(|r| !(0.0..=1.0).contains(*r)) {
        bail!("--spec-rate {r}: a rate is a share of drafts, in [0, 1]");
    }
    let rows = bench_speculative(
        model,
        &SpecBenchOptions {
            prompt_tokens: a.n_prompt,
            gen_tokens: a.n_gen,
            repetitions: a.repetitions,
            rates: a.spec_rate.clone(),
            min_drafts: a.draft_min,
            max_drafts: a.draft_max,
        },
    )?;
    println!("model:    {} ({})", a.model.model.display(), model.config.arch_name);
    println!(
        "threads:  {} ({} kernels); decode of {} tokens after a {}-token prompt, {}..={} drafts a step, median of {}",
        rayon::current_num_threads(),
        titan_kernels::isa().name(),
        a.n_gen,
        a.n_prompt,
        a.draft_min,
        a.draft_max,
        a.repetitions
    );
    println!("drafts right   tok/s  speed-up  tokens/step  accepted  weights/token  experts/layer/token  disk/token");
    let moe_layers = model.weights.layers.iter().filter(|l| l.moe.is_some()).count().max(1) as f64;
    let mut json = Vec::new();
    for r in &rows {
        let per_token = |x: f64| x / r.tokens.max(1) as f64;
        let disk = r.counters.get("expert_cache_read_bytes_total").map(|&b| per_token(b));
        let rate = r.rate.map_or("plain".to_string(), |x| format!("{x:.2}"));
        println!(
            "{rate:>12} {:>7.2} {:>8.2}x {:>12.2} {:>9} {:>14} {:>20.1} {:>11}",
            median(&r.tok_s),
            median(&r.speedup),
            r.tokens as f64 / r.spec.steps.max(1) as f64,
            r.rate
                .map_or("-".to_string(), |_| format!("{:.2}", r.spec.acceptance())),
            human(per_token(r.weight_bytes as f64) as u64),
            per_token(r.experts_run as f64) / moe_layers,
            disk.map_or("-".to_string(), |b| human(b as u64)),
        );
        json.push(serde_json::json!({
            "rate": r.rate,
            "decode_tok_s": median(&r.tok_s),
            "decode_tok_s_runs": r.tok_s,
            "speedup": median(&r.speedup),
            "tokens": r.tokens,
            "steps": r.spec.steps,
            "drafted": r.spec.drafted,
            "accepted": r.spec.accepted,
            "weight_bytes_per_token": per_token(r.weight_bytes as f64),
            "experts_per_layer_per_token": per_token(r.experts_run as f64) / moe_layers,
            "disk_bytes_per_token": disk,
        }));
    }
    if let Some(s) = model.experts.summary() {
        eprint!("{s}");
    }
    if a.json {
        let j = serde_json::json!({
            "model": a.model.model.display().to_string(),
            "threads": rayon::current_num_threads(),
            "isa": titan_kernels::isa().name(),
            "n_prompt": a.n_prompt,
            "n_gen": a.n_gen,
            "draft_min": a.draft_min,
            "draft_max": a.draft_max,
            "speculative": json,
        });
        println!("{j}");
    }
    Ok(())
}
