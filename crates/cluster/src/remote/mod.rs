//! The backbone's side: [`Cluster`] is an [`Experts`] source that sends each MoE layer's experts to the
//! nodes holding them, computes the rest (and any node's share, when that node fails) with the
//! backbone's own source, and hands every output to the engine's combine ([`experts`]); and a [`Rows`]
//! source that shares each dense product split by output rows between itself and the nodes that hold
//! the whole model ([`rows`]). This module holds the connections, their handshake and their revival.
//!
//! [`Rows`]: titan_engine::rows::Rows

mod experts;
mod rows;

use std::io::BufReader;
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use titan_engine::experts::Experts;
use titan_net::{read_frame_by, write_frame, Deadline, FrameError, Kind, Session, Side};
use tracing::Span;

use crate::auth::{self, Keys};
use crate::plan::{Placement, Plan};
use crate::proto::{json, Challenge, Hello, Proof, Welcome};
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
    /// Whether the backbone computes a share of the experts like a node (it holds them all in memory),
    /// or only those no live node holds (it streams them, or is busy enough with the rest).
    pub backbone_share: bool,
    /// The share of the nodes' expert answers and dense products the backbone recomputes to check their
    /// bits (0: none).
    pub audit: f64,
    /// Encrypt every connection's frames (else they are authenticated only).
    pub encrypt: bool,
}

/// A down node is dialled again this often, off the generation's path; a node that answers is used again
/// from the next step.
const RETRY_EVERY: Duration = Duration::from_secs(1);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

pub struct Cluster {
    local: Box<dyn Experts>,
    /// The backbone's share of dense products, and a failed node's.
    local_rows: titan_engine::rows::LocalRows,
    plan: Plan,
    /// How the plan was made, for the user.
    plan_kind: String,
    names: Vec<String>,
    opts: Arc<ClusterOptions>,
    state: Mutex<State>,
    /// The nodes' counters as of the last time the state's lock was let go: what `/metrics` reads, because
    /// the lock is held across a whole layer's round trips.
    published: Mutex<Vec<NodeMetrics>>,
    redial: Arc<Redial>,
    /// The slice endpoint nodes fetch their shards from, kept serving while the cluster runs.
    slices: Option<crate::slice_http::SliceServer>,
    /// The backbone's measured speed: the unit of the nodes' shares of dense products.
    backbone_speed: f64,
    /// The model's layers and experts per layer, which a node must hold too.
    shape: (usize, usize),
}

/// Down nodes being dialled again, on threads of their own (a hung node must not stall the generation).
struct Redial {
    /// A node's new connection and what it said, once it answered, until the next call takes it.
    revived: Mutex<Vec<Option<(Conn, Welcome)>>>,
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
    /// Whether the node takes shares of dense products (it holds the whole model's weights).
    takes_rows: bool,
    /// Its share of a dense product's rows, relative to the backbone's 1.
    row_weight: f64,
    /// What it announced of its speed (bytes of weights per second; 0: unknown).
    speed: f64,
    /// Proven faulty or lying by an audit: never given work again, never dialled again.
    distrusted: bool,
}

impl Node {
    /// A node not (yet) connected.
    fn down() -> Node {
        Node {
            conn: None,
            metrics: NodeMetrics::default(),
            assigned: Vec::new(),
            rows: Vec::new(),
            local_rows: Vec::new(),
            pending: None,
            span: Span::none(),
            takes_rows: false,
            row_weight: 1.0,
            speed: 0.0,
            distrusted: false,
        }
    }

    /// Takes what the node said of itself at its hello: whether it takes rows, and its speed, relative to
    /// the backbone's `backbone_speed`.
    fn welcomed(&mut self, w: &Welcome, backbone_speed: f64) {
        self.takes_rows = w.rows;
        self.speed = w.speed;
        self.row_weight = if w.speed > 0.0 { w.speed / backbone_speed } else { 1.0 };
    }
}

/// Refuses a node whose model has another shape (its identity matched, so only a node that lies can).
fn check_shape(addr: &str, w: &Welcome, n_layer: usize, n_expert: usize) -> Result<(), ClusterError> {
    if (w.n_layer, w.n_expert) != (n_layer, n_expert) {
        return Err(ClusterError::NodeShape {
            addr: addr.to_string(),
            node_layers: w.n_layer,
            node_experts: w.n_expert,
            n_layer,
            n_expert,
        });
    }
    Ok(())
}

struct Conn {
    w: TcpStream,
    r: BufReader<TcpStream>,
    /// The frames' MACs and sequence numbers, both ways.
    session: Session,
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
    /// Answers refused for a NaN or an infinity.
    pub rejected: u64,
    /// Output rows recomputed by the audit, and the audits whose bits differed.
    pub audited: u64,
    pub audit_failures: u64,
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
    /// A dense product's split: per job, each participant's first row (the backbone's, then each node's in
    /// node order), and the rows' end.
    row_cuts: Vec<usize>,
    /// Per job, the index of its input among the distinct inputs of the call.
    row_inputs: Vec<usize>,
    /// Per node, whether it took a share of the current call.
    row_takers: Vec<bool>,
    /// The products a node (or the backbone) computes, as sent.
    row_jobs: Vec<crate::proto::RowsJob>,
    /// The backbone's own share of a dense product, before it is scattered into place.
    row_out: Vec<f32>,
    /// Always empty: the allocation of the backbone's own share's job list (see `scratch::recycle`).
    row_list: Vec<titan_engine::rows::RowJob<'static>>,
    /// The experts an audit recomputes: (job index, offset of its answer).
    audit: Vec<(usize, usize)>,
    /// What picks them.
    rng: titan_kernels::splitmix::SplitMix64,
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
        let mut speeds = Vec::new();
        let mut holdings = Vec::new();
        let mut late = Vec::new();
        for addr in &opts.nodes {
            let (mut conn, welcome) = match handshake(addr, &opts) {
                Ok(c) => c,
                // A node that is not up yet does not stop the backbone: it starts without it, computes
                // its share meanwhile, and takes it in when it answers.
                Err(error) if error.is_unreachable() => {
                    tracing::warn!(
                        "node {} ({addr}) is not up: its experts are computed here until it is: {error}",
                        nodes.len()
                    );
                    late.push(nodes.len());
                    budgets.push(0);
                    speeds.push(0.0);
                    holdings.push(None);
                    nodes.push(Node::down());
                    continue;
                }
                Err(error) => {
                    return Err(ClusterError::Node {
                        addr: addr.clone(),
                        error,
                    })
                }
            };
            check_shape(addr, &welcome, n_layer, n_expert)?;
            budgets.push(welcome.budget);
            speeds.push(welcome.speed);
            holdings.push(welcome.holds.clone().map(|h| {
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
            let mut node = Node::down();
            node.conn = Some(conn);
            node.metrics.ping_ns = ping_ns;
            node.welcomed(&welcome, 1.0);
            nodes.push(node);
        }
        // A late node is planned as if it had the largest budget announced: a whole-model node, most likely.
        let most = budgets.iter().copied().max().unwrap_or(0).max(1);
        for &n in &late {
            budgets[n] = most;
        }
        // The backbone's own speed, measured as the nodes measure theirs: the unit of every share.
        let backbone_speed = crate::calibrate::weight_throughput(crate::worker::PROBE).max(1.0);
        for node in &mut nodes {
            node.row_weight = node.speed.max(0.0) / backbone_speed;
            if node.speed <= 0.0 {
                node.row_weight = 1.0;
            }
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
            // Each node's weight: its measured speed, scaled down where its budget holds less than the
            // largest (a node streaming its experts serves fewer of them from memory); the backbone planned
            // as one more node that holds them all, its share then taken back from the owner lists.
            let most = budgets.iter().copied().max().unwrap_or(1).max(1) as f64;
            let speed = |s: f64| if s > 0.0 { s } else { backbone_speed };
            let mut planned: Vec<u64> = budgets
                .iter()
                .zip(&speeds)
                .map(|(&b, &s)| (speed(s) / 1e3 * b as f64 / most).round() as u64)
                .collect();
            if opts.backbone_share {
                planned.push((backbone_speed / 1e3).round() as u64);
            }
            let mut plan = Plan::new(n_layer, dense, n_expert, &planned, opts.placement, opts.replicas)?;
            plan.replicate(&opts.hot, planned.len());
            if opts.backbone_share {
                plan.give_to_backbone(budgets.len());
            }
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
            row_cuts: Vec::new(),
            row_inputs: Vec::new(),
            row_takers: Vec::new(),
            row_jobs: Vec::new(),
            row_out: Vec::new(),
            row_list: Vec::new(),
            audit: Vec::new(),
            // Any seed will do, as long as a node cannot know which outputs will be checked.
            rng: titan_kernels::splitmix::SplitMix64(u64::from_le_bytes(
                auth::nonce().map_err(ClusterError::io("seeding the audit"))?[..8]
                    .try_into()
                    .expect("8 bytes"),
            )),
        };
        let redial = Arc::new(Redial {
            revived: Mutex::new((0..opts.nodes.len()).map(|_| None).collect()),
            dialing: (0..opts.nodes.len()).map(|_| AtomicBool::new(false)).collect(),
            closing: AtomicBool::new(false),
        });
        let published = vec![NodeMetrics::default(); opts.nodes.len()];
        let cluster = Cluster {
            local,
            local_rows: Default::default(),
            plan,
            plan_kind,
            names: opts.nodes.clone(),
            opts: Arc::new(opts),
            published: Mutex::new(published),
            state: Mutex::new(state),
            redial,
            slices: None,
            backbone_speed,
            shape: (n_layer, n_expert),
        };
        {
            let mut st = cluster.lock();
            for n in late {
                cluster.down(&mut st, n, "not up at start");
            }
        }
        Ok(cluster)
    }

    /// Keeps `server` running for as long as the cluster.
    pub fn keep_serving_slices(&mut self, server: crate::slice_http::SliceServer) {
        self.slices = Some(server);
    }

    /// The plan: how it was made, one line per node, and how the dense products are shared.
    pub fn describe(&self) -> String {
        let st = self.lock();
        let takers: Vec<String> = st
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.takes_rows)
            .map(|(i, n)| format!("node {i} {:.2}", n.row_weight))
            .collect();
        let rows = if takers.is_empty() {
            "the backbone alone (no node holds the dense weights)".to_string()
        } else {
            format!("backbone 1, {} (by measured speed)", takers.join(", "))
        };
        format!(
            "cluster plan ({}):\n{}  dense products split by rows: {rows}\n",
            self.plan_kind,
            self.plan.describe(&self.names)
        )
    }

    /// Each node's counters, in `--nodes` order, as of the last exchange finished: this never waits for one
    /// under way.
    pub fn metrics(&self) -> Vec<(String, NodeMetrics)> {
        let published = self.published.lock().unwrap_or_else(|e| e.into_inner());
        self.names.iter().cloned().zip(published.iter().cloned()).collect()
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
                conn.session
                    .write(&mut conn.w, Kind::MetricsRequest, *next_id, &[], frame)
                    .ok()?;
                let by = Deadline::By(Instant::now() + CONNECT_TIMEOUT);
                let h = conn.session.read(&mut conn.r, 1 << 20, body, by).ok()?;
                (h.kind == Kind::Metrics && h.id == *next_id)
                    .then(|| serde_json::from_slice(body).ok())
                    .flatten()
            })
            .collect()
    }

    fn lock(&self) -> Locked<'_> {
        Locked {
            // A panic while holding the lock leaves only counters and buffers behind; keep going.
            state: self.state.lock().unwrap_or_else(|e| e.into_inner()),
            published: &self.published,
        }
    }
}

/// The state's lock, which publishes the nodes' counters when it is let go, whichever way the holder left.
struct Locked<'a> {
    state: MutexGuard<'a, State>,
    published: &'a Mutex<Vec<NodeMetrics>>,
}

impl std::ops::Deref for Locked<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        &self.state
    }
}

impl std::ops::DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut State {
        &mut self.state
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        let mut published = self.published.lock().unwrap_or_else(|e| e.into_inner());
        for (p, n) in published.iter_mut().zip(&self.state.nodes) {
            p.clone_from(&n.metrics);
        }
    }
}

/// Connects to `addr` and runs the handshake (`auth`): the hello with the model and a nonce, the node's
/// proof checked before the backbone sends its own, then the node's welcome under the session's MAC. The
/// token never crosses the wire; a node that cannot prove it gets no proof, no rows, nothing.
fn handshake(addr: &str, opts: &ClusterOptions) -> Result<(Conn, Welcome), ExchangeError> {
    let sock = addr
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| ExchangeError::Unresolved(addr.to_string()))?;
    let stream = TcpStream::connect_timeout(&sock, CONNECT_TIMEOUT)?;
    stream.set_nodelay(true)?;
    let (mut w, mut r) = (stream.try_clone()?, BufReader::with_capacity(1 << 16, stream));
    let by = || Deadline::By(Instant::now() + opts.timeout.max(CONNECT_TIMEOUT));
    let keys = Keys::new(&opts.token);
    let nonce = auth::nonce()?;
    let hello = Hello {
        model: opts.model.clone(),
        nonce: auth::hex(&nonce),
        encrypt: opts.encrypt,
    };
    let mut frame = Vec::new();
    write_frame(&mut w, Kind::Hello, 0, &json(&hello, "writing the hello")?, &mut frame)?;
    let mut body = Vec::new();
    let (h, _, _) = read_frame_by(&mut r, 1 << 16, &mut body, by())?;
    let challenge: Challenge = match h.kind {
        Kind::Challenge => serde_json::from_slice(&body).map_err(|error| ExchangeError::Json {
            what: "reading the node's challenge",
            error,
        })?,
        Kind::Error => return Err(ExchangeError::Refused(String::from_utf8_lossy(&body).into_owned())),
        kind => return Err(ExchangeError::WrongAnswer { to: "the hello", kind }),
    };
    let node_nonce = auth::unhex(&challenge.nonce).ok_or(ExchangeError::Impostor)?;
    let proof = auth::unhex(&challenge.proof).ok_or(ExchangeError::Impostor)?;
    if !auth::same(&proof, &keys.node_proof(&nonce, &node_nonce, &opts.model, opts.encrypt)) {
        return Err(ExchangeError::Impostor);
    }
    let ours = Proof {
        proof: auth::hex(&keys.backbone_proof(&nonce, &node_nonce, &opts.model, opts.encrypt)),
    };
    write_frame(&mut w, Kind::Proof, 0, &json(&ours, "writing the proof")?, &mut frame)?;
    let key = keys.session_key(&nonce, &node_nonce, &opts.model, opts.encrypt);
    let mut session = if opts.encrypt {
        Session::encrypted(key, Side::Backbone)
    } else {
        Session::new(key, Side::Backbone)
    };
    let h = match session.read(&mut r, 1 << 16, &mut body, by()) {
        Ok(h) => h,
        // A refusal after the proofs (another model) comes as a plain frame, without a MAC.
        Err(FrameError::BadMac) => return Err(ExchangeError::Refused(String::from_utf8_lossy(&body).into_owned())),
        Err(e) => return Err(e.into()),
    };
    match h.kind {
        Kind::Welcome => {
            let welcome: Welcome = serde_json::from_slice(&body).map_err(|error| ExchangeError::Json {
                what: "reading the node's welcome",
                error,
            })?;
            Ok((Conn { w, r, session }, welcome))
        }
        kind => Err(ExchangeError::WrongAnswer { to: "the proof", kind }),
    }
}

/// The median of `n` empty round trips on `conn`, in nanoseconds.
fn ping(conn: &mut Conn, n: usize) -> Result<u64, ExchangeError> {
    let (mut frame, mut body) = (Vec::new(), Vec::new());
    let mut times = Vec::with_capacity(n);
    for i in 0..n as u64 {
        let t = Instant::now();
        conn.session.write(&mut conn.w, Kind::Ping, i, &[], &mut frame)?;
        let h = conn
            .session
            .read(&mut conn.r, 1 << 16, &mut body, Deadline::By(t + CONNECT_TIMEOUT))?;
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
            node.pending = None;
            tracing::warn!(
                "node {n} ({}) is down, its experts are computed elsewhere: {why}",
                self.names[n]
            );
        }
        if node.distrusted || self.redial.dialing[n].swap(true, Ordering::SeqCst) {
            return;
        }
        let (redial, opts, addr) = (self.redial.clone(), self.opts.clone(), self.names[n].clone());
        std::thread::spawn(move || {
            let mut said = String::new();
            loop {
                std::thread::sleep(RETRY_EVERY);
                if redial.closing.load(Ordering::SeqCst) {
                    return;
                }
                match handshake(&addr, &opts) {
                    Ok(answer) => {
                        redial.revived.lock().unwrap_or_else(|e| e.into_inner())[n] = Some(answer);
                        return;
                    }
                    // Something answers at the address but cannot be used (an impostor, another token):
                    // worth a warning, once for each new reason; a node still dead is not.
                    Err(e @ (ExchangeError::Impostor | ExchangeError::Refused(_))) => {
                        let why = e.to_string();
                        if why != said {
                            tracing::warn!("node {n} ({addr}) answers but is not taken back: {why}");
                            said = why;
                        }
                    }
                    Err(e) => tracing::debug!("node {n} ({addr}) is still down: {e}"),
                }
            }
        });
    }

    /// Node `n` failed an exchange (`what`): a node whose answer failed its audit is distrusted for good,
    /// any other is down and dialled again.
    fn failed(&self, st: &mut State, n: usize, e: &ExchangeError, what: &str) {
        if let ExchangeError::AuditFailed { .. } | ExchangeError::RowsAuditFailed { .. } = e {
            st.nodes[n].distrusted = true;
            tracing::error!(
                "node {n} ({}) is faulty or lying and takes no more work: {what}: {e}",
                self.names[n]
            );
        }
        self.down(st, n, &format!("{what}: {e}"));
    }

    /// Reads and drops every answer still on its way (after the backbone's own share failed): a node
    /// that does not answer in time is marked down.
    fn drain(&self, st: &mut State) {
        for n in 0..st.nodes.len() {
            let Some((_, sent)) = st.nodes[n].pending.take() else {
                continue;
            };
            let State { nodes, body, .. } = &mut *st;
            let Some(conn) = nodes[n].conn.as_mut() else { continue };
            let by = Deadline::By(sent + self.opts.timeout);
            let read = conn.session.read(&mut conn.r, titan_net::DEFAULT_MAX_FRAME, body, by);
            if let Err(e) = read {
                self.down(st, n, &format!("its answer, dropped after a failure here: {e}"));
            }
        }
    }

    /// Takes back the down nodes that answered again; they are used from this layer on.
    fn revive(&self, st: &mut State) {
        let mut revived = self.redial.revived.lock().unwrap_or_else(|e| e.into_inner());
        for (n, node) in st.nodes.iter_mut().enumerate() {
            let Some((conn, welcome)) = revived[n].take() else {
                continue;
            };
            self.redial.dialing[n].store(false, Ordering::SeqCst);
            let (n_layer, n_expert) = self.shape;
            if let Err(e) = check_shape(&self.names[n], &welcome, n_layer, n_expert) {
                tracing::warn!("node {n} answered again but cannot be used: {e}");
                continue;
            }
            if node.metrics.downs > 0 {
                tracing::info!("node {n} ({}) is back", self.names[n]);
            } else {
                tracing::info!("node {n} ({}) is up: it joins now", self.names[n]);
            }
            node.conn = Some(conn);
            node.welcomed(&welcome, self.backbone_speed);
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.redial.closing.store(true, Ordering::SeqCst);
    }
}
