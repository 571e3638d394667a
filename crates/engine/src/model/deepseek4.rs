//! DeepSeek-V4's block (docs/deepseek4.md): the mixer and the feed-forward each between a collapse and an
//! expansion of the hyper-connection streams, and its attention — q-LoRA queries, one vector per position
//! that is both key and value, a sliding window of raw positions plus compressed entries (chosen by the
//! lightning indexer at ratio 4), sinks, de-rotated outputs and a grouped output projection.

use rayon::prelude::*;
use titan_kernels::{dot_f32, matmul};

use super::{MixerScratch, Model, Part, Scratch};
use crate::attention::softmax_with_sink;
use crate::compressed::{choose, rope_tail};
use crate::hyper::{SiteMix, Streams};
use crate::ops::{rms_norm, rms_norm_unweighted, rope_angles};
use crate::trace::Trace;
use crate::weights::{Hyper, V4Attention};
use crate::Result;

/// The residual streams of a step and one site's mixing numbers.
#[derive(Default)]
pub(super) struct HyperScratch {
    pub streams: Vec<f32>,
    pub mix: SiteMix,
}

/// The attention's working buffers, named as in docs/deepseek4.md.
#[derive(Default)]
pub(super) struct V4Scratch {
    /// The q-LoRA vector, the key-value vector, the compressor's values and scores.
    qr: Vec<f32>,
    kv: Vec<f32>,
    comp_kv: Vec<f32>,
    comp_gate: Vec<f32>,
    /// The indexer's compressor values and scores, its head weights and its queries.
    idx_kv: Vec<f32>,
    idx_gate: Vec<f32>,
    idx_w: Vec<f32>,
    idx_q: Vec<f32>,
    /// The compressed layers' angles of each row, and of an entry's position.
    cos: Vec<f32>,
    sin: Vec<f32>,
    entry_cos: Vec<f32>,
    entry_sin: Vec<f32>,
    /// Each row's working space for its attention.
    rows: Vec<RowScratch>,
    /// The groups' projections, before `attn_output_b`.
    grouped: Vec<f32>,
}

impl Model {
    /// The hyper-connections' constants, for a model that has them.
    pub(super) fn streams(&self) -> Option<Streams> {
        let c = &self.config;
        c.v4.as_ref().map(|v| Streams {
            hc: v.hc,
            n_embd: c.n_embd,
            rms_eps: c.rms_eps,
            eps: v.hc_eps,
            sinkhorn_iters: v.sinkhorn_iters,
        })
    }

    /// Block `il` over the streams of `s.hyper`: each site collapses them into `s.x`, runs as in any other
    /// block (which leaves its output in `s.attn_out` / the experts' output), and writes that output back
    /// into the streams. The sum the sites leave in `s.x` is not used.
    pub(super) fn hyper_layer(
        &self,
        il: usize,
        sites: &[Hyper; 2],
        parts: &mut [Part<'_>],
        s: &mut Scratch,
        mut trace: Option<&mut Trace>,
    ) -> Result<()> {
        let st = self.streams().expect("a hyper-connected layer has its streams");
        st.collapse(&sites[0], &s.hyper.streams, &mut s.hyper.mix, &mut s.x);
        self.mix(il, parts, s, trace.as_deref_mut())?;
        st.expand(&mut s.hyper.mix, &s.attn_out, &mut s.hyper.streams);
        st.collapse(&sites[1], &s.hyper.streams, &mut s.hyper.mix, &mut s.x);
        self.feed_forward(il, s, trace)?;
        st.expand(&mut s.hyper.mix, s.moe.out(), &mut s.hyper.streams);
        Ok(())
    }

    /// DeepSeek-V4 attention of layer `il` over the rows of `h` (the normalised collapsed streams), into
    /// `out`. `cos`/`sin` are the rows' angles at the uncompressed layers' base; compressed layers take
    /// their own (compress base, YaRN).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn v4_attention(
        &self,
        a: &V4Attention,
        il: usize,
        parts: &mut [Part<'_>],
        h: &[f32],
        (cos, sin): (&[f32], &[f32]),
        m: &mut MixerScratch,
        out: &mut [f32],
    ) -> Result<()> {
        let c = &self.config;
        let v = c.v4.as_ref().expect("a DeepSeek-V4 layer has its shape");
        let (n, d, eps) = (h.len() / c.n_embd, c.head_dim, c.rms_eps);
        let (half, q_dim) = (c.rope_dims / 2, c.q_dim());
        let ratio = v.ratios[il];
        let MixerScratch {
            q,
            attn,
            proj_acts,
            jobs,
            acts,
            heads,
            v4,
            ..
        } = m;
        let V4Scratch {
            qr,
            kv,
            comp_kv,
            comp_gate,
            idx_kv,
            idx_gate,
            idx_w,
            idx_q,
            cos: ccos,
            sin: csin,
            entry_cos,
            entry_sin,
            rows: row_scratch,
            grouped,
        } = v4;
        // the projections of the input, one parallel region each
        match &a.compressor {
            Some(cm) => self.project(
                h,
                &[&a.q_a, &a.kv, &cm.kv, &cm.gate],
                proj_acts,
                jobs,
                &mut [qr, kv, comp_kv, comp_gate],
            )?,
            None => self.project(h, &[&a.q_a, &a.kv], proj_acts, jobs, &mut [qr, kv])?,
        }
        if let Some(ix) = &a.indexer {
            let cm = &ix.compressor;
            self.project(
                h,
                &[&cm.kv, &cm.gate, &ix.proj],
                proj_acts,
                jobs,
                &mut [idx_kv, idx_gate, idx_w],
            )?;
            // both of the references' scales (D_I^-½ on the dot product, n_I^-½ on the weights) at once
            let scale = 1.0 / ((v.idx_dim * v.idx_heads) as f32).sqrt();
            idx_w.iter_mut().for_each(|w| *w *= scale);
        }
        rms_norm(qr, &a.q_a_norm, eps);
        rms_norm(kv, &a.kv_norm, eps);
        match &a.indexer {
            Some(ix) => self.project(qr, &[&a.q_b, &ix.q_b], proj_acts, jobs, &mut [q, idx_q])?,
            None => self.project(qr, &[&a.q_b], proj_acts, jobs, &mut [q])?,
        }
        rms_norm_unweighted(q, d, eps);
        // the compressed layers' angles of each row
        let compress_angles = |pos: usize, cs: &mut [f32], sn: &mut [f32]| {
            rope_angles(
                pos,
                c.rope_dims,
                v.compress_base,
                (v.compress_yarn.as_ref(), None),
                cs,
                sn,
            )
        };
        let (cos, sin): (&[f32], &[f32]) = if ratio == 0 {
            (cos, sin)
        } else {
            ccos.resize(n * half, 0.0);
            csin.resize(n * half, 0.0);
            let positions = parts.iter().flat_map(|p| p.pos0..p.pos0 + p.tokens.len());
            for ((cs, sn), pos) in ccos
                .chunks_exact_mut(half)
                .zip(csin.chunks_exact_mut(half))
                .zip(positions)
            {
                compress_angles(pos, cs, sn);
            }
            (ccos, csin)
        };
        for i in 0..n {
            let (cs, sn) = (&cos[i * half..(i + 1) * half], &sin[i * half..(i + 1) * half]);
            q[i * q_dim..(i + 1) * q_dim]
                .chunks_exact_mut(d)
                .for_each(|head| rope_tail(head, cs, sn));
            rope_tail(&mut kv[i * d..(i + 1) * d], cs, sn);
            if a.indexer.is_some() {
                let w = v.idx_heads * v.idx_dim;
                idx_q[i * w..(i + 1) * w]
                    .chunks_exact_mut(v.idx_dim)
                    .for_each(|head| rope_tail(head, cs, sn));
            }
        }

        // each span: its keys and its windows' entries into its memory, then its rows' attention
        attn.resize(n * q_dim, 0.0);
        let mut row = 0;
        for p in parts.iter_mut() {
            let rows = row..row + p.tokens.len();
            p.mem.kv.store(il, p.pos0, &kv[rows.start * d..rows.end * d], &[]);
            if let (Some(cm), Some(state)) = (&a.compressor, p.mem.compressed[il].as_mut()) {
                entry_cos.resize(half, 0.0);
                entry_sin.resize(half, 0.0);
                let mut rope = |pos: usize, entry: &mut [f32]| {
                    compress_angles(pos, entry_cos, entry_sin);
                    rope_tail(entry, entry_cos, entry_sin);
                };
                let w = comp_kv.len() / n;
                state.attn.push(
                    p.pos0,
                    (
                        &comp_kv[rows.start * w..rows.end * w],
                        &comp_gate[rows.start * w..rows.end * w],
                    ),
                    &cm.ape,
                    (&cm.norm, eps),
                    &mut rope,
                );
                if let (Some(ix), Some(index)) = (&a.indexer, state.index.as_mut()) {
                    let w = idx_kv.len() / n;
                    index.push(
                        p.pos0,
                        (
                            &idx_kv[rows.start * w..rows.end * w],
                            &idx_gate[rows.start * w..rows.end * w],
                        ),
                        &ix.compressor.ape,
                        (&ix.compressor.norm, eps),
                        &mut rope,
                    );
                }
            }
            let mem = &*p.mem;
            let (keys, state) = (mem.kv.keys(il), mem.compressed[il].as_ref());
            let scale = 1.0 / (d as f32).sqrt();
            let idx_width = v.idx_heads * v.idx_dim;
            // sized once for the most keys a row of this sequence can see, so that decoding allocates nothing
            let most = state.map_or(0, |st| st.attn.visible(mem.kv.n_ctx() - 1));
            if row_scratch.len() < p.tokens.len() {
                row_scratch.resize_with(p.tokens.len(), RowScratch::default);
            }
            for rs in &mut row_scratch[..p.tokens.len()] {
                rs.reserve(v.window + most, half);
            }
            attn[rows.start * q_dim..rows.end * q_dim]
                .par_chunks_mut(q_dim)
                .zip(row_scratch.par_iter_mut())
                .enumerate()
                .for_each(|(i, (o, rs))| {
                    let (r, pos) = (rows.start + i, p.pos0 + i);
                    // the entries this row sees: all visible ones, or the indexer's choice among them
                    rs.chosen.clear();
                    if let Some(st) = state {
                        let visible = st.attn.visible(pos);
                        match &st.index {
                            Some(index) => choose(
                                &idx_q[r * idx_width..(r + 1) * idx_width],
                                &idx_w[r * v.idx_heads..(r + 1) * v.idx_heads],
                                index.entries(visible),
                                v.idx_dim,
                                v.idx_top_k,
                                &mut rs.scores,
                                &mut rs.chosen,
                            ),
                            None => rs.chosen.extend(0..visible as u32),
                        }
                    }
                    let raw = (pos + 1).saturating_sub(v.window)..pos + 1;
                    let key = |j: usize| -> &[f32] {
                        match j.checked_sub(raw.len()) {
                            None => &keys[(raw.start + j) * d..(raw.start + j + 1) * d],
                            Some(e) => state
                                .expect("entries are chosen only on compressed layers")
                                .attn
                                .entry(rs.chosen[e] as usize),
                        }
                    };
                    let n_keys = raw.len() + rs.chosen.len();
                    // undoing the values' rotation: the row's angles, negated
                    let (cs, sn) = (&cos[r * half..(r + 1) * half], &sin[r * half..(r + 1) * half]);
                    rs.neg_sin.clear();
                    rs.neg_sin.extend(sn.iter().map(|s| -s));
                    for (hd, oh) in o.chunks_exact_mut(d).enumerate() {
                        let qh = &q[r * q_dim + hd * d..r * q_dim + (hd + 1) * d];
                        rs.weights.clear();
                        rs.weights.extend((0..n_keys).map(|j| dot_f32(qh, key(j)) * scale));
                        softmax_with_sink(&mut rs.weights, a.sinks[hd]);
                        oh.fill(0.0);
                        for (j, &wt) in rs.weights.iter().enumerate() {
                            for (ov, &kv) in oh.iter_mut().zip(key(j)) {
                                *ov += wt * kv;
                            }
                        }
                        rope_tail(oh, cs, &rs.neg_sin);
                    }
                });
            row = rows.end;
        }

        // the grouped output projection, then attn_output_b
        let (groups, group) = (a.wo_a.n, q_dim / a.wo_a.n);
        grouped.resize(n * groups * a.wo_a.mat.rows, 0.0);
        self.per_head(&a.wo_a, (attn, group, group), (grouped, a.wo_a.mat.rows), heads)?;
        acts.quantize(a.wo_b.ty.act_type(), grouped, n, a.wo_b.cols)?;
        matmul(&self.weights.view(&a.wo_b), acts, out)?;
        Ok(())
    }
}

/// One row's working space for its attention.
#[derive(Default)]
struct RowScratch {
    chosen: Vec<u32>,
    scores: Vec<f32>,
    weights: Vec<f32>,
    neg_sin: Vec<f32>,
}

impl RowScratch {
    /// Room for `keys` keys and `half` angles (allocating only the first time).
    fn reserve(&mut self, keys: usize, half: usize) {
        for v in [&mut self.scores, &mut self.weights] {
            v.clear();
            v.reserve(keys);
        }
        self.chosen.clear();
        self.chosen.reserve(keys);
        self.neg_sin.clear();
        self.neg_sin.reserve(half);
    }
}
