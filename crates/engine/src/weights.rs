//! The model's weights as typed views into the GGUF mapping, with every shape checked at load.
//!
//! Matrices stay in their GGUF encoding: read in place from the mapping, or copied out of it at load —
//! Q4_0, Q8_0 and MXFP4 matrices regrouped for the SIMD kernels, and the dense matrices when experts stream.
//! Only the small vectors (norms, biases) are decoded to f32 once.

use titan_gguf::{GgufFile, TensorInfo};
use titan_kernels::{GgmlType, WeightLayout, WeightView};
use titan_layout::names::{bias_name, is_expert_tensor, split_block, weight_name};
use titan_layout::{regroup, Part};

use crate::config::{Activation, Config, Mixer, QkNorm};
use crate::{EngineError, Result};

/// A matrix of `rows` × `cols` in its GGUF encoding, located by its byte range in the file.
#[derive(Clone, Copy, Debug)]
pub struct Mat {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    /// Byte offset of row 0 from the start of the file.
    pub start: usize,
}

impl Mat {
    pub fn row_bytes(&self) -> usize {
        self.ty.row_bytes(self.cols).expect("checked at load")
    }
    pub fn bytes(&self) -> usize {
        self.row_bytes() * self.rows
    }
}

/// One expert-stacked tensor: `n` matrices of `rows` × `cols`, expert `e` at `start + e * rows * row_bytes`.
/// This layout is why an expert is a contiguous byte range: slicing it out is a copy, never a requantisation.
#[derive(Clone, Copy, Debug)]
pub struct Stacked {
    pub mat: Mat,
    pub n: usize,
}

impl Stacked {
    pub fn expert(&self, e: usize) -> Mat {
        Mat {
            start: self.mat.start + e * self.mat.bytes(),
            ..self.mat
        }
    }
}

/// A feed-forward that every token goes through: the shared expert beside the routed ones, or a dense
/// layer's whole feed-forward (DeepSeek's first layers).
pub struct SharedExpert {
    pub gate: Mat,
    pub up: Mat,
    pub down: Mat,
    /// Qwen2-MoE and the hybrids scale the shared expert's output by sigmoid(x · gate_inp); DeepSeek adds it
    /// as it is.
    pub gate_inp: Option<Vec<f32>>,
}

/// A layer's routed experts.
pub struct Moe {
    pub router: Mat,
    /// `exp_probs_b` (DeepSeek-V3): added to the expert scores to choose experts, not to weigh them.
    pub choice_bias: Option<Vec<f32>>,
    /// `ffn_gate_inp.bias` (gpt-oss): added to the router's logits.
    pub router_bias: Option<Vec<f32>>,
    pub gate: Stacked,
    pub up: Stacked,
    pub down: Stacked,
    /// `ffn_gate_tid2eid` (DeepSeek-V4's first layers): the experts of each token id, `k` per token.
    pub token_table: Option<Vec<u32>>,
}

/// Multi-head latent attention's weights (DeepSeek-V2/V3, llama.cpp's names in the comments).
pub struct Latent {
    pub q: LatentQuery,
    /// `attn_kv_a_mqa`: the latent vector, then the key's RoPE part.
    pub kv_a: Mat,
    /// `attn_kv_a_norm`, on the latent vector.
    pub kv_norm: Vec<f32>,
    /// `attn_k_b`: per head, from its query's non-RoPE part to the latent space (the key side absorbed
    /// into the query), `kv_lora` × `nope`.
    pub k_b: Stacked,
    /// `attn_v_b`: per head, from the attended latent vector to the head's value, `v_dim` × `kv_lora`.
    pub v_b: Stacked,
    pub wo: Mat,
}

/// How a latent-attention layer projects its queries.
pub enum LatentQuery {
    /// `attn_q` (DeepSeek-V2-Lite).
    Direct(Mat),
    /// `attn_q_a`, its RMS norm `attn_q_a_norm`, then `attn_q_b`.
    Compressed { a: Mat, norm: Vec<f32>, b: Mat },
}

/// Softmax attention's weights.
pub struct Attention {
    /// The query projection; with a gated attention, each head's queries then its gate values.
    pub wq: Mat,
    pub wk: Mat,
    pub wv: Mat,
    pub wo: Mat,
    pub bq: Option<Vec<f32>>,
    pub bk: Option<Vec<f32>>,
    pub bv: Option<Vec<f32>>,
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    /// `attn_output.bias` (gpt-oss).
    pub bo: Option<Vec<f32>>,
    /// `attn_sinks` (gpt-oss): per head a logit that joins the softmax's denominator, so a head can
    /// attend to nothing.
    pub sinks: Option<Vec<f32>>,
}

/// A Gated DeltaNet layer's weights (llama.cpp's tensor names in the comments).
pub struct DeltaNet {
    /// `attn_qkv`: the convolution's input, queries then keys then values.
    pub qkv: Mat,
    /// `attn_gate`: z, the gate of the output norm.
    pub z: Mat,
    pub beta_alpha: BetaAlpha,
    /// `ssm_conv1d`, transposed at load: tap after tap (oldest first), `conv_dim` channels each, so that
    /// a tap's products run along contiguous channels (the file holds the taps channel after channel).
    pub conv: Vec<f32>,
    /// `ssm_dt.bias`, added to alpha before the softplus.
    pub dt_bias: Vec<f32>,
    /// `ssm_a`: -exp(A_log) per value head (the converter stores it negated and exponentiated).
    pub a: Vec<f32>,
    /// `ssm_norm`: the gated RMS norm's weight, one head long.
    pub norm: Vec<f32>,
    /// `ssm_out`: back to the residual stream.
    pub out: Mat,
}

/// The projections that give each value head its write strength beta and its decay input alpha.
pub enum BetaAlpha {
    /// `ssm_beta` and `ssm_alpha` (Qwen3.5).
    Apart { beta: Mat, alpha: Mat },
    /// `ssm_ba` (Qwen3-Next): per key head, its value heads' betas then their alphas.
    Joint(Mat),
}

/// DeepSeek-V4's attention (docs/deepseek4.md, llama.cpp's names in the comments).
pub struct V4Attention {
    /// `attn_q_a`, its norm `attn_q_a_norm`, then `attn_q_b`: the queries of every head.
    pub q_a: Mat,
    pub q_a_norm: Vec<f32>,
    pub q_b: Mat,
    /// `attn_kv` and `attn_kv_a_norm`: one vector per position, both key and value.
    pub kv: Mat,
    pub kv_norm: Vec<f32>,
    /// `attn_sinks`: per head, a logit in the softmax's denominator only.
    pub sinks: Vec<f32>,
    /// `attn_output_a`: per group of heads its own projection to `out_rank`, group after group.
    pub wo_a: Stacked,
    /// `attn_output_b`: the groups' results together back to the residual width.
    pub wo_b: Mat,
    /// On compressed layers, the compressor of the layer's entries.
    pub compressor: Option<Compressor>,
    /// On ratio-4 layers, the lightning indexer that chooses among them.
    pub indexer: Option<Indexer>,
}

/// A compressor: per position a value and a score of `width` (twice the entry's size at ratio 4, whose
/// windows overlap), scores offset by `ape` by the position in its window; the entry's norm.
pub struct Compressor {
    pub ratio: usize,
    pub kv: Mat,
    pub gate: Mat,
    /// `ratio` rows of `width`.
    pub ape: Vec<f32>,
    pub norm: Vec<f32>,
}

/// The lightning indexer: its queries from the q-LoRA vector (`indexer.attn_q_b`), its head weights
/// (`indexer.proj`) and its own compressor of keys (`indexer_compressor_*`).
pub struct Indexer {
    pub q_b: Mat,
    pub proj: Mat,
    pub compressor: Compressor,
}

/// One hyper-connection site (`hc_attn_*`, `hc_ffn_*`, or the head's `output_hc_*`): the function of the
/// normalised streams that gives the mixing numbers, their bases and the scales of each kind.
pub struct Hyper {
    /// `outputs` rows of hc·n_embd, decoded to f32.
    pub func: Vec<f32>,
    pub base: Vec<f32>,
    pub scale: Vec<f32>,
}

/// What mixes a layer's tokens.
pub enum Mixing {
    Attention(Attention),
    DeltaNet(DeltaNet),
    Latent(Latent),
    V4(Box<V4Attention>),
}

pub struct Layer {
    pub attn_norm: Vec<f32>,
    pub mixing: Mixing,
    /// The norm before the router and experts (`post_attention_norm` in the hybrids).
    pub ffn_norm: Vec<f32>,
    /// The routed experts; none in a dense layer.
    pub moe: Option<Moe>,
    /// The shared expert, or a dense layer's feed-forward.
    pub shared: Option<SharedExpert>,
    /// DeepSeek-V4's hyper-connections around the mixer and around the feed-forward.
    pub hyper: Option<[Hyper; 2]>,
}

impl Layer {
    /// The routed experts of layer `il` (this layer), or why there are none: a request for an expert of
    /// a dense layer (one a node could receive) is an error, not a panic.
    pub fn experts(&self, il: usize, expert: u32) -> Result<&Moe> {
        self.moe.as_ref().ok_or_else(|| EngineError::Expert {
            layer: il,
            expert,
            what: "the layer is dense and has no experts".into(),
        })
    }
}

/// What experts compute with besides their three matrices: the activation, and per layer the experts'
/// biases (gpt-oss), decoded to f32 at load (they are small), wherever the matrices come from.
pub struct ExpertExtras {
    pub act: Activation,
    n_expert: usize,
    layers: Vec<Option<ExpertBiases>>,
}

/// One layer's expert biases, expert after expert.
struct ExpertBiases {
    gate: Vec<f32>,
    up: Vec<f32>,
    down: Vec<f32>,
}

/// One expert's biases.
#[derive(Clone, Copy)]
pub struct ExpertBias<'a> {
    pub gate: &'a [f32],
    pub up: &'a [f32],
    pub down: &'a [f32],
}

impl ExpertExtras {
    /// The activation of `c`, and the expert biases the file has (`titan_layout::names::bias_name`).
    pub fn load(f: &GgufFile, c: &Config) -> Result<ExpertExtras> {
        let l = Loader { f };
        let (e, ff, n) = (c.n_embd, c.expert_ff, c.n_expert);
        let mut layers = Vec::with_capacity(c.n_layer);
        for i in 0..c.n_layer {
            layers.push(if f.tensor(&bias_name(i, Part::Gate)).is_some() {
                let table = |p: Part, len: usize| l.decode(l.tensor(&bias_name(i, p), &[len, n])?, len * n);
                Some(ExpertBiases {
                    gate: table(Part::Gate, ff)?,
                    up: table(Part::Up, ff)?,
                    down: table(Part::Down, e)?,
                })
            } else {
                None
            });
        }
        Ok(ExpertExtras {
            act: c.expert_act,
            n_expert: n,
            layers,
        })
    }

    /// Expert `e` of `layer`'s biases, if the model has any.
    pub fn bias(&self, layer: usize, e: usize) -> Option<ExpertBias<'_>> {
        let b = self.layers.get(layer)?.as_ref()?;
        let n = self.n_expert;
        Some(ExpertBias {
            gate: expert_row(&b.gate, n, e),
            up: expert_row(&b.up, n, e),
            down: expert_row(&b.down, n, e),
        })
    }
}

/// Row `e` of a table of `n` equal rows.
fn expert_row(v: &[f32], n: usize, e: usize) -> &[f32] {
    let per = v.len() / n;
    &v[e * per..(e + 1) * per]
}

pub struct Weights {
    pub file: GgufFile,
    /// The experts' activation and biases.
    pub extras: std::sync::Arc<ExpertExtras>,
    /// Tensors copied out of the mapping (see [`Weights::copy_out`]).
    copies: Copies,
    /// Which weights this process computes with.
    residency: Residency,
    pub token_embd: Mat,
    pub output_norm: Vec<f32>,
    /// The LM head; `token_embd` itself when the model ties them.
    pub output: Mat,
    /// The main blocks, then the MTP block where the model has one ([`Weights::mtp`]).
    pub layers: Vec<Layer>,
    /// The multi-token-prediction head around the block at `layers[n_layer]`.
    pub mtp: Option<MtpHead>,
    /// `rope_freqs`: per RoPE pair, what its angle is divided by (Llama 3/4's frequency scaling, which the
    /// converter writes as this tensor).
    pub rope_freqs: Option<Vec<f32>>,
    /// DeepSeek-V4's head collapse of the streams (`output_hc_*`).
    pub hyper_head: Option<Hyper>,
}

/// What a multi-token-prediction (`nextn`) block adds to a transformer block: it predicts the token after
/// next from the main model's final state at one position and the token at the next (Qwen3-Next, Qwen3.5/3.6,
/// GLM-4.5: `eh_proj` of [enorm(embedding) ‖ hnorm(state)], the block, `shared_head_norm`, the LM head).
pub struct MtpHead {
    /// 2·n_embd → n_embd.
    pub eh_proj: Mat,
    pub enorm: Vec<f32>,
    pub hnorm: Vec<f32>,
    pub head_norm: Vec<f32>,
    /// Its own LM head and embedding where the file has them, else the model's.
    pub head: Mat,
    pub embd: Mat,
}

impl MtpHead {
    /// Whether the file holds an MTP block after its main ones: a file converted with --no-mtp may count
    /// one without holding it.
    pub fn held(f: &GgufFile, c: &Config) -> bool {
        c.n_nextn > 0 && f.tensor(&format!("blk.{}.nextn.eh_proj.weight", c.n_layer)).is_some()
    }

    /// The head of the file's first MTP block, where TITAN runs the model's kind of it (the Qwen3-Next and
    /// Qwen3.5/3.6 MoE block: gated full attention and the layers' experts; GLM-4.5's: its attention and experts);
    /// `None` otherwise, the block then left unread. What the file lacks of the head is the model's own
    /// (embedding, `output_norm`, LM head), as llama.cpp takes it.
    fn load(l: &Loader, c: &Config, model: (&Mat, &Mat, &[f32])) -> Result<Option<MtpHead>> {
        let (token_embd, output, output_norm) = model;
        let n = |s: &str| format!("blk.{}.nextn.{s}", c.n_layer);
        if !MtpHead::held(l.f, c) || !c.runs_mtp() {
            return Ok(None);
        }
        let e = c.n_embd;
        let own = |name: &str, default: &Mat| -> Result<Mat> {
            match l.f.tensor(&n(name)) {
                Some(_) => l.mat(&n(name), e, c.n_vocab),
                None => Ok(*default),
            }
        };
        Ok(Some(MtpHead {
            eh_proj: l.mat(&n("eh_proj.weight"), 2 * e, e)?,
            enorm: l.vec(&n("enorm.weight"), e)?,
            hnorm: l.vec(&n("hnorm.weight"), e)?,
            head_norm: l
                .vec_if_present(&n("shared_head_norm.weight"), e)?
                .unwrap_or_else(|| output_norm.to_vec()),
            head: own("shared_head_head.weight", output)?,
            embd: own("embed_tokens.weight", token_embd)?,
        }))
    }
}

impl Weights {
    pub fn load(file: GgufFile, c: &Config) -> Result<Weights> {
        let l = Loader { f: &file };
        let (e, v) = (c.n_embd, c.n_vocab);
        let token_embd = l.mat("token_embd.weight", e, v)?;
        let output = if file.tensor("output.weight").is_some() {
            l.mat("output.weight", e, v)?
        } else {
            token_embd
        };
        let output_norm = l.vec("output_norm.weight", e)?;
        let mut layers = (0..c.n_layer)
            .map(|i| l.layer(c, i, c.mixers[i]))
            .collect::<Result<Vec<Layer>>>()?;
        let mtp = MtpHead::load(&l, c, (&token_embd, &output, &output_norm))?;
        if mtp.is_some() {
            // After the main blocks, where the expert sources find it by its index.
            layers.push(l.layer(c, c.n_layer, Mixer::Attention)?);
        }
        let extras = std::sync::Arc::new(ExpertExtras::load(&file, c)?);
        let rope_freqs = l.vec_if_present("rope_freqs.weight", c.rope_dims / 2)?;
        if let Some(ff) = rope_freqs
            .as_ref()
            .and_then(|v| v.iter().find(|f| !(f.is_finite() && **f > 0.0)))
        {
            return Err(l.err(format!(
                "rope_freqs.weight holds {ff}; every frequency factor must be a positive number"
            )));
        }
        let hyper_head = match &c.v4 {
            Some(v) => Some(l.hyper("output_hc", v.hc, v.hc, 1, e)?),
            None => None,
        };
        Ok(Weights {
            hyper_head,
            file,
            extras,
            copies: Copies::default(),
            residency: Residency::All,
            token_embd,
            output_norm,
            output,
            layers,
            mtp,
            rope_freqs,
        })
    }

    /// A view of a matrix: zero-copy into the mapping, or into its copy.
    pub fn view(&self, m: &Mat) -> WeightView<'_> {
        let (data, layout) = self.copies.get(m.start, m.bytes()).unwrap_or_else(|| {
            // Every Mat was derived from a tensor whose bounds the GGUF reader checked.
            (
                self.file
                    .bytes(m.start, m.bytes())
                    .expect("matrix bounds checked at load"),
                WeightLayout::Plain,
            )
        });
        WeightView {
            ty: m.ty,
            rows: m.rows,
            cols: m.cols,
            data,
            layout,
        }
    }

    /// Copies tensors out of the mapping, once, after loading:
    ///
    /// - every Q4_0, Q8_0 and MXFP4 matrix the SIMD kernels take regrouped (`titan_kernels::regroup_weights`:
    ///   scales first and quants pre-transposed, so each kernel call skips that work — the same bits),
    ///   except the token embedding, which is read row by row;
    /// - with [`Residency::Dense`] (experts streamed from a store), every other dense tensor as it is:
    ///   the mapping's pages are reclaimable page cache that expert reads would push out, and the copy
    ///   keeps the backbone resident.
    ///
    /// Tensors outside `residency` are left alone, never touched. Each copied range is released from
    /// the mapping, so the process holds each tensor once.
    pub fn copy_out(&mut self, residency: Residency) {
        let dense_resident = residency == Residency::Dense;
        let wanted = |name: &str| match residency {
            Residency::All => true,
            Residency::Dense => !is_expert_tensor(name),
            Residency::Experts => is_expert_tensor(name),
        };
        // An MTP block this engine does not run is left in the mapping, never paged in.
        let blocks = self.layers.len();
        let run = |name: &str| split_block(name).is_none_or(|(b, _)| b < blocks);
        let mut tensors: Vec<_> = self
            .file
            .tensors
            .iter()
            .filter(|t| wanted(&t.name) && run(&t.name))
            .collect();
        tensors.sort_by_key(|t| t.offset);
        let mut copies = Copies::default();
        for t in tensors {
            let start = (self.file.data_offset + t.offset) as usize;
            let src = self.file.tensor_data(t);
            let cols = t.dims.first().map_or(0, |&c| c as usize);
            let matrix = t.dims.len() >= 2 && t.dims[1] > 1 && t.name != "token_embd.weight";
            let copy = match matrix.then(|| regroup::regrouped(t.ty, cols, src)).flatten() {
                Some(buf) => Some((buf, WeightLayout::Regrouped)),
                None if dense_resident => Some((src.to_vec(), WeightLayout::Plain)),
                None => None,
            };
            if let Some((buf, layout)) = copy {
                copies.starts.push(start);
                copies.bufs.push(buf);
                copies.layouts.push(layout);
                self.file.release(start, src.len());
            }
        }
        self.copies = copies;
        self.residency = residency;
    }

    /// Bring the tensors computed from the mapping itself (those not copied out, in the blocks the model
    /// runs) into memory now, before timing runs: a copied tensor's pages were released and stay so.
    pub fn populate_in_place(&self) {
        let blocks = self.layers.len();
        for t in &self.file.tensors {
            let start = (self.file.data_offset + t.offset) as usize;
            let len = self.file.tensor_data(t).len();
            let runs = split_block(&t.name).is_none_or(|(b, _)| b < blocks);
            if runs && self.copies.get(start, len).is_none() {
                self.file.populate(start, len);
            }
        }
    }

    /// The widest row of any tensor of the model, in elements: no product's input can be wider.
    pub fn max_cols(&self) -> usize {
        self.file
            .tensors
            .iter()
            .filter_map(|t| usize::try_from(*t.dims.first()?).ok())
            .max()
            .unwrap_or(0)
    }

    /// The matrix of `rows` rows of `cols` elements of `ty` whose first row is at file offset `start`, if
    /// those rows are whole rows of one tensor of the file: how a node checks the rows a backbone asks
    /// it to multiply, before it reads a byte of them.
    pub fn matrix_at(&self, start: u64, ty: GgmlType, rows: usize, cols: usize) -> Option<Mat> {
        let row_bytes = ty.row_bytes(cols)? as u64;
        let end = start.checked_add(row_bytes.checked_mul(rows as u64)?)?;
        let base = self.file.data_offset;
        let t = self.file.tensors.iter().find(|t| {
            let (from, to) = (base + t.offset, base + t.offset + t.size);
            from <= start && end <= to
        })?;
        let whole_rows = t.ty == ty && t.dims.first() == Some(&(cols as u64)) && t.dims.len() >= 2;
        let aligned = (start - base - t.offset).is_multiple_of(row_bytes);
        (whole_rows && aligned).then_some(Mat {
            ty,
            rows,
            cols,
            start: usize::try_from(start).ok()?,
        })
    }

    /// Which weights this process computes with (all of them unless [`Weights::copy_out`] said otherwise).
    pub fn residency(&self) -> Residency {
        self.residency
    }
}

/// Which weights a process computes with, and so copies out of the mapping at load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Residency {
    /// The whole model, from memory.
    All,
    /// The dense weights; experts stream from a store.
    Dense,
    /// The experts only (an expert node).
    Experts,
}

/// `taps` values per channel, channel after channel, rearranged tap after tap.
fn tap_major(per_channel: &[f32], taps: usize) -> Vec<f32> {
    let channels = per_channel.len() / taps;
    (0..taps * channels)
        .map(|n| per_channel[(n % channels) * taps + n / channels])
        .collect()
}

/// Tensors copied out of the mapping, by their start offset in the file.
#[derive(Default)]
struct Copies {
    starts: Vec<usize>,
    bufs: Vec<Vec<u8>>,
    layouts: Vec<WeightLayout>,
}

impl Copies {
    fn get(&self, start: usize, len: usize) -> Option<(&[u8], WeightLayout)> {
        let i = self.starts.partition_point(|&s| s <= start).checked_sub(1)?;
        let data = self.bufs[i].get(start - self.starts[i]..start - self.starts[i] + len)?;
        Some((data, self.layouts[i]))
    }
}

struct Loader<'a> {
    f: &'a GgufFile,
}

impl Loader<'_> {
    fn err(&self, what: String) -> EngineError {
        EngineError::Model {
            path: self.f.path().display().to_string(),
            what,
        }
    }

    fn tensor(&self, name: &str, dims: &[usize]) -> Result<&TensorInfo> {
        let t = self
            .f
            .tensor(name)
            .ok_or_else(|| self.err(format!("missing tensor {name}")))?;
        let want: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
        if t.dims != want {
            return Err(self.err(format!(
                "tensor {name} has shape {:?}, expected {:?} from the metadata",
                t.dims, want
            )));
        }
        Ok(t)
    }

    fn mat(&self, name: &str, cols: usize, rows: usize) -> Result<Mat> {
        let t = self.tensor(name, &[cols, rows])?;
        Ok(Mat {
            ty: t.ty,
            rows,
            cols,
            start: (self.f.data_offset + t.offset) as usize,
        })
    }

    fn stacked(&self, name: &str, cols: usize, rows: usize, n: usize) -> Result<Stacked> {
        let t = self.tensor(name, &[cols, rows, n])?;
        Ok(Stacked {
            mat: Mat {
                ty: t.ty,
                rows,
                cols,
                start: (self.f.data_offset + t.offset) as usize,
            },
            n,
        })
    }

    /// Block `i`: its token mixer (`mixer`), norms and feed-forward.
    fn layer(&self, c: &Config, i: usize, mixer: Mixer) -> Result<Layer> {
        let e = c.n_embd;
        let n = |s: &str| format!("blk.{i}.{s}");
        let dense = !c.is_moe(i);
        let ffn = |ff: usize, gate_inp: Option<Vec<f32>>, suffix: &str| -> Result<SharedExpert> {
            Ok(SharedExpert {
                gate: self.mat(&n(&format!("ffn_gate{suffix}.weight")), e, ff)?,
                up: self.mat(&n(&format!("ffn_up{suffix}.weight")), e, ff)?,
                down: self.mat(&n(&format!("ffn_down{suffix}.weight")), ff, e)?,
                gate_inp,
            })
        };
        let shared = if dense {
            Some(ffn(c.dense_ff, None, "")?)
        } else if c.shared_ff > 0 {
            let gate_inp = if c.shared_gated {
                Some(self.vec_or_row(&n("ffn_gate_inp_shexp.weight"), e)?)
            } else {
                None
            };
            Some(ffn(c.shared_ff, gate_inp, "_shexp")?)
        } else {
            None
        };
        let moe = if dense {
            None
        } else {
            Some(Moe {
                router: self.mat(&n("ffn_gate_inp.weight"), e, c.n_expert)?,
                choice_bias: self.vec_if_present(&n("exp_probs_b.bias"), c.n_expert)?,
                router_bias: self.vec_if_present(&n("ffn_gate_inp.bias"), c.n_expert)?,
                gate: self.stacked(&weight_name(i, Part::Gate), e, c.expert_ff, c.n_expert)?,
                up: self.stacked(&weight_name(i, Part::Up), e, c.expert_ff, c.n_expert)?,
                down: self.stacked(&weight_name(i, Part::Down), c.expert_ff, e, c.n_expert)?,
                token_table: match &c.v4 {
                    Some(v) if i < v.hash_layers => Some(self.token_table(&n("ffn_gate_tid2eid.weight"), c)?),
                    _ => None,
                },
            })
        };
        let mixing = match (mixer, c.mla) {
            (Mixer::Attention, None) if c.v4.is_some() => Mixing::V4(Box::new(self.v4_attention(c, i)?)),
            (Mixer::Attention, None) => Mixing::Attention(self.attention(c, i)?),
            (Mixer::Attention, Some(_)) => Mixing::Latent(self.latent(c, i)?),
            (Mixer::DeltaNet, _) => Mixing::DeltaNet(self.delta_net(c, i)?),
        };
        let post_norm = c.attn_gate || matches!(c.arch, crate::Arch::GptOss | crate::Arch::Glm4Moe);
        let ffn_norm = if post_norm {
            "post_attention_norm.weight"
        } else {
            "ffn_norm.weight"
        };
        Ok(Layer {
            attn_norm: self.vec(&n("attn_norm.weight"), e)?,
            mixing,
            ffn_norm: self.vec(&n(ffn_norm), e)?,
            moe,
            shared,
            hyper: match &c.v4 {
                Some(v) => {
                    let site = |name: &str| self.hyper(&n(name), v.hc, (2 + v.hc) * v.hc, 3, e);
                    Some([site("hc_attn")?, site("hc_ffn")?])
                }
                None => None,
            },
        })
    }

    /// A hyper-connection site `prefix`_{fn, base, scale}: `outputs` numbers from hc·n_embd, as many bases,
    /// `scales` scales.
    fn hyper(&self, prefix: &str, hc: usize, outputs: usize, scales: usize, e: usize) -> Result<Hyper> {
        let name = format!("{prefix}_fn.weight");
        let func = self.decode(self.tensor(&name, &[hc * e, outputs])?, hc * e * outputs)?;
        Ok(Hyper {
            func,
            base: self.vec(&format!("{prefix}_base.weight"), outputs)?,
            scale: self.vec(&format!("{prefix}_scale.weight"), scales)?,
        })
    }

    /// `ffn_gate_tid2eid`: I32, `k` experts per token of the vocabulary, each one of the layer's.
    fn token_table(&self, name: &str, c: &Config) -> Result<Vec<u32>> {
        let t = self.tensor(name, &[c.n_expert_used, c.n_vocab])?;
        if t.ty != GgmlType::I32 {
            return Err(self.err(format!("tensor {name} is {:?}, expected I32", t.ty)));
        }
        let ids: Vec<u32> = self
            .f
            .tensor_data(t)
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as u32)
            .collect();
        if let Some(bad) = ids.iter().find(|&&e| e as usize >= c.n_expert) {
            return Err(self.err(format!(
                "tensor {name} names expert {}, but the layer has {}",
                *bad as i32, c.n_expert
            )));
        }
        Ok(ids)
    }

    fn v4_attention(&self, c: &Config, i: usize) -> Result<V4Attention> {
        let n = |s: &str| format!("blk.{i}.{s}");
        let v = c.v4.as_ref().expect("a DeepSeek-V4 layer has its shape");
        let (e, d, q) = (c.n_embd, c.head_dim, c.q_dim());
        let ratio = v.ratios[i];
        let compressor = |prefix: &str, dim: usize| -> Result<Compressor> {
            let width = if ratio == 4 { 2 * dim } else { dim };
            Ok(Compressor {
                ratio,
                kv: self.mat(&n(&format!("{prefix}_kv.weight")), e, width)?,
                gate: self.mat(&n(&format!("{prefix}_gate.weight")), e, width)?,
                ape: {
                    let name = n(&format!("{prefix}_ape.weight"));
                    self.decode(self.tensor(&name, &[width, ratio])?, width * ratio)?
                },
                norm: self.vec(&n(&format!("{prefix}_norm.weight")), dim)?,
            })
        };
        let group = q / v.out_groups;
        Ok(V4Attention {
            q_a: self.mat(&n("attn_q_a.weight"), e, v.q_lora)?,
            q_a_norm: self.vec(&n("attn_q_a_norm.weight"), v.q_lora)?,
            q_b: self.mat(&n("attn_q_b.weight"), v.q_lora, q)?,
            kv: self.mat(&n("attn_kv.weight"), e, d)?,
            kv_norm: self.vec(&n("attn_kv_a_norm.weight"), d)?,
            sinks: self.vec(&n("attn_sinks.weight"), c.n_head)?,
            wo_a: {
                let all = self.mat(&n("attn_output_a.weight"), group, v.out_groups * v.out_rank)?;
                Stacked {
                    mat: Mat {
                        rows: v.out_rank,
                        ..all
                    },
                    n: v.out_groups,
                }
            },
            wo_b: self.mat(&n("attn_output_b.weight"), v.out_groups * v.out_rank, e)?,
            compressor: if ratio == 0 {
                None
            } else {
                Some(compressor("attn_compressor", d)?)
            },
            indexer: if ratio == 4 {
                Some(Indexer {
                    q_b: self.mat(&n("indexer.attn_q_b.weight"), v.q_lora, v.idx_heads * v.idx_dim)?,
                    proj: self.mat(&n("indexer.proj.weight"), e, v.idx_heads)?,
                    compressor: compressor("indexer_compressor", v.idx_dim)?,
                })
            } else {
                None
            },
        })
    }

    fn attention(&self, c: &Config, i: usize) -> Result<Attention> {
        let n = |s: &str| format!("blk.{i}.{s}");
        let (e, q, kv) = (c.n_embd, c.q_dim(), c.kv_dim());
        let (q_norm, k_norm) = match c.qk_norm {
            QkNorm::None | QkNorm::Unweighted => (None, None),
            QkNorm::PerHead => (
                Some(self.vec(&n("attn_q_norm.weight"), c.head_dim)?),
                Some(self.vec(&n("attn_k_norm.weight"), c.head_dim)?),
            ),
            QkNorm::Whole => (
                Some(self.vec(&n("attn_q_norm.weight"), q)?),
                Some(self.vec(&n("attn_k_norm.weight"), kv)?),
            ),
        };
        let bias = |name: &str, len| {
            if c.qkv_bias {
                self.vec(&n(name), len).map(Some)
            } else {
                Ok(None)
            }
        };
        Ok(Attention {
            wq: self.mat(&n("attn_q.weight"), e, c.q_proj_dim())?,
            wk: self.mat(&n("attn_k.weight"), e, kv)?,
            wv: self.mat(&n("attn_v.weight"), e, kv)?,
            wo: self.mat(&n("attn_output.weight"), q, e)?,
            bq: bias("attn_q.bias", q)?,
            bk: bias("attn_k.bias", kv)?,
            bv: bias("attn_v.bias", kv)?,
            q_norm,
            k_norm,
            bo: self.vec_if_present(&n("attn_output.bias"), e)?,
            sinks: self.vec_if_present(&n("attn_sinks.weight"), c.n_head)?,
        })
    }

    fn latent(&self, c: &Config, i: usize) -> Result<Latent> {
        let n = |s: &str| format!("blk.{i}.{s}");
        let m = c.mla.expect("latent attention has its shape");
        let (e, h) = (c.n_embd, c.n_head);
        let q_rows = h * (m.nope + m.rope);
        let q = if m.q_lora > 0 {
            LatentQuery::Compressed {
                a: self.mat(&n("attn_q_a.weight"), e, m.q_lora)?,
                norm: self.vec(&n("attn_q_a_norm.weight"), m.q_lora)?,
                b: self.mat(&n("attn_q_b.weight"), m.q_lora, q_rows)?,
            }
        } else {
            LatentQuery::Direct(self.mat(&n("attn_q.weight"), e, q_rows)?)
        };
        Ok(Latent {
            q,
            kv_a: self.mat(&n("attn_kv_a_mqa.weight"), e, m.kv_lora + m.rope)?,
            kv_norm: self.vec(&n("attn_kv_a_norm.weight"), m.kv_lora)?,
            k_b: self.stacked(&n("attn_k_b.weight"), m.nope, m.kv_lora, h)?,
            v_b: self.stacked(&n("attn_v_b.weight"), m.kv_lora, m.v_dim, h)?,
            wo: self.mat(&n("attn_output.weight"), h * m.v_dim, e)?,
        })
    }

    fn delta_net(&self, c: &Config, i: usize) -> Result<DeltaNet> {
        let n = |s: &str| format!("blk.{i}.{s}");
        let s = c
            .delta_net
            .as_ref()
            .expect("hybrid configs have a linear-attention shape");
        let e = c.n_embd;
        let beta_alpha = if self.f.tensor(&n("ssm_ba.weight")).is_some() {
            BetaAlpha::Joint(self.mat(&n("ssm_ba.weight"), e, 2 * s.n_v_heads)?)
        } else {
            BetaAlpha::Apart {
                beta: self.mat(&n("ssm_beta.weight"), e, s.n_v_heads)?,
                alpha: self.mat(&n("ssm_alpha.weight"), e, s.n_v_heads)?,
            }
        };
        let conv_name = n("ssm_conv1d.weight");
        let conv_t = self.tensor(&conv_name, &[s.conv_kernel, s.conv_dim()])?;
        Ok(DeltaNet {
            qkv: self.mat(&n("attn_qkv.weight"), e, s.conv_dim())?,
            z: self.mat(&n("attn_gate.weight"), e, s.value_dim())?,
            beta_alpha,
            conv: tap_major(&self.decode(conv_t, s.conv_kernel * s.conv_dim())?, s.conv_kernel),
            dt_bias: self.vec(&n("ssm_dt.bias"), s.n_v_heads)?,
            a: self.vec(&n("ssm_a"), s.n_v_heads)?,
            norm: self.vec(&n("ssm_norm.weight"), s.head_dim)?,
            out: self.mat(&n("ssm_out.weight"), s.value_dim(), e)?,
        })
    }

    /// A small vector (norm weight, bias) decoded to f32.
    fn vec(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        self.decode(self.tensor(name, &[len])?, len)
    }

    /// A small vector the architecture has only in some models (biases, sinks), if the file has it.
    fn vec_if_present(&self, name: &str, len: usize) -> Result<Option<Vec<f32>>> {
        self.f.tensor(name).map(|_| self.vec(name, len)).transpose()
    }

    /// A vector that converters write either as [len] or as a one-row matrix [len, 1].
    fn vec_or_row(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        match self.f.tensor(name) {
            Some(t) if t.dims == [len as u64, 1] => self.decode(t, len),
            _ => self.vec(name, len),
        }
    }

    fn decode(&self, t: &TensorInfo, len: usize) -> Result<Vec<f32>> {
        let mut out = vec![0f32; len];
        titan_kernels::dequantize_row(t.ty, self.f.tensor_data(t), &mut out)?;
        Ok(out)
    }
}
