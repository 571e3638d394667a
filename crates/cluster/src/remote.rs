//! The backbone's side: [`Cluster`] is an [`Experts`] source that sends each MoE layer's experts to the
//! nodes holding them, computes the rest (and any node's share, when that node fails) with the
//! backbone's own source, and hands every output to the engine's combine.

use std::io::{BufReader, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use titan_engine::experts::{ExpertJob, Experts};
use titan_engine::samples::Sample;
use titan_engine::EngineError;
use titan_kernels::GgmlType;
use titan_net::{read_frame, write_frame, Kind, DEFAULT_MAX_FRAME, HEADER_LEN};
use tracing::Span;

use crate::plan::{Placement, Plan};
use crate::proto::{decode_output, encode_compute, Hello, Welcome};
use crate::slice::SliceSpec;
use crate::{ClusterError, ExchangeError};

#[derive(Clone)]
pub struct ClusterOptions {
    /// HOST:PORT of each node.
    pub nodes: Vec<String>,
    pub token: Vec<u8>,
    pub placement: Placement,
    /// Copies of each expert across nodes (1: no replication).
    pub replicas: usize,
    /// How long a node may take to answer one layer before it is marked down.
    pub timeout: Duration,
    /// The model identity the nodes must hold (`model_identity`).
    pub model: String,
    /// (layer, expert)s to give a second node (the hottest of a routing profile).
    pub hot: Vec<(usize, usize)>,
}

/// A down node is dialled again this often, off the generation's path; a node that answers is used again
/// from the next step.
const RETRY_EVERY: Duration = Duration::from_secs(1);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

pub struct Cluster {
    local: Box<dyn Experts>,
    plan: Plan,
    /// How the plan was made, for the user.
    plan_kind: String,
    names: Vec<String>,
    opts: Arc<ClusterOptions>,
    state: Mutex<State>,
    redial: Arc<Redial>,
    /// The slice endpoint nodes fetch their shards from, kept serving while the cluster runs.
    slices: Option<crate::slice_http::SliceServer>,
}

/// Down nodes being dialled again, on threads of their own (a hung node must not stall the generation).
struct Redial {
    /// A node's new connection, once it answered, until the next step takes it.
    revived: Mutex<Vec<Option<Conn>>>,
    /// Whether a thread is dialling the node.
    dialing: Vec<AtomicBool>,
    /// Set when the cluster is dropped: the threads stop.
    closing: AtomicBool,
}

/// One node's connection and counters.
struct Node {
    conn: Option<Conn>,
    metrics: NodeMetrics,
    /// This layer's experts for the node: indices into the job's ids.
    assigned: Vec<usize>,
    /// This layer's rows for the node (indices into the job's input) and each expert's rows among them.
    rows: Vec<usize>,
    local_rows: Vec<u32>,
    /// The id of the request awaiting its answer, and when it was sent.
    pending: Option<(u64, Instant)>,
    /// This layer's exchange with the node (layer, node), a debug-level span: `Span::none()`, which costs
    /// nothing, unless debug logging is on.
    span: Span,
}

struct Conn {
    w: TcpStream,
    r: BufReader<TcpStream>,
}

/// Counters of one node as the backbone saw it.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct NodeMetrics {
    pub round_trips: u64,
    pub experts: u64,
    pub rows: u64,
    pub bytes_out: u64,
    pub bytes_in: u64,
    /// From sending a layer's request to having its answer.
    pub exchange_ns: u64,
    /// Of that, the time the backbone waited after finishing its own work.
    pub wait_ns: u64,
    /// Layers whose experts the backbone computed because this node failed them.
    pub failovers: u64,
    pub downs: u64,
    /// The median of a few empty round trips at connection (the network's and the node's floor).
    pub ping_ns: u64,
}

struct State {
    nodes: Vec<Node>,
    next_id: u64,
    /// Indices (into the job's ids) the backbone computes this layer.
    local: Vec<usize>,
    /// A sub-job's ids, rows and starts.
    sub_ids: Vec<u32>,
    sub_rows: Vec<usize>,
    sub_starts: Vec<usize>,
    body: Vec<u8>,
    frame: Vec<u8>,
    floats: Vec<f32>,
    /// Where each job row goes in a node's row list (usize::MAX: not sent).
    row_map: Vec<usize>,
    /// The experts of a read-ahead hint the backbone computes itself.
    hinted: Vec<u32>,
}

impl Cluster {
    /// Connects to every node (each must be up, hold the same model and accept the token), plans the
    /// placement from their budgets, and returns the source; `local` computes what no live node does.
    /// Layers 0..dense have no experts.
    pub fn connect(
        local: Box<dyn Experts>,
        n_layer: usize,
        dense: usize,
        n_expert: usize,
        opts: ClusterOptions,
    ) -> Result<Cluster, ClusterError> {
        let mut nodes = Vec::new();
        let mut budgets = Vec::new();
        let mut holdings = Vec::new();
        for addr in &opts.nodes {
            let (mut conn, welcome) = handshake(addr, &opts).map_err(|error| ClusterError::Node {
                addr: addr.clone(),
                error,
            })?;
            if (welcome.n_layer, welcome.n_expert) != (n_layer, n_expert) {
                return Err(ClusterError::NodeShape {
                    addr: addr.clone(),
                    node_layers: welcome.n_layer,
                    node_experts: welcome.n_expert,
                    n_layer,
                    n_expert,
                });
            }
            budgets.push(welcome.budget);
            holdings.push(welcome.holds.map(|h| {
                h.into_iter()
                    .map(|((l0, l1), (e0, e1))| SliceSpec {
                        layers: l0..=l1,
                        experts: e0..=e1,
                    })
                    .collect()
            }));
            let ping_ns = ping(&mut conn, 21).map_err(|error| ClusterError::Ping {
                addr: addr.clone(),
                error,
            })?;
            nodes.push(Node {
                conn: Some(conn),
                metrics: NodeMetrics {
                    ping_ns,
                    ..Default::default()
                },
                assigned: Vec::new(),
                rows: Vec::new(),
                local_rows: Vec::new(),
                pending: None,
                span: Span::none(),
            });
        }
        let (plan, plan_kind) = if holdings.iter().any(Option::is_some) {
            // Shards decide: each node computes what it holds.
            (
                Plan::from_holdings(n_layer, dense, n_expert, &holdings),
                "each node serves the experts of its shard".to_string(),
            )
        } else {
            let copies = if opts.replicas == 1 {
                "1 copy".into()
            } else {
                format!("{} copies", opts.replicas)
            };
            let mut plan = Plan::new(n_layer, dense, n_expert, &budgets, opts.placement, opts.replicas)?;
            plan.replicate(&opts.hot, budgets.len());
            let hot = if opts.hot.is_empty() {
                String::new()
            } else {
                format!(", {} hot layer-experts on a second node", opts.hot.len())
            };
            (
                plan,
                format!("{:?} placement, {copies} of each expert{hot}", opts.placement).to_lowercase(),
            )
        };
        let state = State {
            nodes,
            next_id: 1,
            local: Vec::new(),
            sub_ids: Vec::new(),
            sub_rows: Vec::new(),
            sub_starts: Vec::new(),
            body: Vec::new(),
            frame: Vec::new(),
            floats: Vec::new(),
            row_map: Vec::new(),
            hinted: Vec::new(),
        };
        let redial = Arc::new(Redial {
            revived: Mutex::new((0..opts.nodes.len()).map(|_| None).collect()),
            dialing: (0..opts.nodes.len()).map(|_| AtomicBool::new(false)).collect(),
            closing: AtomicBool::new(false),
        });
        Ok(Cluster {
            local,
            plan,
            plan_kind,
            names: opts.nodes.clone(),
            opts: Arc::new(opts),
            state: Mutex::new(state),
            redial,
            slices: None,
        })
    }

    /// Keeps `server` running for as long as the cluster.
    pub fn keep_serving_slices(&mut self, server: crate::slice_http::SliceServer) {
        self.slices = Some(server);
    }

    /// The plan: how it was made, then one line per node.
    pub fn describe(&self) -> String {
        format!(
            "cluster plan ({}):\n{}",
            self.plan_kind,
            self.plan.describe(&self.names)
        )
    }

    /// Each node's counters, in `--nodes` order.
    pub fn metrics(&self) -> Vec<(String, NodeMetrics)> {
        let st = self.lock();
        self.names
            .iter()
            .cloned()
            .zip(st.nodes.iter().map(|n| n.metrics.clone()))
            .collect()
    }

    /// Each live node's own counters (`WorkerMetrics`, over every backbone it serves), asked for now.
    pub fn node_metrics(&self) -> Vec<Option<serde_json::Value>> {
        let mut st = self.lock();
        let State {
            nodes,
            next_id,
            body,
            frame,
            ..
        } = &mut *st;
        nodes
            .iter_mut()
            .map(|n| {
                let conn = n.conn.as_mut()?;
                *next_id += 1;
                write_frame(&mut conn.w, Kind::MetricsRequest, *next_id, &[], frame).ok()?;
                let h = read_frame(&mut conn.r, 1 << 20, body).ok()?;
                (h.kind == Kind::Metrics && h.id == *next_id)
                    .then(|| serde_json::from_slice(body).ok())
                    .flatten()
            })
            .collect()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves only counters and buffers behind; keep going.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Connects to `addr`, says hello with the token and the model, and reads the node's welcome.
fn handshake(addr: &str, opts: &ClusterOptions) -> Result<(Conn, Welcome), ExchangeError> {
    let sock = addr
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| ExchangeError::Unresolved(addr.to_string()))?;
    let stream = TcpStream::connect_timeout(&sock, CONNECT_TIMEOUT)?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(opts.timeout.max(CONNECT_TIMEOUT)))?;
    let mut conn = Conn {
        w: stream.try_clone()?,
        r: BufReader::with_capacity(1 << 16, stream),
    };
    let hello = Hello {
        token: String::from_utf8_lossy(&opts.token).into_owned(),
        model: opts.model.clone(),
    };
    let hello = serde_json::to_vec(&hello).map_err(|error| ExchangeError::Json {
        what: "writing the hello",
        error,
    })?;
    write_frame(&mut conn.w, Kind::Hello, 0, &hello, &mut Vec::new())?;
    let mut body = Vec::new();
    let h = read_frame(&mut conn.r, 1 << 16, &mut body)?;
    match h.kind {
        Kind::Welcome => {
            let welcome: Welcome = serde_json::from_slice(&body).map_err(|error| ExchangeError::Json {
                what: "reading the node's welcome",
                error,
            })?;
            conn.r.get_ref().set_read_timeout(Some(opts.timeout))?;
            Ok((conn, welcome))
        }
        Kind::Error => Err(ExchangeError::Refused(String::from_utf8_lossy(&body).into_owned())),
        kind => Err(ExchangeError::WrongAnswer { to: "the hello", kind }),
    }
}

/// The median of `n` empty round trips on `conn`, in nanoseconds.
fn ping(conn: &mut Conn, n: usize) -> Result<u64, ExchangeError> {
    let (mut frame, mut body) = (Vec::new(), Vec::new());
    let mut times = Vec::with_capacity(n);
    for i in 0..n as u64 {
        let t = Instant::now();
        write_frame(&mut conn.w, Kind::Ping, i, &[], &mut frame)?;
        let h = read_frame(&mut conn.r, 1 << 16, &mut body)?;
        if h.kind != Kind::Pong {
            return Err(ExchangeError::WrongAnswer {
                to: "a ping",
                kind: h.kind,
            });
        }
        if h.id != i {
            return Err(ExchangeError::WrongRequest { got: h.id, pending: i });
        }
        times.push(t.elapsed().as_nanos() as u64);
    }
    times.sort_unstable();
    Ok(times[n / 2])
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
        if job.layer == 0 {
            self.revive(st);
        }

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

impl Cluster {
    /// The first owner of expert `e` of `layer` that is up, if any.
    fn live_owner(&self, st: &State, layer: usize, e: u32) -> Option<usize> {
        self.plan
            .owners(layer, e as usize)
            .iter()
            .copied()
            .find(|&n| st.nodes[n].conn.is_some())
    }

    /// Marks node `n` down (its connection dropped), says why, and starts dialling it again.
    fn down(&self, st: &mut State, n: usize, why: &str) {
        let node = &mut st.nodes[n];
        if node.conn.take().is_some() {
            node.metrics.downs += 1;
            tracing::warn!(
                "node {n} ({}) is down, its experts are computed elsewhere: {why}",
                self.names[n]
            );
        }
        if self.redial.dialing[n].swap(true, Ordering::SeqCst) {
            return;
        }
        let (redial, opts, addr) = (self.redial.clone(), self.opts.clone(), self.names[n].clone());
        std::thread::spawn(move || loop {
            std::thread::sleep(RETRY_EVERY);
            if redial.closing.load(Ordering::SeqCst) {
                return;
            }
            match handshake(&addr, &opts) {
                Ok((conn, _)) => {
                    redial.revived.lock().unwrap_or_else(|e| e.into_inner())[n] = Some(conn);
                    return;
                }
                Err(e) => tracing::debug!("node {n} ({addr}) is still down: {e}"),
            }
        });
    }

    /// Takes back the down nodes that answered again; they are used from this layer on.
    fn revive(&self, st: &mut State) {
        let mut revived = self.redial.revived.lock().unwrap_or_else(|e| e.into_inner());
        for (n, node) in st.nodes.iter_mut().enumerate() {
            if let Some(conn) = revived[n].take() {
                tracing::info!("node {n} ({}) is back", self.names[n]);
                node.conn = Some(conn);
                self.redial.dialing[n].store(false, Ordering::SeqCst);
            }
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.redial.closing.store(true, Ordering::SeqCst);
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
