//! A loaded model and its forward pass: one layer is a short list of named steps, and those names are
//! the trace points.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use titan_gguf::GgufFile;
use titan_kernels::{matmul, matmul_many, Activations, MatmulJob};
use titan_store::{Budget, CacheOptions, ExpertCache, Policy, Store, StoreOptions};
use titan_tokenizer::Tokenizer;

use crate::attention::{attend, AttnShape, KvCache};
use crate::config::{Config, RopeStyle};
use crate::experts::ExpertSource;
use crate::moe::{moe_block, route, Routing};
use crate::ops::{add, add_bias, rms_norm, rms_norm_into, rope_angles, rope_head};
use crate::stats::{Phase, Stats};
use crate::trace::Trace;
use crate::weights::{Layer, Mat, Weights};
use crate::{vocab, EngineError, Result};

pub struct Model {
    pub config: Config,
    pub weights: Weights,
    pub tokenizer: Tokenizer,
    pub experts: ExpertSource,
    /// Prefetch the next layer's likely experts (streamed experts only).
    prefetch: bool,
    /// Time per phase and weight bytes read, over every forward pass so far.
    pub stats: Stats,
}

/// Which positions of a forward call need logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outputs {
    All,
    Last,
}

/// How to load a model: everything resident (the default), or experts streamed from an expert store.
#[derive(Default)]
pub struct LoadOptions {
    pub stream: Option<StreamOptions>,
}

pub struct StreamOptions {
    /// The store directory (`titan convert` writes it beside the model as `MODEL.titan/`).
    pub store: PathBuf,
    pub budget_bytes: u64,
    pub policy: Policy,
    pub direct_io: bool,
    pub verify_digests: bool,
    /// Experts to keep resident for the whole run (e.g. the hottest of a routing profile).
    pub pinned: Vec<(usize, usize)>,
    /// Read the next layer's likely experts ahead (its router applied to the current hidden state).
    pub prefetch: bool,
}

impl Model {
    pub fn load(path: impl AsRef<Path>) -> Result<Model> {
        Self::load_with(path, &LoadOptions::default())
    }

    pub fn load_with(path: impl AsRef<Path>, opts: &LoadOptions) -> Result<Model> {
        let file = GgufFile::open(path)?;
        let config = Config::from_gguf(&file)?;
        let tokenizer = vocab::tokenizer_from_gguf(&file)?;
        let (experts, prefetch) = match &opts.stream {
            None => (ExpertSource::Resident, false),
            Some(s) => {
                let store = Store::open_with(&s.store, &file, &StoreOptions { direct_io: s.direct_io, verify_digests: s.verify_digests })?;
                let cache = ExpertCache::new(Arc::new(store), &CacheOptions { policy: s.policy, ..CacheOptions::new(Budget::Bytes(s.budget_bytes)) })?;
                cache.pin(&s.pinned)?;
                (ExpertSource::Streamed(cache), s.prefetch)
            }
        };
        let mut weights = Weights::load(file, &config)?;
        if experts.cache().is_some() {
            weights.make_dense_resident();
        }
        Ok(Model { config, weights, tokenizer, experts, prefetch, stats: Stats::default() })
    }

    pub fn new_cache(&self, n_ctx: usize) -> KvCache {
        KvCache::new(self.config.n_layer, n_ctx, self.config.kv_dim())
    }

    /// Run `tokens` at positions pos0.. through the model, appending their keys and values to `cache`.
    /// Returns logits (n_vocab per requested position, in order).
    pub fn forward(&self, tokens: &[u32], pos0: usize, cache: &mut KvCache, outputs: Outputs) -> Result<Vec<f32>> {
        self.forward_traced(tokens, pos0, cache, outputs, None)
    }

    /// [`Model::forward`], recording each named step into `trace` when one is given (one branch per
    /// step when it is not).
    pub fn forward_traced(
        &self,
        tokens: &[u32],
        pos0: usize,
        cache: &mut KvCache,
        outputs: Outputs,
        mut trace: Option<&mut Trace>,
    ) -> Result<Vec<f32>> {
        let c = &self.config;
        let n = tokens.len();
        if pos0 + n > cache.n_ctx() {
            return Err(EngineError::ContextFull { ctx: cache.n_ctx(), need: pos0 + n });
        }
        let (d, q_dim, kv_dim) = (c.n_embd, c.q_dim(), c.kv_dim());
        let w = &self.weights;

        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= c.n_vocab) {
            return Err(EngineError::BadToken { id: t, vocab: c.n_vocab });
        }
        // token_embd: one (dequantised) row per token.
        let mut x = vec![0f32; n * d];
        let embd = w.view(&w.token_embd);
        for (row, &t) in x.chunks_exact_mut(d).zip(tokens) {
            embd.dequantize_row(t as usize, row);
        }

        let shape = AttnShape { n_head: c.n_head, n_head_kv: c.n_head_kv, head_dim: c.head_dim };
        let mut h = Vec::new();
        let mut acts = Activations::new();
        let (mut q, mut k, mut v) = (vec![0f32; n * q_dim], vec![0f32; n * kv_dim], vec![0f32; n * kv_dim]);
        let mut attn = vec![0f32; n * q_dim];
        let mut attn_out = vec![0f32; n * d];
        let mut router_logits = vec![0f32; n * c.n_expert];
        // RoPE angles of each position, once for all layers.
        let half = c.rope_dims / 2;
        let (mut cos, mut sin) = (Vec::with_capacity(n * half), Vec::with_capacity(n * half));
        let (mut c1, mut s1) = (Vec::new(), Vec::new());
        for i in 0..n {
            rope_angles(pos0 + i, c.rope_dims, c.rope_base, &mut c1, &mut s1);
            cos.extend_from_slice(&c1);
            sin.extend_from_slice(&s1);
        }
        let stats = &self.stats;

        for (il, l) in w.layers.iter().enumerate() {
            if let Some(t) = trace.as_deref_mut() {
                t.tensor(Some(il), "layer_in", &[n, d], &x);
            }
            stats.time(Phase::Attention, || -> Result<()> {
                // attn_norm
                rms_norm_into(&x, &l.attn_norm, c.rms_eps, &mut h);
                // q, k, v: one parallel region, the normalised input quantised once per activation format
                self.project_qkv(l, &h, n, &mut q, &mut k, &mut v)?;
                if let (Some(bq), Some(bk), Some(bv)) = (&l.bq, &l.bk, &l.bv) {
                    add_bias(&mut q, bq);
                    add_bias(&mut k, bk);
                    add_bias(&mut v, bv);
                }
                // q_norm, k_norm: per head (weight of head_dim) or over all heads (weight of q_dim), by the weight's length
                if let (Some(qn), Some(kn)) = (&l.q_norm, &l.k_norm) {
                    rms_norm(&mut q, qn, c.rms_eps);
                    rms_norm(&mut k, kn, c.rms_eps);
                }
                // rope
                let halves = c.rope_style == RopeStyle::Halves;
                for i in 0..n {
                    let (cs, sn) = (&cos[i * half..(i + 1) * half], &sin[i * half..(i + 1) * half]);
                    for head in q[i * q_dim..(i + 1) * q_dim].chunks_exact_mut(c.head_dim) {
                        rope_head(&mut head[..c.rope_dims], cs, sn, halves);
                    }
                    for head in k[i * kv_dim..(i + 1) * kv_dim].chunks_exact_mut(c.head_dim) {
                        rope_head(&mut head[..c.rope_dims], cs, sn, halves);
                    }
                }
                // attention over the cache, then attn_output
                cache.store(il, pos0, &k, &v);
                attend(cache, il, &shape, pos0, &q, &mut attn);
                acts.quantize(l.wo.ty.act_type(), &attn, n, q_dim)?;
                matmul(&w.view(&l.wo), &acts, &mut attn_out)?;
                Ok(())
            })?;
            if let Some(t) = trace.as_deref_mut() {
                t.tensor(Some(il), "attn_out", &[n, d], &attn_out);
            }
            add(&mut x, &attn_out);

            // ffn_norm, router, experts
            let routing = stats.time(Phase::Router, || self.route_layer(l, &x, &mut h, &mut router_logits))?;
            if self.prefetch {
                self.prefetch_next(il, &x)?;
            }
            let moe_out = stats.time(Phase::Experts, || moe_block(w, &self.experts, c, il, &h, n, &routing))?;
            stats.add_bytes(self.layer_bytes(il, &routing));
            if let Some(t) = trace.as_deref_mut() {
                let k = routing.k;
                t.tensor(Some(il), "router_logits", &[n, c.n_expert], &router_logits);
                t.decision(Some(il), "topk_ids", &[n, k], &routing.ids);
                t.tensor(Some(il), "topk_weights", &[n, k], &routing.weights);
                t.tensor(Some(il), "moe_out", &[n, d], &moe_out);
            }
            add(&mut x, &moe_out);
        }

        // output_norm and the LM head, for the requested positions only.
        let (first, rows) = match outputs {
            Outputs::All => (0, n),
            Outputs::Last => (n - 1, 1),
        };
        let mut logits = vec![0f32; rows * c.n_vocab];
        stats.time(Phase::Head, || -> Result<()> {
            rms_norm_into(&x[first * d..], &w.output_norm, c.rms_eps, &mut h);
            titan_kernels::matmul_f32(&w.view(&w.output), &h, rows, &mut logits)?;
            Ok(())
        })?;
        stats.add_bytes((w.output.bytes() + n * w.token_embd.row_bytes()) as u64);
        if let Some(t) = trace {
            t.tensor(None, "logits", &[rows, c.n_vocab], &logits);
        }
        Ok(logits)
    }

    /// The routing of layer `l` for the residual stream `x`: `h` receives the normalised input (the experts'
    /// input) and `logits` the router logits.
    fn route_layer(&self, l: &Layer, x: &[f32], h: &mut Vec<f32>, logits: &mut [f32]) -> Result<Routing> {
        let c = &self.config;
        rms_norm_into(x, &l.ffn_norm, c.rms_eps, h);
        titan_kernels::matmul_f32(&self.weights.view(&l.router), h, x.len() / c.n_embd, logits)?;
        Ok(route(logits, c.n_expert, c.n_expert_used, c.norm_topk))
    }

    /// Issue reads for the experts layer `il + 1` will probably choose: its router applied to the current
    /// residual stream (which the next layer only changes by its attention output).
    fn prefetch_next(&self, il: usize, x: &[f32]) -> Result<()> {
        let (Some(cache), Some(next)) = (self.experts.cache(), self.weights.layers.get(il + 1)) else { return Ok(()) };
        let mut logits = vec![0f32; x.len() / self.config.n_embd * self.config.n_expert];
        let mut ids = self.route_layer(next, x, &mut Vec::new(), &mut logits)?.ids;
        ids.sort_unstable();
        ids.dedup();
        cache.prefetch(il + 1, &ids)?;
        Ok(())
    }

    /// Weight bytes one layer reads for a batch: its dense matrices once, each distinct chosen expert once.
    fn layer_bytes(&self, il: usize, routing: &Routing) -> u64 {
        let l = &self.weights.layers[il];
        let mut dense = [l.wq, l.wk, l.wv, l.wo, l.router].iter().map(Mat::bytes).sum::<usize>();
        if let Some(sh) = &l.shared {
            dense += sh.gate.bytes() + sh.up.bytes() + sh.down.bytes();
        }
        let expert = l.gate_exps.mat.bytes() + l.up_exps.mat.bytes() + l.down_exps.mat.bytes();
        let mut seen = vec![false; self.config.n_expert];
        let distinct = routing.ids.iter().filter(|&&e| !std::mem::replace(&mut seen[e as usize], true)).count();
        (dense + distinct * expert) as u64
    }

    /// q, k and v of a layer in one parallel region. The input is quantised once for each distinct
    /// activation format among the three (llama.cpp's mixes can give them different weight types).
    fn project_qkv(&self, l: &Layer, h: &[f32], n: usize, q: &mut [f32], k: &mut [f32], v: &mut [f32]) -> Result<()> {
        let mats = [&l.wq, &l.wk, &l.wv];
        let mut acts: Vec<Activations> = Vec::new();
        let mut which = [0usize; 3];
        for (i, m) in mats.iter().enumerate() {
            let ty = m.ty.act_type();
            which[i] = match acts.iter().position(|a| a.act_type() == ty) {
                Some(p) => p,
                None => {
                    let mut a = Activations::new();
                    a.quantize(ty, h, n, m.cols)?;
                    acts.push(a);
                    acts.len() - 1
                }
            };
        }
        let w = &self.weights;
        matmul_many(&mut [
            MatmulJob { w: w.view(mats[0]), acts: &acts[which[0]], out: q },
            MatmulJob { w: w.view(mats[1]), acts: &acts[which[1]], out: k },
            MatmulJob { w: w.view(mats[2]), acts: &acts[which[2]], out: v },
        ])?;
        Ok(())
    }
}
