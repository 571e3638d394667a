//! The seam between the forward pass and the experts.
//!
//! The MoE layer asks one question — "the outputs of experts `ids` of layer `l` on their rows" — through
//! the [`Experts`] trait, so where an expert is computed never touches the architectures: in place from
//! the GGUF mapping, from a bounded cache fed by an expert store on SSD ([`ExpertSource`]), or on another
//! machine (the cluster's source, which mixes remote nodes with a local fallback). Whoever computes an
//! expert, its output for a row is a pure function of (row, expert weights), and the caller combines the
//! outputs in ascending expert-id order, in one place (`moe::moe_block`): see docs/determinism.md.

use std::sync::Arc;

use titan_kernels::{matmul_many, Activations, MatmulJob, WeightView};
use titan_store::ExpertCache;

use crate::config::Activation;
use crate::ops::{add_bias, exp};
use crate::scratch::{recycle, slots};
use crate::weights::{ExpertBias, ExpertExtras, Weights};
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

/// Where experts are computed.
pub trait Experts: Send + Sync {
    /// Compute every expert of `job` and hand its output to `deliver(i, y)` — `y` holding one
    /// `n_embd`-long row per row of `job.rows_of(i)`, in that order — once per expert, in any order.
    /// `meanwhile` is the caller's own work for this layer (the shared expert), called exactly once, at the
    /// point where it overlaps best: while other machines compute, for a remote source.
    fn apply(
        &self,
        job: &ExpertJob,
        s: &mut ExpertScratch,
        meanwhile: &mut dyn FnMut() -> Result<()>,
        deliver: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<()>;

    /// The expert cache, when experts stream from a store on this machine.
    fn cache(&self) -> Option<&ExpertCache> {
        None
    }

    /// What the source did so far, for the user (a cluster's per-node counters), if it has more to say
    /// than the cache's statistics.
    fn report(&self) -> Option<String> {
        None
    }

    /// Each remote node's exchange counters so far (a cluster's; none for a source on this machine).
    fn exchanges(&self) -> Vec<NodeExchange> {
        Vec::new()
    }
}

/// One remote node's layer exchanges as the backbone saw them (for the server's `/metrics`).
#[derive(Clone, Debug, Default)]
pub struct NodeExchange {
    pub node: String,
    pub exchanges: u64,
    /// From sending a layer's request to having its answer, summed.
    pub exchange_ns: u64,
    /// Of that, the time the backbone waited after finishing its own share.
    pub wait_ns: u64,
    pub bytes_out: u64,
    pub bytes_in: u64,
    /// Layers whose experts were computed elsewhere because this node failed them.
    pub failovers: u64,
}

/// A shared source (the CLI keeps a handle on a cluster to read its counters).
impl<T: Experts + ?Sized> Experts for std::sync::Arc<T> {
    fn apply(
        &self,
        job: &ExpertJob,
        s: &mut ExpertScratch,
        meanwhile: &mut dyn FnMut() -> Result<()>,
        deliver: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<()> {
        (**self).apply(job, s, meanwhile, deliver)
    }

    fn cache(&self) -> Option<&ExpertCache> {
        (**self).cache()
    }

    fn report(&self) -> Option<String> {
        (**self).report()
    }

    fn exchanges(&self) -> Vec<NodeExchange> {
        (**self).exchanges()
    }
}

/// The working buffers of [`Experts::apply`], kept between calls.
#[derive(Default)]
pub struct ExpertScratch {
    /// Per expert of a batch, the rows routed to it.
    acts: Vec<Activations>,
    /// Always empty: the allocation of a batch's list (see [`ExpertSource::for_each_batch`]).
    views: Vec<ExpertWeights<'static>>,
    /// The job indexes of a batch.
    which: Vec<usize>,
    ffn: FfnScratch,
}

/// Experts computed on this machine.
pub enum ExpertSource {
    /// Read in place from the model's weights (the mapping, or the regrouped copies made at load): the
    /// whole model fits in memory, or the page cache copes.
    Resident(Arc<Weights>),
    /// Served by a bounded cache over an expert store: a layer's misses are read together, and the
    /// experts are computed as soon as their records are here — the hits in one batch, then each group of
    /// reads that completed meanwhile in another. The biases and activation stay resident.
    Streamed(ExpertCache, Arc<ExpertExtras>),
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

impl Experts for ExpertSource {
    fn apply(
        &self,
        job: &ExpertJob,
        s: &mut ExpertScratch,
        meanwhile: &mut dyn FnMut() -> Result<()>,
        deliver: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<()> {
        meanwhile()?;
        let ExpertScratch {
            acts,
            views,
            which,
            ffn,
        } = s;
        self.for_each_batch(job.layer, job.ids, views, which, |which, batch| {
            compute_batch(job, which, batch, acts, ffn, deliver)
        })
    }

    fn cache(&self) -> Option<&ExpertCache> {
        match self {
            ExpertSource::Resident(_) => None,
            ExpertSource::Streamed(c, _) => Some(c),
        }
    }
}

/// Computes experts `job.ids[which[k]]`, whose weights are `batch[k]`, on their rows, and delivers each
/// output: the one computation every local source shares.
pub fn compute_batch(
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

impl ExpertScratch {
    /// The buffers [`compute_batch`] needs, for a source outside this module.
    pub fn batch_buffers(&mut self) -> (&mut Vec<Activations>, &mut FfnScratch) {
        (&mut self.acts, &mut self.ffn)
    }
}

impl ExpertSource {
    /// Call `f(which, batch)` with the experts `ids[which[k]]` of `layer` (distinct), weights `batch[k]`,
    /// in batches as they become available: all at once when resident; when streamed, the hits together
    /// and then the misses as their records arrive, so computing the first overlaps reading the rest.
    /// `views` is kept empty by the caller and lends its allocation to each batch's list, `which` holds
    /// each batch's indexes.
    fn for_each_batch(
        &self,
        layer: usize,
        ids: &[u32],
        views: &mut Vec<ExpertWeights<'static>>,
        which: &mut Vec<usize>,
        mut f: impl FnMut(&[usize], &[ExpertWeights<'_>]) -> Result<()>,
    ) -> Result<()> {
        match self {
            ExpertSource::Resident(w) => {
                let l = w.layers[layer].experts(layer, ids.first().copied().unwrap_or(0))?;
                let mut all: Vec<ExpertWeights> = recycle(std::mem::take(views));
                all.extend(ids.iter().map(|&e| {
                    let e = e as usize;
                    let (bias, act) = (w.extras.bias(layer, e), w.extras.act);
                    ExpertWeights {
                        gate: w.view(&l.gate_exps.expert(e)),
                        up: w.view(&l.up_exps.expert(e)),
                        down: w.view(&l.down_exps.expert(e)),
                        bias,
                        act,
                    }
                }));
                which.clear();
                which.extend(0..all.len());
                let r = f(which, &all);
                *views = recycle(all);
                r
            }
            ExpertSource::Streamed(cache, extras) => {
                // The callback cannot return an error to the cache; keep the first one and stop computing.
                let mut failed: Option<EngineError> = None;
                cache.get_layer_with(layer, ids, &mut |ready| {
                    if failed.is_none() {
                        which.clear();
                        which.extend(ready.iter().map(|(i, _)| *i));
                        let mut batch: Vec<ExpertWeights> = recycle(std::mem::take(views));
                        batch.extend(ready.iter().map(|(i, rec)| {
                            let (bias, act) = (extras.bias(layer, ids[*i] as usize), extras.act);
                            ExpertWeights {
                                gate: rec.gate().weight_view(),
                                up: rec.up().weight_view(),
                                down: rec.down().weight_view(),
                                bias,
                                act,
                            }
                        }));
                        if let Err(e) = f(which, &batch) {
                            failed = Some(e);
                        }
                        *views = recycle(batch);
                    }
                })?;
                failed.map_or(Ok(()), Err)
            }
        }
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
