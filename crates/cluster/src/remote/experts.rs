//! The experts of each MoE layer: one request to each node that holds some of the chosen experts, the
//! backbone's own share computed meanwhile, and every output handed to the engine's combine.

use std::io::Write;
use std::time::{Duration, Instant};

use titan_engine::experts::{ExpertJob, Experts};
use titan_engine::samples::Sample;
use titan_engine::EngineError;
use titan_kernels::GgmlType;
use titan_net::{Deadline, FrameError, Kind, DEFAULT_MAX_FRAME, HEADER_LEN};
use tracing::Span;

use super::{Cluster, NodeMetrics, State};
use crate::proto::{decode_output, encode_compute};
use crate::ExchangeError;

impl Cluster {
    /// Recomputes a random sample (`--audit`'s rate) of the experts node `n` just answered — each picked
    /// expert with all its rows, so that the audit costs that share of the node's work (one pass over the
    /// expert's weights whatever its rows) — from the answer still in `st.floats`, and compares the bits: by
    /// the determinism contract they are equal on every machine, so one that differs proves the node faulty
    /// or lying.
    fn audit(&self, st: &mut State, n: usize, job: &ExpertJob) -> Result<(), ExchangeError> {
        if self.opts.audit <= 0.0 {
            return Ok(());
        }
        let State {
            nodes,
            audit,
            rng,
            sub_ids,
            sub_rows,
            sub_starts,
            ..
        } = st;
        // The picked experts, as a job of their own; `audit` holds each one's offset in the answer.
        audit.clear();
        sub_ids.clear();
        sub_rows.clear();
        sub_starts.clear();
        sub_starts.push(0);
        let d = job.input.cols();
        let mut at = 0;
        for &i in &nodes[n].assigned {
            let rows = job.rows_of(i);
            if rng.next_f32() < self.opts.audit as f32 {
                sub_ids.push(job.ids[i]);
                sub_rows.extend_from_slice(rows);
                sub_starts.push(sub_rows.len());
                audit.push((i, at));
            }
            at += rows.len() * d;
        }
        if audit.is_empty() {
            return Ok(());
        }
        nodes[n].metrics.audited += sub_rows.len() as u64;
        let sub = ExpertJob {
            layer: job.layer,
            input: job.input,
            ids: sub_ids,
            rows: sub_rows,
            starts: sub_starts,
        };
        let (picked, answers) = (&*audit, &st.floats);
        let mut differs = None;
        let r = self.local.apply(&sub, &mut || Ok(()), &mut |k, y| {
            let (i, from) = picked[k];
            let same = y
                .iter()
                .zip(&answers[from..from + y.len()])
                .all(|(a, b)| a.to_bits() == b.to_bits());
            if !same && differs.is_none() {
                differs = Some(job.ids[i]);
            }
        });
        r.map_err(|e| ExchangeError::NodeFailed(format!("the audit could not recompute: {e}")))?;
        match differs {
            Some(expert) => {
                st.nodes[n].metrics.audit_failures += 1;
                Err(ExchangeError::AuditFailed {
                    layer: job.layer,
                    expert,
                })
            }
            None => Ok(()),
        }
    }
}

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

        // The caller's own work (the shared expert) and the backbone's share, while the nodes work. If it
        // fails, the answers on their way are read and dropped first: left in the sockets, the next layer
        // would read them as its own.
        let local = std::mem::take(&mut st.local);
        let r = meanwhile().and_then(|()| compute_here(&*self.local, job, &local, st, deliver));
        st.local = local;
        if r.is_err() {
            self.drain(st);
        }
        r?;
        let waiting_since = Instant::now();

        // The answers, in node order; a node that fails has its share computed here.
        for n in 0..st.nodes.len() {
            let span = std::mem::replace(&mut st.nodes[n].span, Span::none());
            if st.nodes[n].pending.is_none() {
                continue;
            }
            let _entered = span.enter();
            // Checked whole — read, finite, audited — before any of it is delivered.
            let answered = receive(st, n, job, self.opts.timeout).and_then(|()| self.audit(st, n, job));
            match answered {
                Ok(()) => {
                    deliver_answer(st, n, job, deliver);
                    let m = &mut st.nodes[n].metrics;
                    m.wait_ns += waiting_since.elapsed().as_nanos() as u64;
                }
                Err(e) => {
                    self.failed(st, n, &e, &format!("layer {}", job.layer));
                    st.nodes[n].metrics.failovers += 1;
                    let share = std::mem::take(&mut st.nodes[n].assigned);
                    let r = compute_here(&*self.local, job, &share, st, deliver);
                    st.nodes[n].assigned = share;
                    if r.is_err() {
                        self.drain(st);
                    }
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
        let series: [Series; 9] = [
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
            (
                "node_rejected_answers_total",
                "Answers refused because they held a NaN or an infinity.",
                |m| m.rejected as f64,
            ),
            (
                "node_audits_total",
                "Outputs of the node the backbone recomputed to check its bits.",
                |m| m.audited as f64,
            ),
            (
                "node_audit_failures_total",
                "Audits whose bits differed: each proves the node faulty or lying.",
                |m| m.audit_failures as f64,
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
            if m.rejected + m.audited > 0 {
                out += &format!(
                    "    answers refused as not finite: {}; outputs audited: {}, of which differed: {}\n",
                    m.rejected, m.audited, m.audit_failures
                );
            }
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
    conn.session.write(&mut conn.w, Kind::Compute, id, body, frame)?;
    conn.w.flush()?;
    node.pending = Some((id, t));
    let m = &mut node.metrics;
    m.round_trips += 1;
    m.experts += node.assigned.len() as u64;
    m.rows += node.local_rows.len() as u64;
    m.bytes_out += (body.len() + HEADER_LEN) as u64;
    Ok(())
}

/// Reads node `n`'s answer to this layer (due within `timeout`) into `st.floats`, and checks that it is finite.
fn receive(st: &mut State, n: usize, job: &ExpertJob, timeout: Duration) -> Result<(), ExchangeError> {
    let State {
        nodes, body, floats, ..
    } = st;
    let node = &mut nodes[n];
    let (id, sent) = node.pending.expect("only nodes with a request in flight are read");
    let conn = node
        .conn
        .as_mut()
        .expect("a node with a request in flight is connected");
    let h = conn
        .session
        .read(&mut conn.r, DEFAULT_MAX_FRAME, body, Deadline::By(sent + timeout))
        .map_err(|e| {
            if e.is_timeout() || matches!(e, FrameError::Late(_)) {
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
    // Kernels make no NaN, no infinity from finite weights and inputs: such an answer is a fault or a lie.
    if let Some(at) = floats.iter().position(|v| !v.is_finite()) {
        node.metrics.rejected += 1;
        return Err(ExchangeError::NonFinite(floats[at]));
    }
    let m = &mut node.metrics;
    m.bytes_in += (body.len() + HEADER_LEN) as u64;
    m.exchange_ns += sent.elapsed().as_nanos() as u64;
    tracing::trace!(experts = node.assigned.len(), bytes = body.len(), "answered");
    Ok(())
}

/// Hands node `n`'s answer, read and checked into `st.floats`, to the engine, expert by expert.
fn deliver_answer(st: &State, n: usize, job: &ExpertJob, deliver: &mut dyn FnMut(usize, &[f32])) {
    let d = job.input.cols();
    let mut at = 0;
    for &i in &st.nodes[n].assigned {
        let len = job.rows_of(i).len() * d;
        deliver(i, &st.floats[at..at + len]);
        at += len;
    }
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
