//! The seam between the forward pass and the experts.
//!
//! The MoE layer asks one question — "the outputs of experts `ids` of layer `l` on their rows" — through
//! the [`Experts`] trait, so where an expert is computed never touches the architectures: in place from
//! the GGUF mapping ([`ResidentExperts`]), from a bounded cache fed by an expert store on SSD (the store's
//! source), or on another machine (the cluster's, which mixes remote nodes with a local fallback). Whoever computes an
//! expert, its output for a row is a pure function of (row, expert weights), and the caller combines the
//! outputs in ascending expert-id order, in one place (`moe::moe_block`): see docs/determinism.md.

use std::sync::{Arc, Mutex};

use titan_kernels::{matmul_many, Activations, GgmlType, MatmulJob, WeightView};

use crate::config::Activation;
use crate::ops::{add_bias, exp};
use crate::samples::Sample;
use crate::scratch::{recycle, slots};
use crate::weights::{ExpertBias, Weights};
use crate::{EngineError, Result};

/// One layer's work for the experts: expert `ids[i]` applied to rows `rows_of(i)` of `input`.
pub struct ExpertJob<'a> {
    pub layer: usize,
    /// The layer's normalised input, quantised once for the experts' gate and up projections.
    pub input: &'a Activations,
    /// Distinct expert ids, ascending.
    pub ids: &'a [u32],
    /// The input rows of every expert, one list after another: expert `ids[i]` takes
    /// `rows[starts[i]..starts[i + 1]]`.
    pub rows: &'a [usize],
    pub starts: &'a [usize],
}

impl ExpertJob<'_> {
    pub fn rows_of(&self, i: usize) -> &[usize] {
        &self.rows[self.starts[i]..self.starts[i + 1]]
    }
}

/// Where experts are computed: rows in, outputs out. Each source owns its working buffers and says
/// which activation format it takes; what it counts goes out through [`Experts::samples`].
pub trait Experts: Send + Sync {
    /// The activation format layer `layer`'s experts take their input in (their gate and up matrices'):
    /// the caller quantises the layer's input once, in this format, for every expert of the job.
    fn input_type(&self, layer: usize) -> Result<GgmlType>;

    /// Compute every expert of `job` and hand its output to `deliver(i, y)` — `y` holding one
    /// `n_embd`-long row per row of `job.rows_of(i)`, in that order — once per expert, in any order.
    /// `meanwhile` is the caller's own work for this layer (the shared expert), called exactly once, at the
    /// point where it overlaps best: while other machines compute, for a remote source.
    fn apply(
        &self,
        job: &ExpertJob,
        meanwhile: &mut dyn FnMut() -> Result<()>,
        deliver: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<()>;

    /// Whether read-ahead hints for `layer` would be used now: the caller routes ahead (a router pass)
    /// only for a source that would act on the answer.
    fn wants_hints(&self, _layer: usize) -> bool {
        false
    }

    /// Experts `ids` (distinct, ascending) of `layer` will probably be asked for next: a source that
    /// reads experts from somewhere slow can start now. Never changes a result.
    fn hint(&self, _layer: usize, _ids: &[u32]) -> Result<()> {
        Ok(())
    }

    /// Appends what the source has counted so far (cache hits, bytes read, exchanges with nodes…).
    fn samples(&self, _out: &mut Vec<Sample>) {}

    /// What the source did so far, for a person (a few lines ending in a newline), if it has anything
    /// to say.
    fn summary(&self) -> Option<String> {
        None
    }
}

/// A shared source (the CLI keeps a handle on a cluster to read its counters).
impl<T: Experts + ?Sized> Experts for Arc<T> {
    fn input_type(&self, layer: usize) -> Result<GgmlType> {
        (**self).input_type(layer)
    }

    fn apply(
        &self,
        job: &ExpertJob,
        meanwhile: &mut dyn FnMut() -> Result<()>,
        deliver: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<()> {
        (**self).apply(job, meanwhile, deliver)
    }

    fn wants_hints(&self, layer: usize) -> bool {
        (**self).wants_hints(layer)
    }

    fn hint(&self, layer: usize, ids: &[u32]) -> Result<()> {
        (**self).hint(layer, ids)
    }

    fn samples(&self, out: &mut Vec<Sample>) {
        (**self).samples(out)
    }

    fn summary(&self) -> Option<String> {
        (**self).summary()
    }
}

/// The working buffers of a local source's computation, kept between calls.
#[derive(Default)]
pub struct ExpertScratch {
    /// Per expert of a batch, the rows routed to it.
    acts: Vec<Activations>,
    /// Always empty: the allocation of a batch's list of weights (see [`recycle`]).
    views: Vec<ExpertWeights<'static>>,
    /// The job indexes of a batch.
    which: Vec<usize>,
    ffn: FfnScratch,
}

/// One expert's three matrices, its biases if the model has them, and its activation.
#[derive(Clone, Copy)]
pub struct ExpertWeights<'a> {
    pub gate: WeightView<'a>,
    pub up: WeightView<'a>,
    pub down: WeightView<'a>,
    pub bias: Option<ExpertBias<'a>>,
    pub act: Activation,
}

impl ExpertScratch {
    /// Computes experts `job.ids[i]` for each `(i, weights)` of `batch` on their rows, and delivers each
    /// output: the one computation every local source shares (in one parallel region for the batch).
    /// Allocates nothing once a batch of this size has run.
    pub fn compute<'w>(
        &mut self,
        job: &ExpertJob,
        batch: impl IntoIterator<Item = (usize, ExpertWeights<'w>)>,
        deliver: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<()> {
        let mut views: Vec<ExpertWeights<'w>> = recycle(std::mem::take(&mut self.views));
        self.which.clear();
        for (i, w) in batch {
            self.which.push(i);
            views.push(w);
        }
        let r = compute_batch(job, &self.which, &views, &mut self.acts, &mut self.ffn, deliver);
        self.views = recycle(views);
        r
    }
}

/// Computes experts `job.ids[which[k]]`, whose weights are `batch[k]`, on their rows, and delivers each
/// output.
fn compute_batch(
    job: &ExpertJob,
    which: &[usize],
    batch: &[ExpertWeights],
    acts: &mut Vec<Activations>,
    ffn: &mut FfnScratch,
    deliver: &mut dyn FnMut(usize, &[f32]),
) -> Result<()> {
    let in_ty = job.input.act_type();
    let acts = slots(acts, batch.len());
    for ((&i, ew), a) in which.iter().zip(batch).zip(acts.iter_mut()) {
        // Gate and up share the input's quantisation (one tensor type per stacked tensor, and a store's
        // records and a shard's tensors keep those types); anything else is a model this cannot compute.
        for m in [&ew.gate, &ew.up] {
            if m.ty.act_type() != in_ty {
                let what = format!(
                    "{} weights need {} activations, the layer's input is {}",
                    m.ty.name(),
                    m.ty.act_type().name(),
                    in_ty.name()
                );
                return Err(EngineError::Expert {
                    layer: job.layer,
                    expert: job.ids[i],
                    what,
                });
            }
        }
        a.gather_from(job.input, job.rows_of(i));
    }
    for (&i, y) in which.iter().zip(swiglu_many(batch, acts, ffn)?) {
        deliver(i, y);
    }
    Ok(())
}

/// Working buffers shared by the threads that call one source: a call takes a set (or makes one) and
/// gives it back, so concurrent callers (a worker's connections) never wait for each other's, and a lone
/// caller reuses the same set every time.
pub struct ScratchPool<T>(Mutex<Vec<T>>);

impl<T> Default for ScratchPool<T> {
    fn default() -> Self {
        ScratchPool(Mutex::new(Vec::new()))
    }
}

impl<T: Default> ScratchPool<T> {
    pub fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        // A panic while the lock is held leaves only buffers behind; keep going.
        let lock = || self.0.lock().unwrap_or_else(|e| e.into_inner());
        let mut s = lock().pop().unwrap_or_default();
        let r = f(&mut s);
        lock().push(s);
        r
    }
}

/// The experts in the model's own weights: viewed in place in the GGUF mapping, or in the regrouped
/// copies made at load. The whole model fits in memory, or the page cache copes.
pub struct ResidentExperts {
    weights: Arc<Weights>,
    scratch: ScratchPool<ExpertScratch>,
}

impl ResidentExperts {
    pub fn new(weights: Arc<Weights>) -> ResidentExperts {
        ResidentExperts {
            weights,
            scratch: ScratchPool::default(),
        }
    }
}

impl Experts for ResidentExperts {
    fn input_type(&self, layer: usize) -> Result<GgmlType> {
        let l = self.weights.layers.get(layer).ok_or_else(|| EngineError::Expert {
            layer,
            expert: 0,
            what: "the model has no such layer".into(),
        })?;
        Ok(l.experts(layer, 0)?.gate.mat.ty.act_type())
    }

    fn apply(
        &self,
        job: &ExpertJob,
        meanwhile: &mut dyn FnMut() -> Result<()>,
        deliver: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<()> {
        meanwhile()?;
        let w = &self.weights;
        let layer = job.layer;
        let l = w
            .layers
            .get(layer)
            .ok_or_else(|| EngineError::Expert {
                layer,
                expert: job.ids.first().copied().unwrap_or(0),
                what: "the model has no such layer".into(),
            })?
            .experts(layer, job.ids.first().copied().unwrap_or(0))?;
        let weights = job.ids.iter().enumerate().map(|(i, &e)| {
            let e = e as usize;
            let w = ExpertWeights {
                gate: w.view(&l.gate.expert(e)),
                up: w.view(&l.up.expert(e)),
                down: w.view(&l.down.expert(e)),
                bias: w.extras.bias(layer, e),
                act: w.extras.act,
            };
            (i, w)
        });
        self.scratch.with(|s| s.compute(job, weights, deliver))
    }
}

impl FfnScratch {
    /// Output `i` of the last [`swiglu_many`].
    pub fn output(&self, i: usize) -> &[f32] {
        &self.out[i]
    }
}

/// The working buffers of [`swiglu_many`], kept between calls: per feed-forward, its gate and up
/// outputs, their quantised product and its output.
#[derive(Default)]
pub struct FfnScratch {
    gate: Vec<Vec<f32>>,
    up: Vec<Vec<f32>>,
    mid: Vec<Activations>,
    out: Vec<Vec<f32>>,
    /// Always empty: the allocation of the matmul job lists (see [`recycle`]).
    jobs: Vec<MatmulJob<'static>>,
}

/// down(silu(gate(x)) · up(x)) for several feed-forwards at once (the experts of a batch, or the
/// shared expert): `x[i]` holds the rows of FFN `i` already quantised for its gate and up projections,
/// and the result's element `i` its output rows. All gate and up products run in one parallel region,
/// then all down products in another.
pub fn swiglu_many<'s>(ffns: &[ExpertWeights<'_>], x: &[Activations], s: &'s mut FfnScratch) -> Result<&'s [Vec<f32>]> {
    let n = ffns.len();
    let (gate, up, mid, out) = (
        slots(&mut s.gate, n),
        slots(&mut s.up, n),
        slots(&mut s.mid, n),
        slots(&mut s.out, n),
    );
    let mut jobs: Vec<MatmulJob> = recycle(std::mem::take(&mut s.jobs));
    for (((f, a), g), u) in ffns.iter().zip(x).zip(gate.iter_mut()).zip(up.iter_mut()) {
        g.resize(a.rows() * f.gate.rows, 0.0);
        u.resize(a.rows() * f.up.rows, 0.0);
        jobs.push(MatmulJob {
            w: f.gate,
            acts: a,
            out: g,
        });
        jobs.push(MatmulJob {
            w: f.up,
            acts: a,
            out: u,
        });
    }
    matmul_many(&mut jobs)?;
    // A fresh list for the down products: this ends the first list's borrows of `gate` and `up`.
    let mut jobs: Vec<MatmulJob> = recycle(jobs);
    for (((f, a), (g, u)), m) in ffns
        .iter()
        .zip(x)
        .zip(gate.iter_mut().zip(up.iter_mut()))
        .zip(mid.iter_mut())
    {
        if let Some(b) = &f.bias {
            add_bias(g, b.gate);
            add_bias(u, b.up);
        }
        match f.act {
            Activation::Silu => titan_kernels::silu_mul(g, u),
            Activation::ClampedSwiglu { alpha, limit } => {
                for (p, &q) in g.iter_mut().zip(u.iter()) {
                    let x = p.min(limit);
                    *p = x / (1.0 + exp(-alpha * x)) * (q.clamp(-limit, limit) + 1.0);
                }
            }
            Activation::ClampedSilu { limit } => {
                for (p, &q) in g.iter_mut().zip(u.iter()) {
                    let x = p.min(limit);
                    *p = x / (1.0 + exp(-x)) * q.clamp(-limit, limit);
                }
            }
        }
        m.quantize(f.down.ty.act_type(), g, a.rows(), f.gate.rows)?;
    }
    for ((f, m), y) in ffns.iter().zip(mid.iter()).zip(out.iter_mut()) {
        y.resize(m.rows() * f.down.rows, 0.0);
        jobs.push(MatmulJob {
            w: f.down,
            acts: m,
            out: y,
        });
    }
    matmul_many(&mut jobs)?;
    s.jobs = recycle(jobs);
    for (f, y) in ffns.iter().zip(s.out.iter_mut()) {
        if let Some(b) = &f.bias {
            add_bias(y, b.down);
        }
    }
    Ok(&s.out[..n])
}
