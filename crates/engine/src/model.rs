//! A loaded model and its forward pass: one layer is a short list of named steps, and those names are
//! the trace points.

mod deepseek4;
mod mtp;

use std::path::Path;
use std::sync::Arc;

use titan_gguf::GgufFile;
use titan_kernels::{matmul, matmul_many, Activations, MatmulJob};
use titan_tokenizer::Tokenizer;

use crate::attention::{attend, AttnShape, KvCache};
use crate::compressed::LayerState;
use crate::config::{llama4_attn_temp, Arch, Config, Mixer, QkNorm, RopeStyle};
use crate::delta_net::{self, DeltaScratch, DeltaState};
use crate::experts::{Experts, ResidentExperts};
use crate::latent::attend_latent;
use crate::memory::{Copy, Memory};
use crate::moe::{dense_ffn, moe_block, MoeScratch, RouteRule, Routing};
use crate::ops::{add, add_bias, rms_norm, rms_norm_into, rms_norm_unweighted, rope_angles, rope_head, sigmoid};
use crate::rows::{LocalRows, RowJob, Rows};
use crate::scratch::{recycle, slots};
use crate::stats::{Phase, Stats};
use crate::trace::Trace;
use crate::weights::{
    Attention, BetaAlpha, DeltaNet, Latent, LatentQuery, Mat, Mixing, Moe, Residency, Stacked, Weights,
};
use crate::{vocab, EngineError, Result};
use deepseek4::{HyperScratch, V4Scratch};

pub use mtp::MtpState;

pub struct Model {
    pub config: Config,
    pub weights: Arc<Weights>,
    pub tokenizer: Tokenizer,
    /// Where the experts are computed: in the model's own weights ([`ResidentExperts`]), or anywhere a
    /// replacement puts them (a store on disk, a cluster), through the one seam.
    pub experts: Box<dyn Experts>,
    /// Where the products split by output rows are computed (the projections, the LM head): here
    /// ([`LocalRows`]), or shared with a cluster's nodes.
    pub rows: Box<dyn Rows>,
    /// Time per phase and weight bytes read, over every forward pass so far.
    pub stats: Stats,
}

/// Which positions of a forward call need logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outputs {
    All,
    Last,
}

impl Model {
    /// Loads the model at `path` with every weight resident: read in place from the mapping, Q4_0/Q8_0/MXFP4
    /// matrices regrouped for the kernels.
    pub fn load(path: impl AsRef<Path>) -> Result<Model> {
        let (file, config, tokenizer) = Self::open(path)?;
        let mut weights = Weights::load(file, &config)?;
        weights.copy_out(Residency::All);
        let weights = Arc::new(weights);
        let experts = Box::new(ResidentExperts::new(weights.clone()));
        Ok(Model {
            config,
            weights,
            tokenizer,
            experts,
            rows: Box::new(LocalRows::default()),
            stats: Stats::default(),
        })
    }

    /// Loads a model whose experts come from elsewhere than its mapping: `experts` makes their source
    /// once the dense weights are in memory — copied out of the mapping, so that expert reads cannot push
    /// them out of the page cache, and read before whatever the source starts reading in the background.
    pub fn load_with_experts(
        path: impl AsRef<Path>,
        experts: impl FnOnce(&Weights) -> Result<Box<dyn Experts>>,
    ) -> Result<Model> {
        let (file, config, tokenizer) = Self::open(path)?;
        let mut weights = Weights::load(file, &config)?;
        weights.copy_out(Residency::Dense);
        let experts = experts(&weights)?;
        Ok(Model {
            config,
            weights: Arc::new(weights),
            tokenizer,
            experts,
            rows: Box::new(LocalRows::default()),
            stats: Stats::default(),
        })
    }

    fn open(path: impl AsRef<Path>) -> Result<(GgufFile, Config, Tokenizer)> {
        let file = GgufFile::open(path)?;
        let config = Config::from_gguf(&file)?;
        let tokenizer = vocab::tokenizer_from_gguf(&file)?;
        Ok((file, config, tokenizer))
    }

    /// A model's experts and nothing else, resident, for an expert node: only the expert tensors are
    /// copied or regrouped; the dense weights are never touched, so never paged in. Shapes are checked
    /// for every tensor, dense ones included: a node refuses a broken file.
    pub fn load_experts(path: impl AsRef<Path>) -> Result<(Config, ResidentExperts)> {
        let file = GgufFile::open(path)?;
        let config = Config::from_gguf(&file)?;
        let mut weights = Weights::load(file, &config)?;
        weights.copy_out(Residency::Experts);
        Ok((config, ResidentExperts::new(Arc::new(weights))))
    }

    /// Refuse a context longer than the model was trained for (unless `past_training`: its positions
    /// beyond that are the caller's risk), or whose KV cache would not fit in `memory` bytes, before
    /// anything is allocated for it. Callers that do not know the memory available pass `u64::MAX`: a KV
    /// cache is then checked only against what one allocation can be, and the figure is never printed.
    pub fn check_context(&self, n_ctx: usize, memory: u64, past_training: bool) -> Result<()> {
        let trained = self.config.n_ctx_train;
        if n_ctx == 0 || n_ctx > trained && !past_training {
            return Err(EngineError::Request(format!(
                "a context of {n_ctx} tokens is outside 1..={trained}, the model's training context"
            )));
        }
        let need = self.config.kv_bytes(n_ctx);
        let gib = |b: u128| b as f64 / (1u64 << 30) as f64;
        // More than isize::MAX bytes cannot be allocated, whatever the memory.
        if need > isize::MAX as u128 {
            return Err(EngineError::Request(format!(
                "a context of {n_ctx} tokens needs {:.1} GiB of KV cache, more than this machine can address",
                gib(need)
            )));
        }
        if need > memory as u128 {
            return Err(EngineError::Request(format!(
                "a context of {n_ctx} tokens needs {:.1} GiB of KV cache, more than the {:.1} GiB of memory available",
                gib(need),
                gib(memory as u128)
            )));
        }
        Ok(())
    }

    /// A new sequence of up to `n_ctx` positions.
    pub fn new_sequence(&self, n_ctx: usize) -> Sequence {
        let c = &self.config;
        let attends: Vec<bool> = c.mixers.iter().map(|&m| m == Mixer::Attention).collect();
        let delta = match c.delta_net {
            Some(s) => c
                .mixers
                .iter()
                .map(|&m| {
                    if m == Mixer::DeltaNet {
                        DeltaState::new(&s)
                    } else {
                        DeltaState::default()
                    }
                })
                .collect(),
            None => Vec::new(),
        };
        // DeepSeek-V4's compressed layers keep their entries; its keys are its values
        let compressed = c.v4.as_ref().map_or(Vec::new(), |v| {
            v.ratios
                .iter()
                .map(|&r| LayerState::new(r, c.head_dim, v.idx_dim, n_ctx))
                .collect()
        });
        let values = c.mla.is_none() && c.v4.is_none();
        Sequence {
            mem: Memory::new(KvCache::new(&attends, n_ctx, c.kv_dim(), values), delta, compressed),
            scratch: Scratch::default(),
        }
    }

    /// Run `tokens` at positions pos0.. of `seq` through the model, appending their keys and values to its
    /// cache. Returns logits (n_vocab per requested position, in order), valid until `seq`'s next call.
    pub fn forward<'s>(
        &self,
        tokens: &[u32],
        pos0: usize,
        seq: &'s mut Sequence,
        outputs: Outputs,
    ) -> Result<&'s [f32]> {
        self.forward_traced(tokens, pos0, seq, outputs, None)
    }

    /// [`Model::forward`], recording each named step into `trace` when one is given (one branch per
    /// step when it is not).
    pub fn forward_traced<'s>(
        &self,
        tokens: &[u32],
        pos0: usize,
        seq: &'s mut Sequence,
        outputs: Outputs,
        trace: Option<&mut Trace>,
    ) -> Result<&'s [f32]> {
        let Sequence { mem, scratch } = seq;
        self.step(
            &mut [Part {
                tokens,
                pos0,
                mem,
                outputs,
            }],
            scratch,
            trace,
        )?;
        Ok(&scratch.logits)
    }

    /// One forward step over several sequences at once (continuous batching): each span's tokens at its
    /// own positions of its own sequence. Returns the logits every span asked for, span after span (one
    /// row per position of an `All` span, one for a `Last` span), valid until `batch`'s next use.
    ///
    /// Attention and RoPE are computed per span, everything else on all rows together, so experts chosen
    /// by several sequences are read once for all of them. Every step is row-independent, so a
    /// sequence's logits are the same bits whether it runs alone or beside others.
    pub fn forward_batch<'b>(&self, spans: &mut [Span<'_>], batch: &'b mut Batch) -> Result<&'b [f32]> {
        let mut parts: Vec<Part<'_>> = spans
            .iter_mut()
            .map(|s| Part {
                tokens: s.tokens,
                pos0: s.pos0,
                mem: &mut s.seq.mem,
                outputs: s.outputs,
            })
            .collect();
        self.step(&mut parts, &mut batch.scratch, None)?;
        Ok(&batch.scratch.logits)
    }

    /// The forward pass of `parts`, rows concatenated in order; the requested logits into `s.logits`.
    fn step(&self, parts: &mut [Part<'_>], s: &mut Scratch, mut trace: Option<&mut Trace>) -> Result<()> {
        let c = &self.config;
        if parts.is_empty() {
            return Err(EngineError::Request("forward was given no tokens".into()));
        }
        for p in parts.iter() {
            if p.tokens.is_empty() {
                return Err(EngineError::Request("forward was given no tokens".into()));
            }
            if p.pos0.saturating_add(p.tokens.len()) > p.mem.kv.n_ctx() {
                return Err(EngineError::ContextFull {
                    ctx: p.mem.kv.n_ctx(),
                    need: p.pos0.saturating_add(p.tokens.len()),
                });
            }
            // A recurrent state holds every position so far and cannot go back: a call continues where the
            // last one ended, or starts the sequence over at 0.
            if !p.mem.delta.is_empty() && p.pos0 != 0 && p.pos0 != p.mem.next {
                return Err(EngineError::Request(format!(
                    "this model's linear-attention state cannot move to position {}: the sequence continues at {} (or restarts at 0)",
                    p.pos0, p.mem.next
                )));
            }
            if let Some(&t) = p.tokens.iter().find(|&&t| t as usize >= c.n_vocab) {
                return Err(EngineError::BadToken {
                    id: t,
                    vocab: c.n_vocab,
                });
            }
        }
        let n: usize = parts.iter().map(|p| p.tokens.len()).sum();
        let d = c.n_embd;
        let w = &self.weights;

        for p in parts.iter_mut() {
            if p.pos0 == 0 {
                p.mem.restart();
            }
            // Until this step completes, only a restart at 0 is valid.
            p.mem.next = usize::MAX;
        }
        s.size_for(c, n);
        // token_embd: one (dequantised) row per token.
        let embd = w.view(&w.token_embd);
        for (row, &t) in s.x.chunks_exact_mut(d).zip(parts.iter().flat_map(|p| p.tokens)) {
            embd.dequantize_row(t as usize, row);
        }
        self.angles(parts.iter().flat_map(|p| p.pos0..p.pos0 + p.tokens.len()), s);
        s.tokens.clear();
        s.tokens.extend(parts.iter().flat_map(|p| p.tokens));
        let streams = self.streams();
        if let Some(st) = &streams {
            st.spread(&s.x, &mut s.hyper.streams);
        }

        for il in 0..c.n_layer {
            self.layer(il, parts, s, trace.as_deref_mut())?;
        }
        // the head's collapse of the streams
        if let (Some(st), Some(head)) = (&streams, &w.hyper_head) {
            st.head(head, &s.hyper.streams, &mut s.hyper.mix, &mut s.x);
        }

        for p in parts.iter_mut() {
            p.mem.next = p.pos0 + p.tokens.len();
        }
        let Scratch { x, h, acts, logits, .. } = s;
        let stats = &self.stats;

        // output_norm and the LM head, for the requested rows only.
        h.clear();
        let mut row = 0;
        for p in parts.iter() {
            let end = row + p.tokens.len();
            let first = match p.outputs {
                Outputs::All => row,
                Outputs::Last => end - 1,
            };
            h.extend_from_slice(&x[first * d..end * d]);
            row = end;
        }
        let rows = h.len() / d;
        logits.resize(rows * c.n_vocab, 0.0);
        stats.time(Phase::Head, || -> Result<()> {
            rms_norm(h, &w.output_norm, c.rms_eps);
            acts.quantize(w.output.ty.act_type(), h, rows, d)?;
            let mut head = [RowJob {
                w: w.output,
                input: acts,
                out: &mut logits[..],
            }];
            self.rows.matmul_many(w, &mut head)?;
            Ok(())
        })?;
        stats.add_bytes((w.output.bytes() + n * w.token_embd.row_bytes()) as u64);
        if let Some(t) = trace {
            t.tensor(None, "logits", &[rows, c.n_vocab], logits);
        }
        Ok(())
    }

    /// RoPE angles of each row's position, once for all layers.
    fn angles(&self, positions: impl Iterator<Item = usize>, s: &mut Scratch) {
        let c = &self.config;
        let half = c.rope_dims / 2;
        for ((cs, sn), pos) in s
            .cos
            .chunks_exact_mut(half)
            .zip(s.sin.chunks_exact_mut(half))
            .zip(positions)
        {
            let scaling = (c.yarn.as_ref(), self.weights.rope_freqs.as_deref());
            rope_angles(pos, c.rope_dims, c.rope_base, scaling, cs, sn);
        }
    }

    /// Block `il` over the rows of `s.x` (the residual stream), in place: its token mixer, then its
    /// feed-forward (dense, or the router and experts).
    fn layer(&self, il: usize, parts: &mut [Part<'_>], s: &mut Scratch, mut trace: Option<&mut Trace>) -> Result<()> {
        if let Some(sites) = &self.weights.layers[il].hyper {
            return self.hyper_layer(il, sites, parts, s, trace);
        }
        self.mix(il, parts, s, trace.as_deref_mut())?;
        self.feed_forward(il, s, trace)
    }

    /// The token mixer of block `il` over the rows of `s.x`, added to them: attention (which writes the
    /// rows' keys and values into each part's cache) or linear attention.
    fn mix(&self, il: usize, parts: &mut [Part<'_>], s: &mut Scratch, mut trace: Option<&mut Trace>) -> Result<()> {
        let (c, w, stats) = (&self.config, &self.weights, &self.stats);
        let l = &w.layers[il];
        let d = c.n_embd;
        let n = s.x.len() / d;
        let Scratch {
            x,
            h,
            attn_out,
            cos,
            sin,
            mixer,
            ..
        } = s;
        if let Some(t) = trace.as_deref_mut() {
            t.tensor(Some(il), "layer_in", &[n, d], x);
        }
        stats.time(Phase::Attention, || -> Result<()> {
            // attn_norm, then attention or linear attention into attn_out
            rms_norm_into(x, &l.attn_norm, c.rms_eps, h);
            match &l.mixing {
                Mixing::Attention(a) => self.attention(a, il, parts, h, (cos, sin), mixer, attn_out),
                Mixing::DeltaNet(dn) => self.linear_attention(dn, il, parts, h, mixer, attn_out),
                Mixing::Latent(a) => self.latent_attention(a, il, parts, h, (cos, sin), mixer, attn_out),
                Mixing::V4(a) => self.v4_attention(a, il, parts, h, (cos, sin), mixer, attn_out),
            }
        })?;
        if let Some(t) = trace {
            t.tensor(Some(il), "attn_out", &[n, d], attn_out);
        }
        add(x, attn_out);
        Ok(())
    }

    /// The feed-forward of block `il` over the rows of `s.x`, added to them.
    fn feed_forward(&self, il: usize, s: &mut Scratch, mut trace: Option<&mut Trace>) -> Result<()> {
        let (c, w, stats) = (&self.config, &self.weights, &self.stats);
        let l = &w.layers[il];
        let d = c.n_embd;
        let n = s.x.len() / d;
        let Scratch {
            x,
            route,
            next,
            moe,
            tokens,
            ..
        } = s;
        let Some(experts) = &l.moe else {
            // ffn_norm, then a dense layer's feed-forward
            stats.time(Phase::Experts, || -> Result<()> {
                rms_norm_into(x, &l.ffn_norm, c.rms_eps, &mut route.h);
                dense_ffn(
                    w,
                    l.shared.as_ref().expect("a dense layer has its feed-forward"),
                    &route.h,
                    d,
                    moe,
                )
            })?;
            stats.add_bytes(self.layer_bytes(il, 0));
            if let Some(t) = trace.as_deref_mut() {
                t.tensor(Some(il), "ffn_out", &[n, d], moe.out());
            }
            add(x, moe.out());
            return Ok(());
        };
        // ffn_norm, router, experts
        stats.time(Phase::Router, || self.route_layer(il, experts, x, tokens, route))?;
        self.hint_next(il, x, tokens, next)?;
        let experts_run = stats.time(Phase::Experts, || {
            moe_block(w, self.experts.as_ref(), c, il, &route.h, &route.routing, moe)
        })?;
        stats.add_bytes(self.layer_bytes(il, experts_run));
        stats.add_experts(experts_run as u64);
        let moe_out = moe.out();
        if let Some(t) = trace {
            let (k, routing) = (route.routing.k, &route.routing);
            t.tensor(Some(il), "router_logits", &[n, c.n_expert], &route.logits);
            t.decision(Some(il), "topk_ids", &[n, k], &routing.ids);
            t.tensor(Some(il), "topk_weights", &[n, k], &routing.weights);
            t.tensor(Some(il), "moe_out", &[n, d], moe_out);
        }
        add(x, moe_out);
        Ok(())
    }

    /// How layer `il` chooses and weighs its experts.
    pub fn route_rule(&self, il: usize) -> RouteRule<'_> {
        let c = &self.config;
        let moe = self.weights.layers[il].moe.as_ref();
        RouteRule {
            n_expert: c.n_expert,
            k: c.n_expert_used,
            scores: c.scores,
            table: moe.and_then(|m| m.token_table.as_deref()),
            bias: moe.and_then(|m| m.choice_bias.as_deref()),
            groups: c.expert_groups,
            groups_used: c.expert_groups_used,
            norm: c.norm_topk,
            scale: c.expert_weights_scale,
            softmax_chosen: c.softmax_chosen,
            by_logits: c.softmax_chosen || c.weigh_input,
        }
    }

    /// The routing of layer `il` (whose experts are `m`) for the residual stream `x` (of the rows' `tokens`),
    /// into `r`.
    fn route_layer(&self, il: usize, m: &Moe, x: &[f32], tokens: &[u32], r: &mut Route) -> Result<()> {
        let c = &self.config;
        let rows = x.len() / c.n_embd;
        rms_norm_into(x, &self.weights.layers[il].ffn_norm, c.rms_eps, &mut r.h);
        r.acts.quantize(m.router.ty.act_type(), &r.h, rows, c.n_embd)?;
        r.logits.resize(rows * c.n_expert, 0.0);
        matmul(&self.weights.view(&m.router), &r.acts, &mut r.logits)?;
        if let Some(b) = &m.router_bias {
            add_bias(&mut r.logits, b);
        }
        r.routing.route(&r.logits, tokens, &self.route_rule(il));
        Ok(())
    }

    /// Tell the expert source which experts layer `il + 1` will probably choose, if it wants to know
    /// (a source that streams experts reads them ahead): that layer's router applied to the current
    /// residual stream, which the next layer only changes by its attention output, routed into `r`. Not
    /// computed for a source that would not use it (the f32 router kernel of both passes is 3.4% of a
    /// steady-state profile of Qwen3-30B-A3B on the 2-core Zen 3 EPYC).
    fn hint_next(&self, il: usize, x: &[f32], tokens: &[u32], r: &mut Route) -> Result<()> {
        // Not into an MTP block: the main pass never runs it.
        let main = il + 1 < self.config.n_layer;
        let Some(Some(next)) = self.weights.layers.get(il + 1).filter(|_| main).map(|l| l.moe.as_ref()) else {
            return Ok(());
        };
        if !self.experts.wants_hints(il + 1) {
            return Ok(());
        }
        self.route_layer(il + 1, next, x, tokens, r)?;
        let ids = &mut r.routing.ids;
        ids.sort_unstable();
        ids.dedup();
        self.experts.hint(il + 1, ids)
    }

    /// Weight bytes one layer reads for a batch: its dense matrices once, each of the `experts` distinct
    /// chosen experts once.
    fn layer_bytes(&self, il: usize, experts: usize) -> u64 {
        let l = &self.weights.layers[il];
        let mixing = match &l.mixing {
            Mixing::Attention(a) => [a.wq, a.wk, a.wv, a.wo].iter().map(Mat::bytes).sum::<usize>(),
            Mixing::Latent(a) => {
                let q = match &a.q {
                    LatentQuery::Direct(wq) => wq.bytes(),
                    LatentQuery::Compressed { a, b, .. } => a.bytes() + b.bytes(),
                };
                q + a.kv_a.bytes() + a.k_b.mat.bytes() * a.k_b.n + a.v_b.mat.bytes() * a.v_b.n + a.wo.bytes()
            }
            Mixing::DeltaNet(dn) => {
                let gates = match dn.beta_alpha {
                    BetaAlpha::Apart { beta, alpha } => beta.bytes() + alpha.bytes(),
                    BetaAlpha::Joint(ba) => ba.bytes(),
                };
                [dn.qkv, dn.z, dn.out].iter().map(Mat::bytes).sum::<usize>() + gates
            }
            Mixing::V4(a) => {
                let compressor = a.compressor.iter().flat_map(|cm| [cm.kv, cm.gate]);
                let indexer = a
                    .indexer
                    .iter()
                    .flat_map(|ix| [ix.q_b, ix.proj, ix.compressor.kv, ix.compressor.gate]);
                [a.q_a, a.q_b, a.kv, a.wo_b]
                    .into_iter()
                    .chain(compressor)
                    .chain(indexer)
                    .map(|m| m.bytes())
                    .sum::<usize>()
                    + a.wo_a.mat.bytes() * a.wo_a.n
            }
        };
        let mut dense = mixing + l.moe.as_ref().map_or(0, |m| m.router.bytes());
        if let Some(sh) = &l.shared {
            dense += sh.gate.bytes() + sh.up.bytes() + sh.down.bytes();
        }
        let expert = l
            .moe
            .as_ref()
            .map_or(0, |m| m.gate.mat.bytes() + m.up.mat.bytes() + m.down.mat.bytes());
        (dense + experts * expert) as u64
    }

    /// Softmax attention of layer `il` over the rows of `h` (the normalised residual stream), into `out`:
    /// q, k, v, their norms and RoPE on all rows, attention of each span over its own cache, the output
    /// gate where the architecture has one, then attn_output on all rows.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        a: &Attention,
        il: usize,
        parts: &mut [Part<'_>],
        h: &[f32],
        (cos, sin): (&[f32], &[f32]),
        m: &mut MixerScratch,
        out: &mut [f32],
    ) -> Result<()> {
        let c = &self.config;
        let (n, q_dim, kv_dim, half) = (h.len() / c.n_embd, c.q_dim(), c.kv_dim(), c.rope_dims / 2);
        let MixerScratch {
            qg,
            q,
            k,
            v,
            gate,
            attn,
            scores,
            proj_acts,
            jobs,
            acts,
            ..
        } = m;
        // q, k, v: one parallel region, the normalised input quantised once per activation format
        if c.attn_gate {
            // each head's queries, then as many gate values
            self.project(h, &[&a.wq, &a.wk, &a.wv], proj_acts, jobs, &mut [qg, k, v])?;
            let hd = c.head_dim;
            q.resize(n * q_dim, 0.0);
            gate.resize(n * q_dim, 0.0);
            for (head, (qh, gh)) in qg
                .chunks_exact(2 * hd)
                .zip(q.chunks_exact_mut(hd).zip(gate.chunks_exact_mut(hd)))
            {
                qh.copy_from_slice(&head[..hd]);
                gh.copy_from_slice(&head[hd..]);
            }
        } else {
            self.project(h, &[&a.wq, &a.wk, &a.wv], proj_acts, jobs, &mut [q, k, v])?;
        }
        if let (Some(bq), Some(bk), Some(bv)) = (&a.bq, &a.bk, &a.bv) {
            add_bias(q, bq);
            add_bias(k, bk);
            add_bias(v, bv);
        }
        // q_norm, k_norm: per head (weight of head_dim) or over all heads (weight of q_dim), by the weight's length
        if let (Some(qn), Some(kn)) = (&a.q_norm, &a.k_norm) {
            rms_norm(q, qn, c.rms_eps);
            rms_norm(k, kn, c.rms_eps);
        }
        // rope, except on Llama 4's NoPE layers
        // (an MTP block, past the main layers, has RoPE)
        let rope = c.nope.get(il) != Some(&true);
        let halves = c.rope_style == RopeStyle::Halves;
        for i in (0..n).filter(|_| rope) {
            let (cs, sn) = (&cos[i * half..(i + 1) * half], &sin[i * half..(i + 1) * half]);
            for head in q[i * q_dim..(i + 1) * q_dim].chunks_exact_mut(c.head_dim) {
                rope_head(&mut head[..c.rope_dims], cs, sn, halves);
            }
            for head in k[i * kv_dim..(i + 1) * kv_dim].chunks_exact_mut(c.head_dim) {
                rope_head(&mut head[..c.rope_dims], cs, sn, halves);
            }
        }
        // Llama 4's q/k norms: after RoPE, without a weight, on the layers with RoPE only
        if rope && c.qk_norm == QkNorm::Unweighted {
            rms_norm_unweighted(q, c.head_dim, c.rms_eps);
            rms_norm_unweighted(k, c.head_dim, c.rms_eps);
        }
        // attention of each span over its own cache
        let window = if c.sliding.get(il) == Some(&true) {
            c.sliding_window
        } else {
            0
        };
        let shape = AttnShape {
            n_head: c.n_head,
            n_head_kv: c.n_head_kv,
            head_dim: c.head_dim,
            window,
            chunk: if c.chunked.get(il) == Some(&true) { c.chunk } else { 0 },
            sinks: a.sinks.as_deref(),
        };
        // Llama 4's NoPE layers scale each query by the attention temperature of its position
        let temperature = !rope && c.arch == Arch::Llama4;
        let mut row = 0;
        for p in parts.iter_mut() {
            let rows = row..row + p.tokens.len();
            if temperature {
                let span = q[rows.start * q_dim..rows.end * q_dim].chunks_exact_mut(q_dim);
                for (pos, qr) in (p.pos0..).zip(span) {
                    let t = llama4_attn_temp(pos);
                    qr.iter_mut().for_each(|v| *v *= t);
                }
            }
            p.mem.kv.store(
                il,
                p.pos0,
                &k[rows.start * kv_dim..rows.end * kv_dim],
                &v[rows.start * kv_dim..rows.end * kv_dim],
            );
            attend(
                &p.mem.kv,
                il,
                &shape,
                p.pos0,
                &q[rows.start * q_dim..rows.end * q_dim],
                &mut attn[rows.start * q_dim..rows.end * q_dim],
                scores,
            );
            row = rows.end;
        }
        // attn_gate: attention · sigmoid(gate)
        if c.attn_gate {
            for (o, &g) in attn.iter_mut().zip(gate.iter()) {
                *o *= sigmoid(g);
            }
        }
        // attn_output on all rows
        acts.quantize(a.wo.ty.act_type(), attn, n, q_dim)?;
        matmul(&self.weights.view(&a.wo), acts, out)?;
        if let Some(bo) = &a.bo {
            add_bias(out, bo);
        }
        Ok(())
    }

    /// Multi-head latent attention of layer `il` over the rows of `h`, into `out` (see `latent.rs`): the
    /// query (directly or through its compression), the latent vector and the key's RoPE part on all rows;
    /// each head's query absorbed into the latent space; attention of each span over its own cache; each
    /// head's value out of the latent space; attn_output on all rows.
    #[allow(clippy::too_many_arguments)]
    fn latent_attention(
        &self,
        a: &Latent,
        il: usize,
        parts: &mut [Part<'_>],
        h: &[f32],
        (cos, sin): (&[f32], &[f32]),
        m: &mut MixerScratch,
        out: &mut [f32],
    ) -> Result<()> {
        let c = &self.config;
        let s = c.mla.expect("latent attention has its shape");
        let (n, nh, half) = (h.len() / c.n_embd, c.n_head, c.rope_dims / 2);
        let (qd, width) = (s.nope + s.rope, s.kv_lora + s.rope);
        let MixerScratch {
            q,
            k,
            qg,
            gate,
            scores,
            proj_acts,
            jobs,
            acts,
            heads,
            ..
        } = m;
        // q: n × nh × (nope + rope); k: n × (kv_lora + rope), the latent vector then the key's RoPE part.
        match &a.q {
            LatentQuery::Direct(wq) => self.project(h, &[wq, &a.kv_a], proj_acts, jobs, &mut [q, k])?,
            LatentQuery::Compressed { a: wqa, norm, b } => {
                self.project(h, &[wqa, &a.kv_a], proj_acts, jobs, &mut [qg, k])?;
                rms_norm(qg, norm, c.rms_eps);
                self.project(qg, &[b], proj_acts, jobs, &mut [q])?;
            }
        }
        let halves = c.rope_style == RopeStyle::Halves;
        for (i, row) in k.chunks_exact_mut(width).enumerate() {
            let (cs, sn) = (&cos[i * half..(i + 1) * half], &sin[i * half..(i + 1) * half]);
            rope_head(&mut row[s.kv_lora..], cs, sn, halves);
            rms_norm(&mut row[..s.kv_lora], &a.kv_norm, c.rms_eps);
        }
        // Each head's query: the non-RoPE part through attn_k_b into the latent space, then the RoPE part.
        // `gate` holds the full queries, n × nh × width.
        gate.resize(n * nh * width, 0.0);
        self.per_head(&a.k_b, (q, qd, s.nope), (gate, width), heads)?;
        for (i, (row, qrow)) in gate
            .chunks_exact_mut(nh * width)
            .zip(q.chunks_exact_mut(nh * qd))
            .enumerate()
        {
            let (cs, sn) = (&cos[i * half..(i + 1) * half], &sin[i * half..(i + 1) * half]);
            for (head, qh) in row.chunks_exact_mut(width).zip(qrow.chunks_exact_mut(qd)) {
                rope_head(&mut qh[s.nope..], cs, sn, halves);
                head[s.kv_lora..].copy_from_slice(&qh[s.nope..]);
            }
        }
        // attention of each span over its own cache, in the latent space: n × nh × kv_lora into `qg`
        let scale = c.attn_scale();
        qg.resize(n * nh * s.kv_lora, 0.0);
        let mut row = 0;
        for p in parts.iter_mut() {
            let rows = row..row + p.tokens.len();
            p.mem
                .kv
                .store(il, p.pos0, &k[rows.start * width..rows.end * width], &[]);
            let (qs, os) = (
                &gate[rows.start * nh * width..rows.end * nh * width],
                &mut qg[rows.start * nh * s.kv_lora..rows.end * nh * s.kv_lora],
            );
            attend_latent(&p.mem.kv, il, nh, s.kv_lora, scale, p.pos0, qs, os, scores);
            row = rows.end;
        }
        // each head's value through attn_v_b, into n × nh × v_dim, then attn_output
        q.resize(n * nh * s.v_dim, 0.0);
        self.per_head(&a.v_b, (qg, s.kv_lora, s.kv_lora), (q, s.v_dim), heads)?;
        acts.quantize(a.wo.ty.act_type(), q, n, nh * s.v_dim)?;
        matmul(&self.weights.view(&a.wo), acts, out)?;
        Ok(())
    }

    /// Each head's own matrix of `w` (one per head, stacked) applied to that head's part of every row, in
    /// one parallel region: `input` is (rows of heads × `stride` floats, of which the first `len` are the
    /// head's input); each head's output goes to the first floats of its `out_stride` in `out`'s rows.
    fn per_head(
        &self,
        w: &Stacked,
        (input, stride, len): (&[f32], usize, usize),
        (out, out_stride): (&mut [f32], usize),
        s: &mut HeadScratch,
    ) -> Result<()> {
        let nh = w.n;
        let rows = input.len() / (nh * stride);
        let HeadScratch {
            gathered,
            acts,
            outs,
            jobs,
        } = s;
        let (acts, outs) = (slots(acts, nh), slots(outs, nh));
        for (hd, a) in acts.iter_mut().enumerate() {
            gathered.clear();
            gathered.extend(
                input
                    .chunks_exact(nh * stride)
                    .flat_map(|row| &row[hd * stride..hd * stride + len]),
            );
            a.quantize(w.mat.ty.act_type(), gathered, rows, len)?;
        }
        let mut list: Vec<MatmulJob> = recycle(std::mem::take(jobs));
        list.extend(acts.iter().zip(outs.iter_mut()).enumerate().map(|(hd, (a, o))| {
            o.resize(rows * w.mat.rows, 0.0);
            MatmulJob {
                w: self.weights.view(&w.expert(hd)),
                acts: a,
                out: &mut o[..],
            }
        }));
        let r = matmul_many(&mut list);
        *jobs = recycle(list);
        r?;
        let d = w.mat.rows;
        for (i, row) in out.chunks_exact_mut(nh * out_stride).enumerate() {
            for (hd, o) in outs.iter().enumerate() {
                row[hd * out_stride..hd * out_stride + d].copy_from_slice(&o[i * d..(i + 1) * d]);
            }
        }
        Ok(())
    }

    /// Gated DeltaNet of layer `il` over the rows of `h`, into `out`: the projections on all rows, the
    /// convolution and the recurrence per span over its own state, then ssm_out on all rows.
    fn linear_attention(
        &self,
        dn: &DeltaNet,
        il: usize,
        parts: &mut [Part<'_>],
        h: &[f32],
        m: &mut MixerScratch,
        out: &mut [f32],
    ) -> Result<()> {
        let c = &self.config;
        let s = c.delta_net.as_ref().expect("a linear-attention layer has its shape");
        let n = h.len() / c.n_embd;
        let (cd, vd, nv) = (s.conv_dim(), s.value_dim(), s.n_v_heads);
        let MixerScratch {
            qkv,
            z,
            beta,
            alpha,
            ba,
            y,
            proj_acts,
            jobs,
            acts,
            delta,
            ..
        } = m;
        qkv.resize(n * cd, 0.0);
        z.resize(n * vd, 0.0);
        beta.resize(n * nv, 0.0);
        alpha.resize(n * nv, 0.0);
        y.resize(n * vd, 0.0);
        match &dn.beta_alpha {
            BetaAlpha::Apart { beta: wb, alpha: wa } => {
                self.project(
                    h,
                    &[&dn.qkv, &dn.z, wb, wa],
                    proj_acts,
                    jobs,
                    &mut [qkv, z, beta, alpha],
                )?;
                delta_net::gates(s, dn, None, beta, alpha);
            }
            BetaAlpha::Joint(wba) => {
                ba.resize(n * 2 * nv, 0.0);
                self.project(h, &[&dn.qkv, &dn.z, wba], proj_acts, jobs, &mut [qkv, z, ba])?;
                delta_net::gates(s, dn, Some(ba), beta, alpha);
            }
        }
        let mut row = 0;
        for p in parts.iter_mut() {
            let rows = row..row + p.tokens.len();
            let span = |w: usize| rows.start * w..rows.end * w;
            let (rq, rz, rg, ry) = (span(cd), span(vd), span(nv), span(vd));
            delta_net::mix(
                s,
                dn,
                c.rms_eps,
                &mut p.mem.delta[il],
                &mut qkv[rq],
                &z[rz],
                &beta[rg.clone()],
                &alpha[rg],
                &mut y[ry],
                delta,
            );
            row = rows.end;
        }
        acts.quantize(dn.out.ty.act_type(), y, n, vd)?;
        matmul(&self.weights.view(&dn.out), acts, out)?;
        Ok(())
    }

    /// The projections `mats` of the rows of `h` into `outs`, in one parallel region. The input is
    /// quantised once for each distinct activation format among them (llama.cpp's mixes can give them
    /// different weight types), into the first entries of `acts`.
    fn project(
        &self,
        h: &[f32],
        mats: &[&Mat],
        acts: &mut Vec<Activations>,
        jobs: &mut Vec<RowJob<'static>>,
        outs: &mut [&mut Vec<f32>],
    ) -> Result<()> {
        let rows = h.len() / mats[0].cols;
        let mut which = [0usize; 4];
        let mut formats = 0;
        for (i, m) in mats.iter().enumerate() {
            let ty = m.ty.act_type();
            which[i] = match acts[..formats].iter().position(|a| a.act_type() == ty) {
                Some(p) => p,
                None => {
                    slots(acts, formats + 1)[formats].quantize(ty, h, rows, m.cols)?;
                    formats += 1;
                    formats - 1
                }
            };
        }
        let mut list: Vec<RowJob> = recycle(std::mem::take(jobs));
        list.extend(mats.iter().zip(outs.iter_mut()).enumerate().map(|(i, (m, out))| {
            out.resize(rows * m.rows, 0.0);
            RowJob {
                w: **m,
                input: &acts[which[i]],
                out: &mut out[..],
            }
        }));
        let r = self.stats.time_inside(Phase::Projections, Phase::Attention, || {
            self.rows.matmul_many(&self.weights, &mut list)
        });
        *jobs = recycle(list);
        r
    }
}

/// One sequence's share of a [`Model::forward_batch`] step: its new tokens, at positions pos0.., and
/// which of their logits it wants.
pub struct Span<'s> {
    pub tokens: &'s [u32],
    pub pos0: usize,
    pub seq: &'s mut Sequence,
    pub outputs: Outputs,
}

/// What a step computes for one span: the span with its cache alone (the step's buffers are elsewhere).
struct Part<'s> {
    tokens: &'s [u32],
    pos0: usize,
    mem: &'s mut Memory,
    outputs: Outputs,
}

/// The working buffers of batched steps ([`Model::forward_batch`]), kept from one step to the next;
/// the sequences' own buffers stay unused.
#[derive(Default)]
pub struct Batch {
    scratch: Scratch,
}

impl Batch {
    /// The logits of its last step, as [`Model::forward_batch`] returned them.
    pub fn logits(&self) -> &[f32] {
        &self.scratch.logits
    }
}

/// One sequence's state between forward calls: its KV cache, and the forward pass's working buffers,
/// sized for the largest batch so far and reused, so that decoding a token allocates nothing.
pub struct Sequence {
    mem: Memory,
    scratch: Scratch,
}

impl Sequence {
    pub fn n_ctx(&self) -> usize {
        self.mem.kv.n_ctx()
    }

    /// Keep a copy of the recurrent state at the position the sequence has reached, for [`Sequence::truncate`]
    /// to come back to (it replaces the kept copy before). Nothing is kept, or needed, for a model without
    /// linear attention.
    pub fn checkpoint(&mut self) {
        self.mem.checkpoint(Copy::Kept);
    }

    /// [`Sequence::checkpoint`] into a second copy, for a speculative step to come back to if its drafts are
    /// rejected, leaving the kept one (a prompt's end) in place.
    pub fn checkpoint_step(&mut self) {
        self.mem.checkpoint(Copy::Step);
    }

    /// The most of the first `n` positions that [`Sequence::truncate`] can keep: all of those computed for
    /// a KV cache; for a recurrent state, only where it stands or where one of its copies
    /// ([`Sequence::checkpoint`], [`Sequence::checkpoint_step`]) was taken, else 0.
    pub fn reusable(&self, n: usize) -> usize {
        self.mem.reusable(n)
    }

    /// Keep the first `n` positions (as [`Sequence::reusable`] allows), so that the next call continues at
    /// `n` with the same bits as if the sequence had computed only those.
    pub fn truncate(&mut self, n: usize) -> Result<()> {
        self.mem.truncate(n)
    }
}

/// The working buffers of [`Model::forward`] (each step's output, named as in the forward pass).
#[derive(Default)]
struct Scratch {
    /// The residual stream.
    x: Vec<f32>,
    /// The normalised residual stream, input of attention and of the head.
    h: Vec<f32>,
    /// The token mixer's output (attention or linear attention).
    attn_out: Vec<f32>,
    /// RoPE angles of each position of the batch.
    cos: Vec<f32>,
    sin: Vec<f32>,
    mixer: MixerScratch,
    /// The quantised input of the head.
    acts: Activations,
    /// The layer's routing.
    route: Route,
    /// The next layer's predicted routing (prefetch only).
    next: Route,
    moe: MoeScratch,
    logits: Vec<f32>,
    /// The batch's tokens, row after row (routing by token).
    tokens: Vec<u32>,
    /// DeepSeek-V4's residual streams.
    hyper: HyperScratch,
}

impl Scratch {
    /// Size the per-row buffers for a batch of `n` rows (shrinking keeps the allocation).
    fn size_for(&mut self, c: &Config, n: usize) {
        let (d, q_dim, kv_dim, half) = (c.n_embd, c.q_dim(), c.kv_dim(), c.rope_dims / 2);
        let m = &mut self.mixer;
        let sizes = [
            (&mut self.x, d),
            (&mut m.q, q_dim),
            (&mut m.k, kv_dim),
            (&mut m.v, kv_dim),
            (&mut m.attn, q_dim),
            (&mut self.attn_out, d),
            (&mut self.cos, half),
            (&mut self.sin, half),
        ];
        for (buf, per_row) in sizes {
            buf.resize(n * per_row, 0.0);
        }
    }
}

/// The token mixers' working buffers.
#[derive(Default)]
struct MixerScratch {
    /// Gated attention's projection: each head's queries, then its gate values.
    qg: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    gate: Vec<f32>,
    attn: Vec<f32>,
    /// Attention's working space.
    scores: Vec<f32>,
    /// Linear attention's projections: the convolution's input, z, beta and alpha (or both in `ba`).
    qkv: Vec<f32>,
    z: Vec<f32>,
    beta: Vec<f32>,
    alpha: Vec<f32>,
    ba: Vec<f32>,
    /// Linear attention's output, before ssm_out.
    y: Vec<f32>,
    delta: DeltaScratch,
    /// The projections' input, quantised once per activation format.
    proj_acts: Vec<Activations>,
    /// The projections' products, kept empty between calls (see `scratch::recycle`).
    jobs: Vec<RowJob<'static>>,
    /// The quantised input of the output projection.
    acts: Activations,
    /// Latent attention's per-head products (and DeepSeek-V4's per-group ones).
    heads: HeadScratch,
    v4: V4Scratch,
}

/// The working buffers of [`Model::per_head`]: one head's input on the way, each head's quantised input
/// and output, and the matmul list (kept empty, see `scratch::recycle`).
#[derive(Default)]
struct HeadScratch {
    gathered: Vec<f32>,
    acts: Vec<Activations>,
    outs: Vec<Vec<f32>>,
    jobs: Vec<MatmulJob<'static>>,
}

/// A layer's routing of a batch and what it is computed from.
#[derive(Default)]
struct Route {
    /// The normalised residual stream (ffn_norm), also the experts' input.
    h: Vec<f32>,
    /// `h` quantised for the router.
    acts: Activations,
    logits: Vec<f32>,
    routing: Routing,
}
