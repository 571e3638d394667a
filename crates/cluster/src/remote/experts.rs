//! The experts of each MoE layer: one request to each node that holds some of the chosen experts, the
//! backbone's own share computed meanwhile, and every output handed to the engine's combine.

use std::io::Write;
use std::time::{Duration, Instant};

use titan_engine::experts::{ExpertJob, Experts};
use titan_engine::samples::Sample;
use titan_engine::EngineError;
use titan_kernels::GgmlType;
use titan_net::{read_frame, write_frame, Kind, DEFAULT_MAX_FRAME, HEADER_LEN};
use tracing::Span;

use super::{Cluster, NodeMetrics, State};
use crate::proto::{decode_output, encode_compute};
use crate::ExchangeError;

impl Experts for Cluster {
    fn input_type(&self, layer: usize) -> Result<GgmlType, EngineError> {
        self.local.input_type(layer)
    }

    fn apply(
        &self,
        job: &ExpertJob,
        meanwhile: &mut dyn FnMut() -> Result<(), EngineError>,
        deliver: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<(), EngineError> {
        let mut guard = self.lock();
        let st = &mut *guard;
        self.revive(st);

        // Who computes what: each expert's first live owner, else the backbone.
        st.local.clear();
        for n in st.nodes.iter_mut() {
            n.assigned.clear();
        }
        for (i, &e) in job.ids.iter().enumerate() {
            match self.live_owner(st, job.layer, e) {
                Some(n) => st.nodes[n].assigned.push(i),
                None => st.local.push(i),
            }
        }

        // One request to each involved node, all sent before any answer is awaited.
        for n in 0..st.nodes.len() {
            if st.nodes[n].assigned.is_empty() {
                continue;
            }
            let span = tracing::debug_span!("exchange", layer = job.layer, node = n);
            let entered = span.enter();
            let id = st.next_id;
            st.next_id += 1;
            if let Err(e) = send(st, n, id, job) {
                self.down(st, n, &format!("sending layer {}: {e}", job.layer));
            }
            drop(entered);
            st.nodes[n].span = span;
        }

        // The caller's own work (the shared expert) and the backbone's share, while the nodes work.
        meanwhile()?;
        let local = std::mem::take(&mut st.local);
        let r = compute_here(&*self.local, job, &local, st, deliver);
        st.local = local;
        r?;
        let waiting_since = Instant::now();

        // The answers, in node order; a node that fails has its share computed here.
        for n in 0..st.nodes.len() {
            let span = std::mem::replace(&mut st.nodes[n].span, Span::none());
            if st.nodes[n].pending.is_none() {
                continue;
            }
            let _entered = span.enter();
            match receive(st, n, job, deliver, self.opts.timeout) {
                Ok(()) => {
                    let m = &mut st.nodes[n].metrics;
                    m.wait_ns += waiting_since.elapsed().as_nanos() as u64;
                }
                Err(e) => {
                    self.down(st, n, &format!("layer {}: {e}", job.layer));
                    st.nodes[n].metrics.failovers += 1;
                    let share = std::mem::take(&mut st.nodes[n].assigned);
                    let r = compute_here(&*self.local, job, &share, st, deliver);
                    st.nodes[n].assigned = share;
                    r?;
                }
            }
            st.nodes[n].pending = None;
        }
        Ok(())
    }

    fn wants_hints(&self, layer: usize) -> bool {
        self.local.wants_hints(layer)
    }

    /// Passes on only the experts the backbone will compute itself: reading ahead what a node computes
    /// would spend the backbone's disk and memory on records it never uses (measured on the 16 GiB
    /// Qwen3-30B-A3B synth with 3 shard workers: decode 2.66–5.51 tok/s with such reads, 7.60–7.87 without).
    fn hint(&self, layer: usize, ids: &[u32]) -> Result<(), EngineError> {
        let mine = {
            let mut st = self.lock();
            let mut mine = std::mem::take(&mut st.hinted);
            mine.clear();
            mine.extend(ids.iter().filter(|&&e| self.live_owner(&st, layer, e).is_none()));
            mine
        };
        let r = if mine.is_empty() {
            Ok(())
        } else {
            self.local.hint(layer, &mine)
        };
        self.lock().hinted = mine;
        r
    }

    fn samples(&self, out: &mut Vec<Sample>) {
        self.local.samples(out);
        type Series = (&'static str, &'static str, fn(&NodeMetrics) -> f64);
        let series: [Series; 6] = [
            ("node_exchanges_total", "Layer exchanges with the node.", |m| {
                m.round_trips as f64
            }),
            (
                "node_exchange_seconds_total",
                "From sending a layer's request to the node to having its answer.",
                |m| m.exchange_ns as f64 / 1e9,
            ),
            (
                "node_wait_seconds_total",
                "Of the exchange time, what the backbone waited after its own share.",
                |m| m.wait_ns as f64 / 1e9,
            ),
            ("node_sent_bytes_total", "Bytes sent to the node.", |m| {
                m.bytes_out as f64
            }),
            ("node_received_bytes_total", "Bytes received from the node.", |m| {
                m.bytes_in as f64
            }),
            (
                "node_failovers_total",
                "Layers whose experts were computed elsewhere because the node failed them.",
                |m| m.failovers as f64,
            ),
        ];
        let nodes = self.metrics();
        for (name, help, value) in series {
            for (node, m) in &nodes {
                out.push(Sample::counter(name, help, value(m)).labelled("node", node.clone()));
            }
        }
    }

    fn summary(&self) -> Option<String> {
        let mut out = self.local.summary().unwrap_or_default();
        out += "cluster (per node: layer exchanges, experts and rows computed, bytes, ms per exchange against an \
                empty round trip, failovers):\n";
        for ((name, m), node) in self.metrics().into_iter().zip(self.node_metrics()) {
            let per = m.exchange_ns as f64 / 1e6 / m.round_trips.max(1) as f64;
            let (ping, wait) = (
                m.ping_ns as f64 / 1e6,
                m.wait_ns as f64 / 1e6 / m.round_trips.max(1) as f64,
            );
            out += &format!(
                "  {name}: {} round trips, {} experts, {} rows, {} B out, {} B in, {per:.3} ms per exchange \
                 (ping {ping:.3} ms, waited {wait:.3} ms), {} failovers\n",
                m.round_trips, m.experts, m.rows, m.bytes_out, m.bytes_in, m.failovers
            );
            let seen = node.map_or("down".to_string(), |j| {
                let ms = j["compute_ns"].as_u64().unwrap_or(0) as f64 / 1e6;
                format!(
                    "{} requests, {} experts, {} rows, {ms:.1} ms computing, {} connections",
                    j["requests"], j["experts"], j["rows"], j["connections"]
                )
            });
            out += &format!("    as the node counts it, since it started: {seen}\n");
        }
        Some(out)
    }
}

/// Sends node `n` the rows and ids of its assigned experts.
fn send(st: &mut State, n: usize, id: u64, job: &ExpertJob) -> std::io::Result<()> {
    let State {
        nodes,
        body,
        frame,
        row_map,
        ..
    } = st;
    let node = &mut nodes[n];
    // The union of the node's rows, in first-use order, and each expert's rows as indices into it.
    row_map.clear();
    row_map.resize(job.input.rows(), usize::MAX);
    node.rows.clear();
    node.local_rows.clear();
    for &i in &node.assigned {
        for &r in job.rows_of(i) {
            if row_map[r] == usize::MAX {
                row_map[r] = node.rows.len();
                node.rows.push(r);
            }
            node.local_rows.push(row_map[r] as u32);
        }
    }
    let mut at = 0;
    let experts = node.assigned.iter().map(|&i| {
        let n = job.rows_of(i).len();
        at += n;
        (job.ids[i], &node.local_rows[at - n..at])
    });
    encode_compute(body, job.layer, job.input, &node.rows, experts);
    let conn = node.conn.as_mut().expect("only live nodes are assigned work");
    let t = Instant::now();
    write_frame(&mut conn.w, Kind::Compute, id, body, frame)?;
    conn.w.flush()?;
    node.pending = Some((id, t));
    let m = &mut node.metrics;
    m.round_trips += 1;
    m.experts += node.assigned.len() as u64;
    m.rows += node.local_rows.len() as u64;
    m.bytes_out += (body.len() + HEADER_LEN) as u64;
    Ok(())
}

/// Reads node `n`'s answer to this layer (due within `timeout`) and delivers each expert's rows.
fn receive(
    st: &mut State,
    n: usize,
    job: &ExpertJob,
    deliver: &mut dyn FnMut(usize, &[f32]),
    timeout: Duration,
) -> Result<(), ExchangeError> {
    let State {
        nodes, body, floats, ..
    } = st;
    let node = &mut nodes[n];
    let (id, sent) = node.pending.expect("only nodes with a request in flight are read");
    let conn = node
        .conn
        .as_mut()
        .expect("a node with a request in flight is connected");
    let h = read_frame(&mut conn.r, DEFAULT_MAX_FRAME, body).map_err(|e| {
        if e.is_timeout() {
            ExchangeError::Timeout(timeout)
        } else {
            e.into()
        }
    })?;
    if h.id != id {
        return Err(ExchangeError::WrongRequest { got: h.id, pending: id });
    }
    match h.kind {
        Kind::Output => {}
        Kind::Error => return Err(ExchangeError::NodeFailed(String::from_utf8_lossy(body).into_owned())),
        kind => {
            return Err(ExchangeError::WrongAnswer {
                to: "a layer's request",
                kind,
            })
        }
    }
    let d = job.input.cols();
    decode_output(body, node.assigned.iter().map(|&i| job.rows_of(i).len()), d, floats)?;
    let mut at = 0;
    for &i in &node.assigned {
        let len = job.rows_of(i).len() * d;
        deliver(i, &floats[at..at + len]);
        at += len;
    }
    let m = &mut node.metrics;
    m.bytes_in += (body.len() + HEADER_LEN) as u64;
    m.exchange_ns += sent.elapsed().as_nanos() as u64;
    tracing::trace!(experts = node.assigned.len(), bytes = body.len(), "answered");
    Ok(())
}

/// Computes experts `which` (indices into the job's ids, ascending) with the backbone's own source.
fn compute_here(
    local: &dyn Experts,
    job: &ExpertJob,
    which: &[usize],
    st: &mut State,
    deliver: &mut dyn FnMut(usize, &[f32]),
) -> Result<(), EngineError> {
    if which.is_empty() {
        return Ok(());
    }
    let State {
        sub_ids,
        sub_rows,
        sub_starts,
        ..
    } = st;
    sub_ids.clear();
    sub_rows.clear();
    sub_starts.clear();
    sub_starts.push(0);
    for &i in which {
        sub_ids.push(job.ids[i]);
        sub_rows.extend_from_slice(job.rows_of(i));
        sub_starts.push(sub_rows.len());
    }
    let sub = ExpertJob {
        layer: job.layer,
        input: job.input,
        ids: sub_ids,
        rows: sub_rows,
        starts: sub_starts,
    };
    local.apply(&sub, &mut || Ok(()), &mut |j, y| deliver(which[j], y))
}
