//! Dense products split by output rows (the projections of each layer, the LM head): each product's rows
//! are cut into contiguous shares, one for the backbone and one for each live node that holds the whole
//! model, in proportion to their weights. Every node gets one request for all the products of the call;
//! the backbone computes its own share meanwhile; a node that fails has its share computed here. An
//! output element is one weight row times one input row wherever it is computed, so the bits are the
//! single machine's for any split.

use std::io::Write;
use std::time::Instant;

use titan_engine::rows::{row_range, RowJob, Rows};
use titan_engine::scratch::recycle;
use titan_engine::weights::Weights;
use titan_engine::EngineError;
use titan_kernels::Activations;
use titan_net::{Deadline, FrameError, Kind, DEFAULT_MAX_FRAME, HEADER_LEN};

use super::{Cluster, State};
use crate::proto::{decode_rows_output, encode_rows, RowsJob};
use crate::ExchangeError;

impl Rows for Cluster {
    fn matmul_many(&self, weights: &Weights, jobs: &mut [RowJob]) -> Result<(), EngineError> {
        let mut guard = self.lock();
        let st = &mut *guard;
        self.revive(st);
        // The participants: the backbone (0), then each live node that takes rows.
        let takers = st.nodes.iter().filter(|n| n.conn.is_some() && n.takes_rows).count();
        if takers == 0 {
            drop(guard);
            return self.local_rows.matmul_many(weights, jobs);
        }
        cut(st, jobs);
        let parts = takers + 1;

        // One request to each participating node, every product's share in it, all sent first.
        let mut p = 0;
        for n in 0..st.nodes.len() {
            if !(st.nodes[n].conn.is_some() && st.nodes[n].takes_rows) {
                continue;
            }
            p += 1;
            let id = st.next_id;
            st.next_id += 1;
            if let Err(e) = send(st, n, p, parts, id, jobs) {
                self.down(st, n, &format!("sending a dense product: {e}"));
            }
        }

        // The backbone's own share while the nodes compute theirs; if it fails, the answers on their way are
        // read and dropped first, or the next call would read them as its own.
        if let Err(e) = compute_here(&self.local_rows, weights, st, 0, parts, jobs) {
            self.drain(st);
            return Err(e);
        }

        // The answers, in node order; a node that failed, sending or answering, has its share computed here.
        let mut p = 0;
        for n in 0..st.nodes.len() {
            if !st.row_takers[n] {
                continue;
            }
            p += 1;
            let result = match st.nodes[n].pending.take() {
                Some(pending) => receive(st, n, pending, p, parts, jobs, self.opts.timeout)
                    .and_then(|()| self.audit_rows(weights, st, n, p, parts, jobs))
                    .map_err(Some),
                None => Err(None),
            };
            if let Err(e) = result {
                if let Some(e) = e {
                    self.failed(st, n, &e, "a dense product");
                }
                st.nodes[n].metrics.failovers += 1;
                if let Err(e) = compute_here(&self.local_rows, weights, st, p, parts, jobs) {
                    self.drain(st);
                    return Err(e);
                }
            }
        }
        Ok(())
    }
}

impl Cluster {
    /// Recomputes node `n`'s (participant `p`'s) share of a random sample of the jobs (`--audit`'s rate),
    /// and compares its bits with what the node answered, already in place in the jobs' outputs.
    fn audit_rows(
        &self,
        weights: &Weights,
        st: &mut State,
        n: usize,
        p: usize,
        parts: usize,
        jobs: &[RowJob],
    ) -> Result<(), ExchangeError> {
        if self.opts.audit <= 0.0 {
            return Ok(());
        }
        for (j, job) in jobs.iter().enumerate() {
            let (a, b) = share(st, parts, j, p);
            if a == b || st.rng.next_f32() >= self.opts.audit as f32 {
                continue;
            }
            st.nodes[n].metrics.audited += 1;
            let rows = job.input.rows();
            let mut here = vec![0f32; rows * (b - a)];
            let mut one = [RowJob {
                w: row_range(&job.w, a..b),
                input: job.input,
                out: &mut here,
            }];
            self.local_rows
                .matmul_many(weights, &mut one)
                .map_err(|e| ExchangeError::NodeFailed(format!("the audit could not recompute: {e}")))?;
            let width = b - a;
            let same = (0..rows).all(|i| {
                let theirs = &job.out[i * job.w.rows + a..i * job.w.rows + b];
                let ours = &here[i * width..(i + 1) * width];
                theirs.iter().zip(ours).all(|(x, y)| x.to_bits() == y.to_bits())
            });
            if !same {
                st.nodes[n].metrics.audit_failures += 1;
                return Err(ExchangeError::RowsAuditFailed {
                    start: job.w.start as u64 + (a * job.w.row_bytes()) as u64,
                });
            }
        }
        Ok(())
    }
}

/// Cuts every job's rows into `parts` contiguous shares, the backbone's first, in proportion to the
/// participants' weights, into `st.row_cuts` (`parts + 1` cuts per job); notes each job's input among the
/// call's distinct inputs, and which nodes take part.
fn cut(st: &mut State, jobs: &[RowJob]) {
    let State {
        nodes,
        row_cuts,
        row_inputs,
        row_takers,
        ..
    } = st;
    row_takers.clear();
    row_takers.extend(nodes.iter().map(|n| n.conn.is_some() && n.takes_rows));
    let total: f64 = 1.0
        + nodes
            .iter()
            .zip(row_takers.iter())
            .filter(|(_, &t)| t)
            .map(|(n, _)| n.row_weight)
            .sum::<f64>();
    row_cuts.clear();
    row_inputs.clear();
    for (j, job) in jobs.iter().enumerate() {
        let rows = job.w.rows;
        let mut at = 0.0;
        row_cuts.push(0);
        let weights = std::iter::once(1.0).chain(
            nodes
                .iter()
                .zip(row_takers.iter())
                .filter(|(_, &t)| t)
                .map(|(n, _)| n.row_weight),
        );
        for w in weights {
            at += w;
            row_cuts.push(((rows as f64 * at / total).round() as usize).min(rows));
        }
        let last = row_cuts.len() - 1;
        row_cuts[last] = rows;
        let same = jobs[..j].iter().position(|o| std::ptr::eq(o.input, job.input));
        row_inputs.push(same.map_or(j, |o| row_inputs[o]));
    }
}

/// Rows `[cuts[p], cuts[p + 1])` of job `j`.
fn share(st: &State, parts: usize, j: usize, p: usize) -> (usize, usize) {
    let at = j * (parts + 1) + p;
    (st.row_cuts[at], st.row_cuts[at + 1])
}

/// Sends node `n` (participant `p`) its share of every job.
fn send(st: &mut State, n: usize, p: usize, parts: usize, id: u64, jobs: &[RowJob]) -> std::io::Result<()> {
    st.row_jobs.clear();
    for (j, job) in jobs.iter().enumerate() {
        let (a, b) = share(st, parts, j, p);
        if a < b {
            let m = row_range(&job.w, a..b);
            st.row_jobs.push(RowsJob {
                start: m.start as u64,
                ty: m.ty,
                rows: m.rows,
                cols: m.cols,
                input: st.row_inputs[j],
            });
        }
    }
    let State {
        nodes,
        body,
        frame,
        row_jobs,
        row_inputs,
        ..
    } = st;
    // The distinct inputs, in the order the jobs first name them (a job's input index is its first
    // user's job index, renumbered here to the position among the distinct ones).
    let distinct = |j: &usize| row_inputs[*j] == *j;
    let firsts: Vec<usize> = (0..jobs.len()).filter(distinct).collect();
    for rj in row_jobs.iter_mut() {
        rj.input = firsts
            .iter()
            .position(|&f| f == rj.input)
            .expect("a job's input is a first");
    }
    let inputs: Vec<&Activations> = firsts.iter().map(|&f| jobs[f].input).collect();
    encode_rows(body, &inputs, row_jobs.iter());
    let node = &mut nodes[n];
    let conn = node.conn.as_mut().expect("only live nodes take a share");
    let t = Instant::now();
    conn.session.write(&mut conn.w, Kind::Rows, id, body, frame)?;
    conn.w.flush()?;
    node.pending = Some((id, t));
    let m = &mut node.metrics;
    m.round_trips += 1;
    m.bytes_out += (body.len() + HEADER_LEN) as u64;
    Ok(())
}

/// Reads node `n`'s (participant `p`'s) answer to request `id` and puts each product in its place; the
/// reason when it fails.
fn receive(
    st: &mut State,
    n: usize,
    (id, sent): (u64, Instant),
    p: usize,
    parts: usize,
    jobs: &mut [RowJob],
    timeout: std::time::Duration,
) -> Result<(), ExchangeError> {
    let len: usize = (0..jobs.len())
        .map(|j| {
            let (a, b) = share(st, parts, j, p);
            jobs[j].input.rows() * (b - a)
        })
        .sum();
    {
        let State {
            nodes, body, floats, ..
        } = &mut *st;
        let conn = nodes[n]
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
            Kind::RowsOutput => {}
            Kind::Error => return Err(ExchangeError::NodeFailed(String::from_utf8_lossy(body).into_owned())),
            kind => {
                return Err(ExchangeError::WrongAnswer {
                    to: "a dense product",
                    kind,
                })
            }
        }
        decode_rows_output(body, len, floats)?;
        if let Some(at) = floats.iter().position(|v| !v.is_finite()) {
            nodes[n].metrics.rejected += 1;
            return Err(ExchangeError::NonFinite(floats[at]));
        }
        let m = &mut nodes[n].metrics;
        m.bytes_in += (body.len() + HEADER_LEN) as u64;
        m.exchange_ns += sent.elapsed().as_nanos() as u64;
    }
    let floats = std::mem::take(&mut st.floats);
    scatter(st, p, parts, jobs, &floats);
    st.floats = floats;
    Ok(())
}

/// Computes participant `p`'s share of every job here (the backbone's own, or a failed node's).
fn compute_here(
    local: &dyn Rows,
    weights: &Weights,
    st: &mut State,
    p: usize,
    parts: usize,
    jobs: &mut [RowJob],
) -> Result<(), EngineError> {
    let len: usize = (0..jobs.len())
        .map(|j| {
            let (a, b) = share(st, parts, j, p);
            jobs[j].input.rows() * (b - a)
        })
        .sum();
    let mut out = std::mem::take(&mut st.row_out);
    out.clear();
    out.resize(len, 0.0);
    let mut list: Vec<RowJob> = recycle(std::mem::take(&mut st.row_list));
    let mut rest = &mut out[..];
    for (j, job) in jobs.iter().enumerate() {
        let (a, b) = share(st, parts, j, p);
        let (here, tail) = std::mem::take(&mut rest).split_at_mut(job.input.rows() * (b - a));
        rest = tail;
        if a < b {
            list.push(RowJob {
                w: row_range(&job.w, a..b),
                input: job.input,
                out: here,
            });
        }
    }
    let r = local.matmul_many(weights, &mut list);
    st.row_list = recycle(list);
    if r.is_ok() {
        scatter(st, p, parts, jobs, &out);
    }
    st.row_out = out;
    r
}

/// Puts participant `p`'s products, `from` (job after job, each input row's share of weight rows after
/// the other), in their places in the jobs' outputs.
fn scatter(st: &State, p: usize, parts: usize, jobs: &mut [RowJob], from: &[f32]) {
    let mut at = 0;
    for (j, job) in jobs.iter_mut().enumerate() {
        let (a, b) = share(st, parts, j, p);
        let (rows, width) = (job.w.rows, b - a);
        for i in 0..job.input.rows() {
            job.out[i * rows + a..i * rows + b].copy_from_slice(&from[at..at + width]);
            at += width;
        }
    }
}
