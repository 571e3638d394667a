//! Counters for `GET /metrics`, in Prometheus' text format: the engine loop and the handlers update them
//! with relaxed atomics (each is a tally; none orders anything).

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use titan_engine::experts::NodeExchange;
use titan_engine::Model;

#[derive(Default)]
pub struct Metrics {
    pub requests: AtomicU64,
    pub rejected: AtomicU64,
    pub completed: AtomicU64,
    pub queued: AtomicU64,
    pub active: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub generated: AtomicU64,
    steps: AtomicU64,
    step_rows: AtomicU64,
    step_sequences: AtomicU64,
    most_sequences: AtomicU64,
    step_ns: AtomicU64,
    first_tokens: AtomicU64,
    first_token_ns: AtomicU64,
}

impl Metrics {
    pub fn record_step(&self, rows: usize, sequences: usize, took: Duration) {
        self.steps.fetch_add(1, Relaxed);
        self.step_rows.fetch_add(rows as u64, Relaxed);
        self.step_sequences.fetch_add(sequences as u64, Relaxed);
        self.most_sequences.fetch_max(sequences as u64, Relaxed);
        self.step_ns.fetch_add(took.as_nanos() as u64, Relaxed);
    }

    pub fn record_first_token(&self, since_queued: Duration) {
        self.first_tokens.fetch_add(1, Relaxed);
        self.first_token_ns.fetch_add(since_queued.as_nanos() as u64, Relaxed);
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
            "queue_depth",
            "gauge",
            "Requests waiting for a slot.",
            get(&self.queued),
        );
        put(
            "active_sequences",
            "gauge",
            "Sequences in slots at the last step.",
            get(&self.active),
        );
        put(
            "prompt_tokens_total",
            "counter",
            "Prompt tokens accepted.",
            get(&self.prompt_tokens),
        );
        put(
            "generated_tokens_total",
            "counter",
            "Tokens generated.",
            get(&self.generated),
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
        let firsts = get(&self.first_tokens);
        put(
            "time_to_first_token_seconds_mean",
            "gauge",
            "From queueing to the first generated token, averaged.",
            if firsts > 0.0 {
                get(&self.first_token_ns) / 1e9 / firsts
            } else {
                0.0
            },
        );
        if let Some(cache) = model.experts.cache() {
            let s = cache.stats();
            put(
                "expert_cache_hits_total",
                "counter",
                "Expert records found in the cache.",
                s.total.hits as f64,
            );
            put(
                "expert_cache_misses_total",
                "counter",
                "Expert records read from the store.",
                s.total.misses as f64,
            );
            put(
                "expert_cache_resident_bytes",
                "gauge",
                "Bytes of expert records held.",
                s.resident_bytes as f64,
            );
        }
        // A cluster's nodes, one labelled series each.
        let nodes = model.experts.exchanges();
        if !nodes.is_empty() {
            let series: [NodeSeries; 6] = [
                (
                    "node_exchanges_total",
                    "counter",
                    "Layer exchanges with the node.",
                    |n| n.exchanges as f64,
                ),
                (
                    "node_exchange_seconds_total",
                    "counter",
                    "From sending a layer's request to the node to having its answer.",
                    |n| n.exchange_ns as f64 / 1e9,
                ),
                (
                    "node_wait_seconds_total",
                    "counter",
                    "Of the exchange time, what the backbone waited after its own share.",
                    |n| n.wait_ns as f64 / 1e9,
                ),
                ("node_sent_bytes_total", "counter", "Bytes sent to the node.", |n| {
                    n.bytes_out as f64
                }),
                (
                    "node_received_bytes_total",
                    "counter",
                    "Bytes received from the node.",
                    |n| n.bytes_in as f64,
                ),
                (
                    "node_failovers_total",
                    "counter",
                    "Layers whose experts were computed elsewhere because the node failed them.",
                    |n| n.failovers as f64,
                ),
            ];
            for (name, kind, help, value) in series {
                let _ = writeln!(out, "# HELP titan_{name} {help}\n# TYPE titan_{name} {kind}");
                for n in &nodes {
                    let _ = writeln!(out, "titan_{name}{{node=\"{}\"}} {}", n.node, value(n));
                }
            }
        }
        out
    }
}

/// One labelled series per cluster node: name, Prometheus type, help text, and its value for a node.
type NodeSeries = (&'static str, &'static str, &'static str, fn(&NodeExchange) -> f64);
