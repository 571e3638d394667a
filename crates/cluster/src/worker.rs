//! `titan worker`: an expert node. It holds a model's experts (resident, or streamed from its store
//! through a bounded cache), keeps no KV state, and answers Compute requests from backbones that show
//! the node token. It can be killed and restarted at any time: backbones compute around it meanwhile.

use std::io::BufReader;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use titan_engine::experts::Experts;
use titan_engine::weights::Weights;
use titan_engine::EngineError;
use titan_kernels::{matmul_many, MatmulJob};
use titan_net::{read_frame_by, write_frame, Deadline, FrameError, Kind, Session, Side};

use crate::auth::{self, Keys};
use crate::proto::{
    json, start_output, write_output, Challenge, Compute, Held, Hello, Proof, RowsRequest, Shape, Welcome,
};
use crate::{ClusterError, ExchangeError};

pub struct WorkerOptions {
    pub listen: String,
    pub token: Vec<u8>,
    /// The largest frame accepted.
    pub max_frame: usize,
    /// Refuse backbones that do not encrypt their connection.
    pub encrypt: bool,
}

/// How long each frame of a new connection's handshake has to arrive whole.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a frame a backbone has begun may take to arrive whole.
const FRAME_TIME: Duration = Duration::from_secs(60);
/// Connections at most in their handshake at once: past that, a new one is closed at once, so that
/// connections that never prove the token cannot hold the node's threads.
const HANDSHAKES: usize = 16;

/// The node's counters since it started, over every connection.
#[derive(Default)]
pub struct WorkerMetrics {
    pub connections: AtomicU64,
    pub refused: AtomicU64,
    pub requests: AtomicU64,
    pub experts: AtomicU64,
    pub rows: AtomicU64,
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
    pub compute_ns: AtomicU64,
}

impl WorkerMetrics {
    fn json(&self) -> serde_json::Value {
        let g = |a: &AtomicU64| a.load(Relaxed);
        serde_json::json!({
            "connections": g(&self.connections), "refused": g(&self.refused), "requests": g(&self.requests),
            "experts": g(&self.experts), "rows": g(&self.rows), "bytes_in": g(&self.bytes_in),
            "bytes_out": g(&self.bytes_out), "compute_ns": g(&self.compute_ns),
        })
    }
}

/// The experts a node serves and what they belong to.
pub struct NodeModel {
    /// The model's identity (`model_identity`).
    pub identity: String,
    pub n_layer: usize,
    pub n_expert: usize,
    pub n_embd: usize,
    pub experts: Box<dyn Experts>,
    /// The shards' layers and experts, when the node holds shards.
    pub holds: Option<Vec<Held>>,
    /// The model's weights, when the node holds the whole model: it then also computes shares of the
    /// dense products split by output rows (Rows requests).
    pub weights: Option<Arc<Weights>>,
    /// Bytes of experts this node offers (announced to backbones, which size its share by it).
    pub budget: u64,
}

/// Listens on `opts.listen` and serves backbones until the process ends; `ready` is told the bound
/// address first (port 0 picks a free one).
pub fn serve(model: NodeModel, opts: WorkerOptions, ready: impl FnOnce(SocketAddr)) -> Result<(), ClusterError> {
    let listener = TcpListener::bind(&opts.listen).map_err(|error| ClusterError::Listen {
        addr: opts.listen.clone(),
        error,
    })?;
    ready(
        listener
            .local_addr()
            .map_err(ClusterError::io("reading the address listened on"))?,
    );
    let ctx = Arc::new(Node {
        welcome: Welcome {
            model: model.identity.clone(),
            budget: model.budget,
            n_layer: model.n_layer,
            n_expert: model.n_expert,
            isa: titan_kernels::isa().name().to_string(),
            threads: rayon::current_num_threads(),
            holds: model.holds.clone(),
            rows: model.weights.is_some(),
            speed: probed_speed(),
        },
        model,
        keys: Keys::new(&opts.token),
        opts,
        metrics: WorkerMetrics::default(),
        handshaking: Default::default(),
    });
    for stream in listener.incoming() {
        let stream = match stream {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("accepting a connection failed: {e}");
                continue;
            }
        };
        if ctx.handshaking.load(Relaxed) >= HANDSHAKES {
            ctx.metrics.refused.fetch_add(1, Relaxed);
            tracing::debug!("closed a connection at once: {HANDSHAKES} are in their handshake already");
            continue;
        }
        ctx.handshaking.fetch_add(1, Relaxed);
        let ctx = ctx.clone();
        std::thread::spawn(move || {
            let peer = stream.peer_addr().map_or_else(|_| "?".into(), |a| a.to_string());
            let _connection = tracing::info_span!("connection", peer = %peer).entered();
            match ctx.connection(stream) {
                Ok(Some(served)) => tracing::info!("closed ({served} requests)"),
                Ok(None) => tracing::trace!("closed before a byte: a reachability check"),
                Err(e) => tracing::warn!("connection closed: {e}"),
            }
        });
    }
    Ok(())
}

/// This node's speed, measured once as it starts.
fn probed_speed() -> f64 {
    let speed = crate::calibrate::weight_throughput(PROBE);
    tracing::info!("multiplies weights at {:.1} GB/s", speed / 1e9);
    speed
}

/// How long a machine's speed is measured for: over a few CPU-quota periods (100 ms), so that a node
/// allowed a share of a core measures that share, not its first burst.
pub const PROBE: Duration = Duration::from_millis(300);

struct Node {
    model: NodeModel,
    opts: WorkerOptions,
    keys: Keys,
    welcome: Welcome,
    metrics: WorkerMetrics,
    /// Connections in their handshake now.
    handshaking: std::sync::atomic::AtomicUsize,
}

/// A connection counted as in its handshake until this is dropped (the handshake over, or failed).
struct Handshaking<'a>(&'a std::sync::atomic::AtomicUsize);

impl Drop for Handshaking<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

impl Node {
    /// One backbone's connection: the handshake, then requests until it closes; the requests served, or
    /// `None` for a connection closed before its first byte. Any malformed frame ends this connection
    /// (with the reason logged by the caller) and nothing else.
    fn connection(&self, stream: TcpStream) -> Result<Option<u64>, ExchangeError> {
        stream.set_nodelay(true)?;
        let mut w = stream.try_clone()?;
        let mut r = BufReader::with_capacity(1 << 16, stream);
        let (mut body, mut frame) = (Vec::new(), Vec::new());
        let limit = self.opts.max_frame;
        let handshake = Handshaking(&self.handshaking);

        // The handshake, each of its frames due whole within the hello's time however it trickles.
        let by = || Deadline::By(Instant::now() + HELLO_TIMEOUT);
        let h = match read_frame_by(&mut r, 1 << 16, &mut body, by()) {
            Ok((h, _, _)) => h,
            Err(FrameError::Closed) => return Ok(None),
            Err(e) => return Err(ExchangeError::Hello(e)),
        };
        let hello = (h.kind == Kind::Hello)
            .then(|| serde_json::from_slice::<Hello>(&body).ok())
            .flatten();
        let refuse = |w: &mut TcpStream, frame: &mut Vec<u8>, why: String| {
            self.metrics.refused.fetch_add(1, Relaxed);
            let _ = write_frame(w, Kind::Error, h.id, why.as_bytes(), frame);
            Err(ExchangeError::Refused(why))
        };
        let (hello, backbone_nonce) = match hello.map(|hi| (auth::unhex(&hi.nonce), hi)) {
            Some((Some(nonce), hi)) => (hi, nonce),
            _ => return refuse(&mut w, &mut frame, "the first frame must be a hello".into()),
        };
        if hello.model != self.welcome.model {
            let why = format!(
                "this node holds another model ({}), the backbone runs {}",
                self.welcome.model, hello.model
            );
            return refuse(&mut w, &mut frame, why);
        }
        if self.opts.encrypt && !hello.encrypt {
            let why = "this node accepts only encrypted connections: give the backbone --encrypt".to_string();
            return refuse(&mut w, &mut frame, why);
        }
        let (model, encrypt) = (&self.welcome.model, hello.encrypt);
        let nonce = auth::nonce()?;
        let challenge = Challenge {
            nonce: auth::hex(&nonce),
            proof: auth::hex(&self.keys.node_proof(&backbone_nonce, &nonce, model, encrypt)),
        };
        write_frame(
            &mut w,
            Kind::Challenge,
            h.id,
            &json(&challenge, "writing the challenge")?,
            &mut frame,
        )?;
        let (h, _, _) = read_frame_by(&mut r, 1 << 16, &mut body, by()).map_err(ExchangeError::Hello)?;
        let proof = (h.kind == Kind::Proof)
            .then(|| serde_json::from_slice::<Proof>(&body).ok())
            .flatten()
            .and_then(|p| auth::unhex(&p.proof));
        let expected = self.keys.backbone_proof(&backbone_nonce, &nonce, model, encrypt);
        if !proof.is_some_and(|p| auth::same(&p, &expected)) {
            return refuse(&mut w, &mut frame, "wrong node token".into());
        }
        let key = self.keys.session_key(&backbone_nonce, &nonce, model, encrypt);
        let mut session = if encrypt {
            Session::encrypted(key, Side::Node)
        } else {
            Session::new(key, Side::Node)
        };
        session.write(
            &mut w,
            Kind::Welcome,
            h.id,
            &json(&self.welcome, "writing the welcome")?,
            &mut frame,
        )?;
        drop(handshake);
        self.metrics.connections.fetch_add(1, Relaxed);

        let m = &self.model;
        let shape = Shape {
            n_layer: m.n_layer,
            n_expert: m.n_expert,
            n_embd: m.n_embd,
        };
        let (mut req, mut out) = (Compute::default(), Vec::new());
        let (mut rows_req, mut floats) = (RowsRequest::default(), Vec::new());
        let mut served = 0u64;
        loop {
            // A backbone may idle between tokens for as long as its users do; a frame it begins must end.
            let h = match session.read(&mut r, limit, &mut body, Deadline::Once(FRAME_TIME)) {
                Ok(h) => h,
                Err(FrameError::Closed) => return Ok(Some(served)),
                Err(e) => return Err(e.into()),
            };
            self.metrics
                .bytes_in
                .fetch_add((body.len() + titan_net::HEADER_LEN) as u64, Relaxed);
            let reply = match h.kind {
                Kind::Compute => {
                    let t = Instant::now();
                    let result = match req.decode(&body, shape) {
                        Ok(()) => self.compute(&req, &mut out).map_err(|e| e.to_string()),
                        Err(e) => Err(e.to_string()),
                    };
                    if let Err(why) = result {
                        let _ = session.write(&mut w, Kind::Error, h.id, why.as_bytes(), &mut frame);
                        return Err(ExchangeError::RequestFailed { id: h.id, why });
                    }
                    self.metrics
                        .compute_ns
                        .fetch_add(t.elapsed().as_nanos() as u64, Relaxed);
                    served += 1;
                    (Kind::Output, &out[..])
                }
                Kind::Rows => {
                    let t = Instant::now();
                    if let Err(why) = self.rows(&body, &mut rows_req, &mut floats, &mut out) {
                        let _ = session.write(&mut w, Kind::Error, h.id, why.as_bytes(), &mut frame);
                        return Err(ExchangeError::RequestFailed { id: h.id, why });
                    }
                    self.metrics
                        .compute_ns
                        .fetch_add(t.elapsed().as_nanos() as u64, Relaxed);
                    served += 1;
                    (Kind::RowsOutput, &out[..])
                }
                Kind::Ping => (Kind::Pong, &body[..]),
                Kind::MetricsRequest => {
                    out = serde_json::to_vec(&self.metrics.json()).map_err(|error| ExchangeError::Json {
                        what: "writing the node's counters",
                        error,
                    })?;
                    (Kind::Metrics, &out[..])
                }
                other => {
                    let e = ExchangeError::Unexpected(other);
                    let _ = session.write(&mut w, Kind::Error, h.id, e.to_string().as_bytes(), &mut frame);
                    return Err(e);
                }
            };
            session.write(&mut w, reply.0, h.id, reply.1, &mut frame)?;
            self.metrics
                .bytes_out
                .fetch_add((reply.1.len() + titan_net::HEADER_LEN) as u64, Relaxed);
        }
    }

    /// The products of a Rows request, into a RowsOutput body; the reason as text when the request cannot
    /// be answered (the node holds no dense weights, a job's rows are not rows of the model's matrices).
    fn rows(&self, body: &[u8], req: &mut RowsRequest, floats: &mut Vec<f32>, out: &mut Vec<u8>) -> Result<(), String> {
        let Some(w) = &self.model.weights else {
            return Err("this node holds experts only, not the dense weights a rows request needs".into());
        };
        req.decode(body, w.max_cols()).map_err(|e| e.to_string())?;
        let mut mats = Vec::with_capacity(req.jobs.len());
        for j in &req.jobs {
            let m = w.matrix_at(j.start, j.ty, j.rows, j.cols).ok_or_else(|| {
                format!(
                    "{} rows of {} × {} at offset {} are not rows of a matrix of the model",
                    j.rows,
                    j.ty.name(),
                    j.cols,
                    j.start
                )
            })?;
            mats.push(m);
        }
        floats.clear();
        floats.resize(req.output_len(), 0.0);
        let mut list = Vec::with_capacity(mats.len());
        let mut rest = &mut floats[..];
        for (j, m) in req.jobs.iter().zip(&mats) {
            let input = &req.inputs[j.input];
            let (here, tail) = std::mem::take(&mut rest).split_at_mut(input.rows() * m.rows);
            rest = tail;
            list.push(MatmulJob {
                w: w.view(m),
                acts: input,
                out: here,
            });
        }
        matmul_many(&mut list).map_err(|e| e.to_string())?;
        out.clear();
        out.extend(floats.iter().flat_map(|v| v.to_le_bytes()));
        self.metrics.requests.fetch_add(1, Relaxed);
        Ok(())
    }

    /// Every expert of the request, into an Output body.
    fn compute(&self, req: &Compute, out: &mut Vec<u8>) -> Result<(), EngineError> {
        let d = self.model.n_embd;
        let job = req.job();
        start_output(out, job.ids.len(), d, job.rows.len());
        self.model
            .experts
            .apply(&job, &mut || Ok(()), &mut |i, y| write_output(out, d, job.starts[i], y))?;
        self.metrics.requests.fetch_add(1, Relaxed);
        self.metrics.experts.fetch_add(job.ids.len() as u64, Relaxed);
        self.metrics.rows.fetch_add(job.rows.len() as u64, Relaxed);
        Ok(())
    }
}
