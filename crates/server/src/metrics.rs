//! Counters for `GET /metrics`, in Prometheus' text format: the engine loop and the handlers update them
//! with relaxed atomics (each is a tally; none orders anything).

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use titan_engine::Model;

#[derive(Default)]
pub struct Metrics {
    pub requests: AtomicU64,
    pub rejected: AtomicU64,
    pub completed: AtomicU64,
    pub queued: AtomicU64,
    pub active: AtomicU64,
    pub connections_open: AtomicU64,
    pub connections_refused: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub prompt_tokens_cached: AtomicU64,
    pub generated: AtomicU64,
    steps: AtomicU64,
    step_rows: AtomicU64,
    step_sequences: AtomicU64,
    most_sequences: AtomicU64,
    step_ns: AtomicU64,
    first_tokens: AtomicU64,
    first_token_ns: AtomicU64,
    drafted: AtomicU64,
    accepted: AtomicU64,
    /// Of the first tokens, how many came within each of [`FIRST_TOKEN_BUCKETS`] (not cumulative).
    first_token_within: [AtomicU64; FIRST_TOKEN_BUCKETS.len()],
}

/// The upper bounds, in seconds, of the time-to-first-token histogram's buckets: from a cached prompt on a
/// fast machine to a long prompt on a weak one.
const FIRST_TOKEN_BUCKETS: [f64; 12] = [0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0];

impl Metrics {
    pub fn record_step(&self, rows: usize, sequences: usize, took: Duration) {
        self.steps.fetch_add(1, Relaxed);
        self.step_rows.fetch_add(rows as u64, Relaxed);
        self.step_sequences.fetch_add(sequences as u64, Relaxed);
        self.most_sequences.fetch_max(sequences as u64, Relaxed);
        self.step_ns.fetch_add(took.as_nanos() as u64, Relaxed);
    }

    pub fn record_drafts(&self, drafted: usize, accepted: usize) {
        self.drafted.fetch_add(drafted as u64, Relaxed);
        self.accepted.fetch_add(accepted as u64, Relaxed);
    }

    pub fn record_first_token(&self, since_queued: Duration) {
        self.first_tokens.fetch_add(1, Relaxed);
        self.first_token_ns.fetch_add(since_queued.as_nanos() as u64, Relaxed);
        let secs = since_queued.as_secs_f64();
        if let Some(i) = FIRST_TOKEN_BUCKETS.iter().position(|&le| secs <= le) {
            self.first_token_within[i].fetch_add(1, Relaxed);
        }
    }

    /// The exposition text; the expert cache's and the cluster's counters come from `model`.
    pub fn render(&self, model: &Model) -> String {
        let mut out = String::new();
        let mut put = |name: &str, kind: &str, help: &str, value: f64| {
            let _ = writeln!(
                out,
                "# HELP titan_{name} {help}\n# TYPE titan_{name} {kind}\ntitan_{name} {value}"
            );
        };
        let get = |c: &AtomicU64| c.load(Relaxed) as f64;
        put(
            "requests_total",
            "counter",
            "Requests accepted into the queue.",
            get(&self.requests),
        );
        put(
            "requests_rejected_total",
            "counter",
            "Requests refused because the queue was full (429).",
            get(&self.rejected),
        );
        put(
            "requests_completed_total",
            "counter",
            "Requests that finished (stop or length).",
            get(&self.completed),
        );
        put(
            "connections_open",
            "gauge",
            "HTTP connections open.",
            get(&self.connections_open),
        );
        put(
            "connections_refused_total",
            "counter",
            "HTTP connections refused because --max-connections were open (503).",
            get(&self.connections_refused),
        );
        put(
            "queue_depth",
            "gauge",
            "Requests waiting for a slot.",
            get(&self.queued),
        );
        put(
            "active_sequences",
            "gauge",
            "Sequences in slots: held by requests not yet finished or abandoned.",
            get(&self.active),
        );
        put(
            "prompt_tokens_total",
            "counter",
            "Prompt tokens accepted.",
            get(&self.prompt_tokens),
        );
        put(
            "prompt_tokens_cached_total",
            "counter",
            "Prompt tokens not computed: a free slot's cache held them from an earlier request.",
            get(&self.prompt_tokens_cached),
        );
        put(
            "generated_tokens_total",
            "counter",
            "Tokens generated.",
            get(&self.generated),
        );
        put(
            "draft_tokens_total",
            "counter",
            "Tokens drafted (prompt lookup, a draft model or the MTP block) and verified in a step.",
            get(&self.drafted),
        );
        put(
            "draft_tokens_accepted_total",
            "counter",
            "Drafted tokens that were the token sampled at their position, and kept.",
            get(&self.accepted),
        );
        // Batch sizes as counters: rows or sequences per step over any interval is the ratio of increases.
        put("steps_total", "counter", "Forward steps run.", get(&self.steps));
        put(
            "step_rows_total",
            "counter",
            "Token rows computed, over all steps.",
            get(&self.step_rows),
        );
        put(
            "step_sequences_total",
            "counter",
            "Sequences advanced, over all steps.",
            get(&self.step_sequences),
        );
        put(
            "step_sequences_max",
            "gauge",
            "The most sequences advanced in one step since the server started.",
            get(&self.most_sequences),
        );
        let busy = get(&self.step_ns) / 1e9;
        put("step_seconds_total", "counter", "Time spent in forward steps.", busy);
        put(
            "tokens_per_second",
            "gauge",
            "Generated tokens per second of step time.",
            if busy > 0.0 { get(&self.generated) / busy } else { 0.0 },
        );
        self.first_token_histogram(&mut out);
        // What the expert source counts (a store's cache, a cluster's nodes), one family per name.
        let mut samples = Vec::new();
        model.experts.samples(&mut samples);
        let mut seen = std::collections::BTreeSet::new();
        for s in &samples {
            if seen.insert(s.name) {
                let _ = writeln!(
                    out,
                    "# HELP titan_{} {}\n# TYPE titan_{} {}",
                    s.name,
                    s.help,
                    s.name,
                    s.kind.name()
                );
                for t in samples.iter().filter(|t| t.name == s.name) {
                    match &t.label {
                        Some((k, v)) => {
                            let _ = writeln!(out, "titan_{}{{{k}=\"{}\"}} {}", t.name, escape(v), t.value);
                        }
                        None => {
                            let _ = writeln!(out, "titan_{} {}", t.name, t.value);
                        }
                    }
                }
            }
        }
        out
    }

    /// The time-to-first-token histogram, in Prometheus' form: cumulative buckets, the sum and the count.
    fn first_token_histogram(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "# HELP titan_time_to_first_token_seconds From queueing to the first generated token.\n\
             # TYPE titan_time_to_first_token_seconds histogram"
        );
        let mut within = 0;
        for (le, n) in FIRST_TOKEN_BUCKETS.iter().zip(&self.first_token_within) {
            within += n.load(Relaxed);
            let _ = writeln!(out, "titan_time_to_first_token_seconds_bucket{{le=\"{le}\"}} {within}");
        }
        let firsts = self.first_tokens.load(Relaxed);
        let _ = writeln!(
            out,
            "titan_time_to_first_token_seconds_bucket{{le=\"+Inf\"}} {firsts}\n\
             titan_time_to_first_token_seconds_sum {}\n\
             titan_time_to_first_token_seconds_count {firsts}",
            self.first_token_ns.load(Relaxed) as f64 / 1e9
        );
    }
}

/// A label value as the text format wants it: backslash, quote and newline escaped.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_tokens_fill_a_cumulative_histogram() {
        let m = Metrics::default();
        for ms in [30, 700, 1000, 400_000] {
            m.record_first_token(Duration::from_millis(ms));
        }
        let mut out = String::new();
        m.first_token_histogram(&mut out);
        let value = |series: &str| {
            out.lines()
                .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
                .unwrap_or_else(|| panic!("{series} missing from:\n{out}"))
                .to_string()
        };
        let bucket = |le: &str| value(&format!("titan_time_to_first_token_seconds_bucket{{le=\"{le}\"}}"));
        assert_eq!(bucket("0.05"), "1");
        assert_eq!(bucket("0.5"), "1");
        // A bound is inclusive: the 1 s token is within le="1".
        assert_eq!(bucket("1"), "3");
        assert_eq!(bucket("300"), "3");
        assert_eq!(bucket("+Inf"), "4");
        assert_eq!(value("titan_time_to_first_token_seconds_count"), "4");
        assert_eq!(value("titan_time_to_first_token_seconds_sum"), "401.73");
        assert!(out.contains("# TYPE titan_time_to_first_token_seconds histogram"));
    }
}
