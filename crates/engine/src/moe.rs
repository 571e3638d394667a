//! Mixture-of-experts: routing (f32 softmax, top-k with ties broken by ascending expert id) and the
//! canonical combination of the chosen experts' outputs.

use titan_kernels::{dot_f32, Activations};

use crate::config::{Activation, Config, Scores};
use crate::experts::{swiglu_many, ExpertJob, ExpertWeights, Experts, FfnScratch};
use crate::ops::{add, sigmoid};
use crate::weights::{SharedExpert, Weights};
use crate::{EngineError, Result};

/// How a layer turns router logits into its experts and their weights.
#[derive(Clone, Copy, Debug)]
pub struct RouteRule<'a> {
    pub n_expert: usize,
    pub k: usize,
    /// How the logits score the experts.
    pub scores: Scores,
    /// A table of `k` experts per token id that chooses instead of the scores (DeepSeek-V4's first layers),
    /// which still weigh the chosen.
    pub table: Option<&'a [u32]>,
    /// Added to the scores to choose the experts, not to weigh them (DeepSeek-V3's correction bias).
    pub bias: Option<&'a [f32]>,
    /// Group-limited choice: the experts split into `groups` equal groups, each scored by the sum of its two
    /// best (biased) scores, and the experts chosen only from the best `groups_used` groups. 1: no groups.
    pub groups: usize,
    pub groups_used: usize,
    /// Renormalise the chosen experts' weights to sum to one.
    pub norm: bool,
    /// Then multiply them by this (DeepSeek's routed scaling factor; 1 elsewhere).
    pub scale: f32,
    /// Choose by the raw logits and weigh by a softmax over the chosen ones (gpt-oss), instead of
    /// scoring all experts first.
    pub softmax_chosen: bool,
    /// Choose by the raw logits rather than the scores (gpt-oss; Llama 4, whose sigmoid scores only weigh:
    /// saturated sigmoids could tie where the logits do not).
    pub by_logits: bool,
}

/// The routing decision for a batch: per row, `k` (expert id, weight) pairs in ascending expert-id order.
#[derive(Debug, Default)]
pub struct Routing {
    pub k: usize,
    pub ids: Vec<u32>,
    pub weights: Vec<f32>,
    /// Working space of [`Routing::route`]: one row's scores, the scores that choose, the experts in
    /// rank order, and the groups in rank order.
    probs: Vec<f32>,
    choose: Vec<f32>,
    order: Vec<u32>,
    group_scores: Vec<f32>,
    group_order: Vec<u32>,
    picked: Vec<f32>,
}

impl Routing {
    /// Route each row of `logits` (`n_expert` router logits per row, the row's token in `tokens` where the
    /// rule chooses by a table) by `rule`, replacing the previous decision. Rankings break ties by ascending
    /// id, so every choice is total and stable.
    pub fn route(&mut self, logits: &[f32], tokens: &[u32], rule: &RouteRule<'_>) {
        let Routing {
            ids,
            weights,
            probs,
            choose,
            order,
            group_scores,
            group_order,
            picked,
            ..
        } = self;
        let (n, k) = (rule.n_expert, rule.k);
        self.k = k;
        ids.clear();
        weights.clear();
        for (r, row) in logits.chunks_exact(n).enumerate() {
            probs.clear();
            probs.extend_from_slice(row);
            match rule.scores {
                Scores::Sigmoid => probs.iter_mut().for_each(|p| *p = crate::ops::sigmoid(*p)),
                Scores::SqrtSoftplus => probs.iter_mut().for_each(|p| *p = crate::ops::softplus(*p).sqrt()),
                Scores::Softmax if !rule.softmax_chosen => crate::ops::softmax(probs),
                Scores::Softmax => {}
            }
            choose.clear();
            choose.extend_from_slice(if rule.by_logits { row } else { probs });
            if let Some(b) = rule.bias {
                choose.iter_mut().zip(b).for_each(|(c, &b)| *c += b);
            }
            if rule.groups > 1 {
                // Each group's score is its best plus its second best; experts outside the best groups
                // cannot be chosen.
                let per = n / rule.groups;
                let group_score = |g: usize| {
                    let s = &choose[g * per..(g + 1) * per];
                    let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
                    for &v in s {
                        if v > a {
                            (a, b) = (v, a);
                        } else if v > b {
                            b = v;
                        }
                    }
                    a + b
                };
                group_scores.clear();
                group_scores.extend((0..rule.groups).map(group_score));
                group_order.clear();
                group_order.extend(0..rule.groups as u32);
                group_order.sort_by(|&a, &b| by_score(group_scores, a, b));
                for &g in &group_order[rule.groups_used..] {
                    choose[g as usize * per..(g as usize + 1) * per].fill(f32::NEG_INFINITY);
                }
            }
            order.clear();
            match rule.table {
                // in the table's order, which is the rank order the weights are summed in
                Some(table) => order.extend_from_slice(&table[tokens[r] as usize * k..][..k]),
                None => {
                    order.extend(0..n as u32);
                    order.sort_by(|&a, &b| by_score(choose, a, b));
                }
            }
            let chosen = &mut order[..k];
            if rule.softmax_chosen {
                // The chosen logits' softmax, in rank order as llama.cpp takes it; then placed by id.
                picked.clear();
                picked.extend(chosen.iter().map(|&e| probs[e as usize]));
                crate::ops::softmax(picked);
                for (&e, &p) in chosen.iter().zip(picked.iter()) {
                    probs[e as usize] = p;
                }
            }
            let norm = if rule.norm {
                let sum = chosen.iter().fold(0f32, |s, &e| s + probs[e as usize]);
                // sqrt-softplus scores can all be near 0: llama.cpp clamps their sum there
                if rule.scores == Scores::SqrtSoftplus {
                    1.0 / sum.max(SUM_FLOOR)
                } else {
                    1.0 / sum
                }
            } else {
                1.0
            };
            chosen.sort_unstable();
            for &e in chosen.iter() {
                ids.push(e);
                let w = probs[e as usize] * norm;
                weights.push(if rule.scale == 1.0 { w } else { w * rule.scale });
            }
        }
    }
}

/// The least sum of sqrt-softplus weights that renormalising divides by (2⁻¹⁴, llama.cpp's and transformers'
/// clamp).
const SUM_FLOOR: f32 = 1.0 / 16384.0;

/// Highest score first; equal scores by ascending id.
fn by_score(s: &[f32], a: u32, b: u32) -> std::cmp::Ordering {
    s[b as usize].total_cmp(&s[a as usize]).then(a.cmp(&b))
}

/// The working buffers of [`moe_block`], kept between calls.
#[derive(Default)]
pub struct MoeScratch {
    /// The slots (row · k + j) by expert, then by slot.
    by_expert: Vec<usize>,
    /// The experts the batch reaches, ascending: expert `ids[i]` has slots `by_expert[runs[i]..runs[i + 1]]`.
    ids: Vec<u32>,
    runs: Vec<usize>,
    /// The row of each slot of `by_expert`.
    rows: Vec<usize>,
    /// The layer's input, quantised once for the experts, and apart for the shared expert.
    input: Activations,
    /// Each slot's input scaled by its weight, where the weights scale the experts' input (Llama 4).
    weighted: Vec<f32>,
    shared_input: Activations,
    /// contributions[slot] = the expert's output for (row, slot).
    contributions: Vec<f32>,
    /// Whether expert `ids[i]` delivered its rows this layer: `contributions` is reused between layers,
    /// so an expert that never delivered would otherwise be combined from a stale output.
    delivered: Vec<bool>,
    /// The shared expert's working buffers.
    ffn: FfnScratch,
    out: Vec<f32>,
}

impl MoeScratch {
    /// The output of the last [`moe_block`].
    pub fn out(&self) -> &[f32] {
        &self.out
    }
}

/// The MoE block for the rows of `x` (already normalised) routed by `routing`, into [`MoeScratch::out`]:
/// the chosen experts, wherever `experts` computes them, combined canonically, plus the shared expert if
/// any. Returns how many distinct experts ran.
pub fn moe_block(
    w: &Weights,
    experts: &dyn Experts,
    c: &Config,
    layer: usize,
    x: &[f32],
    routing: &Routing,
    s: &mut MoeScratch,
) -> Result<usize> {
    let (d, k) = (c.n_embd, routing.k);
    let rows = x.len() / d;
    let MoeScratch {
        by_expert,
        ids,
        runs,
        rows: slot_rows,
        input,
        weighted,
        shared_input,
        contributions,
        delivered,
        ffn,
        out,
    } = s;

    // Group rows by expert so each expert's weights are read once per batch. (An unstable sort on a
    // unique key: sorts in place, and the order is still fully determined.)
    by_expert.clear();
    by_expert.extend(0..routing.ids.len());
    by_expert.sort_unstable_by_key(|&slot| (routing.ids[slot], slot));
    ids.clear();
    runs.clear();
    for (i, &slot) in by_expert.iter().enumerate() {
        if ids.last() != Some(&routing.ids[slot]) {
            ids.push(routing.ids[slot]);
            runs.push(i);
        }
    }
    runs.push(by_expert.len());
    slot_rows.clear();
    // The layer's input is quantised once; each expert gets its rows as byte copies of those rows. Where
    // the weights scale the experts' input (Llama 4, as llama.cpp's weight_before_ffn), each slot has its
    // own row, x · w, and its output is combined with weight 1.
    if c.weigh_input {
        weighted.clear();
        for (slot, &wgt) in routing.weights.iter().enumerate() {
            weighted.extend(x[slot / k * d..(slot / k + 1) * d].iter().map(|&v| v * wgt));
        }
        slot_rows.extend_from_slice(by_expert);
        input.quantize(experts.input_type(layer)?, weighted, rows * k, d)?;
    } else {
        slot_rows.extend(by_expert.iter().map(|&slot| slot / k));
        input.quantize(experts.input_type(layer)?, x, rows, d)?;
    }

    contributions.resize(rows * k * d, 0.0);
    let job = ExpertJob {
        layer,
        input,
        ids,
        rows: slot_rows,
        starts: runs,
    };
    let shared = w.layers[layer].shared.as_ref();
    // The shared expert runs while the routed experts are computed (elsewhere, when they are remote).
    let mut shared_ffn = || shared.map_or(Ok(()), |sh| shared_expert(w, sh, c.shared_act, x, d, shared_input, ffn));
    delivered.clear();
    delivered.resize(ids.len(), false);
    experts.apply(&job, &mut shared_ffn, &mut |i, y| {
        let slots = &by_expert[runs[i]..runs[i + 1]];
        delivered[i] = y.len() == slots.len() * d;
        for (yi, &slot) in y.chunks_exact(d).zip(slots) {
            contributions[slot * d..(slot + 1) * d].copy_from_slice(yi);
        }
    })?;
    if let Some(i) = delivered.iter().position(|&done| !done) {
        let what =
            "its output was not delivered whole (a bug in the expert source), so the layer cannot be combined".into();
        return Err(EngineError::Expert {
            layer,
            expert: ids[i],
            what,
        });
    }

    // Canonical combination: Σ w_e · y_e in ascending expert-id order (the slots are already in that order),
    // after every contribution has arrived, one multiply and one add per term.
    out.clear();
    out.resize(rows * d, 0.0);
    for r in 0..rows {
        let acc = &mut out[r * d..(r + 1) * d];
        for j in 0..k {
            let slot = r * k + j;
            let wgt = if c.weigh_input { 1.0 } else { routing.weights[slot] };
            for (a, &y) in acc.iter_mut().zip(&contributions[slot * d..(slot + 1) * d]) {
                *a += wgt * y;
            }
        }
    }

    // The shared expert, added after the combine: out += sigmoid(x · gate_inp) · ffn(x) (Qwen2-MoE, the
    // hybrids), or out += ffn(x) (DeepSeek).
    if let Some(sh) = shared {
        let y = ffn.output(0);
        for ((xr, yr), or) in x.chunks_exact(d).zip(y.chunks_exact(d)).zip(out.chunks_exact_mut(d)) {
            match &sh.gate_inp {
                Some(gate_inp) => {
                    let g = sigmoid(dot_f32(xr, gate_inp));
                    for (o, &v) in or.iter_mut().zip(yr) {
                        *o += v * g;
                    }
                }
                None => add(or, yr),
            }
        }
    }
    Ok(ids.len())
}

/// A dense layer's feed-forward of the rows of `x` (already normalised), into [`MoeScratch::out`].
pub fn dense_ffn(w: &Weights, f: &SharedExpert, x: &[f32], d: usize, s: &mut MoeScratch) -> Result<()> {
    shared_expert(w, f, Activation::Silu, x, d, &mut s.shared_input, &mut s.ffn)?;
    s.out.clear();
    s.out.extend_from_slice(s.ffn.output(0));
    Ok(())
}

/// The shared expert's output (with activation `act`) for the rows of `x`, into `ffn` (output 0); `acts`
/// receives x quantised for it.
fn shared_expert(
    w: &Weights,
    sh: &SharedExpert,
    act: Activation,
    x: &[f32],
    d: usize,
    acts: &mut Activations,
    ffn: &mut FfnScratch,
) -> Result<()> {
    acts.quantize(sh.gate.ty.act_type(), x, x.len() / d, d)?;
    let weights = ExpertWeights {
        gate: w.view(&sh.gate),
        up: w.view(&sh.up),
        down: w.view(&sh.down),
        bias: None,
        act,
    };
    swiglu_many(&[weights], std::slice::from_ref(acts), ffn)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_ties_break_by_ascending_id_and_output_is_sorted() {
        // experts 1 and 3 tie for the top; 0 and 2 tie below.
        let mut r = Routing::default();
        let rule = RouteRule {
            n_expert: 4,
            k: 3,
            scores: Scores::Softmax,
            table: None,
            bias: None,
            groups: 1,
            groups_used: 1,
            norm: false,
            scale: 1.0,
            softmax_chosen: false,
            by_logits: false,
        };
        r.route(&[1.0, 2.0, 1.0, 2.0], &[], &rule);
        assert_eq!(r.ids, vec![0, 1, 3]);
        r.route(
            &[5.0, 0.0, 0.0, 1.0],
            &[],
            &RouteRule {
                k: 2,
                norm: true,
                ..rule
            },
        );
        assert_eq!(r.ids, vec![0, 3]);
        assert!((r.weights[0] + r.weights[1] - 1.0).abs() < 1e-6);
        assert!(r.weights[0] > r.weights[1]);
    }

    /// DeepSeek-V3's rule: sigmoid scores, a bias that only chooses, the best groups first, then the
    /// chosen (unbiased) scores renormalised and scaled.
    #[test]
    fn grouped_sigmoid_routing_with_a_choosing_bias() {
        let logits = [2.0, 1.0, -1.0, 0.5, 0.0, 3.0, -2.0, 1.5];
        let bias = [0.0, 0.0, 0.0, 0.0, 0.0, -5.0, 0.0, 0.0];
        let rule = RouteRule {
            n_expert: 8,
            k: 2,
            scores: Scores::Sigmoid,
            table: None,
            bias: Some(&bias),
            groups: 4,
            groups_used: 2,
            norm: true,
            scale: 2.5,
            softmax_chosen: false,
            by_logits: false,
        };
        let mut r = Routing::default();
        r.route(&logits, &[], &rule);
        // Biased scores by group: {0,1} 0.88+0.73, {2,3} 0.27+0.62, {4,5} 0.5+(0.95-5), {6,7} 0.12+0.82: groups
        // {0,1} and {6,7} win; expert 5, the best unbiased, is out; the top two left are 0 and 7.
        assert_eq!(r.ids, vec![0, 7]);
        let s = |x: f32| 1.0 / (1.0 + (-x).exp());
        let (a, b) = (s(2.0), s(1.5));
        assert!((r.weights[0] - 2.5 * a / (a + b)).abs() < 1e-6 && (r.weights[1] - 2.5 * b / (a + b)).abs() < 1e-6);
    }

    /// A source that computes every expert but keeps one expert's output to itself.
    struct Withholds<'a>(&'a dyn Experts, usize);

    impl Experts for Withholds<'_> {
        fn input_type(&self, layer: usize) -> Result<titan_kernels::GgmlType> {
            self.0.input_type(layer)
        }

        fn apply(
            &self,
            job: &ExpertJob,
            meanwhile: &mut dyn FnMut() -> Result<()>,
            deliver: &mut dyn FnMut(usize, &[f32]),
        ) -> Result<()> {
            self.0.apply(job, meanwhile, &mut |i, y| {
                if i != self.1 {
                    deliver(i, y)
                }
            })
        }
    }

    /// An expert that delivers nothing is an error, not the previous layer's output combined in its place.
    #[test]
    fn an_undelivered_expert_is_an_error() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen3moe/q8_0.gguf");
        let model = crate::Model::load(path).unwrap();
        let c = &model.config;
        let x: Vec<f32> = (0..3 * c.n_embd).map(|i| (i as f32 * 0.37).sin()).collect();
        let logits: Vec<f32> = (0..3 * c.n_expert).map(|i| (i as f32 * 1.3).cos()).collect();
        let mut routing = Routing::default();
        routing.route(&logits, &[], &model.route_rule(0));
        let mut s = MoeScratch::default();
        let all = moe_block(&model.weights, &*model.experts, c, 0, &x, &routing, &mut s).unwrap();
        let whole = s.out().to_vec();
        let err = moe_block(
            &model.weights,
            &Withholds(&*model.experts, 1),
            c,
            1,
            &x,
            &routing,
            &mut s,
        )
        .unwrap_err();
        let second = {
            let mut ids = routing.ids.clone();
            ids.sort_unstable();
            ids.dedup();
            ids[1]
        };
        assert_eq!(err.to_string(), format!("expert {second} of layer 1: its output was not delivered whole (a bug in the expert source), so the layer cannot be combined"));
        // The same scratch still computes correctly afterwards.
        assert_eq!(
            moe_block(&model.weights, &*model.experts, c, 0, &x, &routing, &mut s).unwrap(),
            all
        );
        assert_eq!(s.out(), &whole[..]);
    }
}
