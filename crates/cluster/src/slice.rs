//! Shards: a model's experts of some layers and some expert ids, as a valid GGUF file.
//!
//! In a GGUF an expert tensor is `[cols, rows, n_expert]`, the expert outermost, so experts `x..=y` of a
//! layer are one contiguous byte range of each of its three tensors: a shard is byte copies, never a
//! requantisation. It keeps the model's metadata (so its config reads as the model's), adds
//! `titan.shard.*` keys — the model's identity, the layers and experts held, a BLAKE3 digest per expert —
//! and holds only the expert tensors, cut along the outer axis: the matrices and, where the model has them
//! (gpt-oss), the experts' bias rows, which the expert's digest covers too. Routers, shared experts,
//! attention and embeddings stay with the backbone.
//!
//! A [`Shard`] is planned as a virtual file — the header, then pieces of the source — so it can be written
//! to disk or served over HTTP from any offset without ever being held whole in memory.

use std::io::Write;
use std::ops::RangeInclusive;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use rayon::prelude::*;
use titan_engine::experts::{ExpertJob, ExpertScratch, ExpertWeights, Experts, ScratchPool};
use titan_engine::weights::ExpertExtras;
use titan_engine::{Config, EngineError};
use titan_gguf::{GgufFile, GgufWriter, Value, ValueType};
use titan_kernels::{GgmlType, WeightLayout, WeightView};
use titan_layout::names::{bias_name, is_expert_tensor, weight_name};
use titan_layout::{regroup, ExpertLayout, ModelIdentity, Part};

use crate::ShardError;

pub const KEY_MODEL: &str = "titan.shard.model";
pub const KEY_LAYERS: &str = "titan.shard.layers";
pub const KEY_EXPERTS: &str = "titan.shard.experts";
pub const KEY_DIGESTS: &str = "titan.shard.digests";

/// Which layers and experts a shard holds (both inclusive ranges).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SliceSpec {
    pub layers: RangeInclusive<usize>,
    pub experts: RangeInclusive<usize>,
}

impl SliceSpec {
    pub fn contains(&self, layer: usize, expert: usize) -> bool {
        self.layers.contains(&layer) && self.experts.contains(&expert)
    }
}

/// "3-7" or "5" -> 3..=7 / 5..=5.
pub fn parse_range(s: &str) -> Result<RangeInclusive<usize>, ShardError> {
    let (a, b) = s.split_once('-').unwrap_or((s, s));
    let number = |n: &str| {
        n.trim().parse::<usize>().map_err(|error| ShardError::NotARange {
            text: s.to_string(),
            error,
        })
    };
    let (a, b) = (number(a)?, number(b)?);
    if a > b {
        return Err(ShardError::Backwards(s.to_string()));
    }
    Ok(a..=b)
}

/// A planned shard: `header` at offset 0, then each piece at its offset, zeros in between.
pub struct Shard {
    src: Arc<GgufFile>,
    header: Vec<u8>,
    /// (offset in the shard, offset in the source file, length), ascending.
    pieces: Vec<(u64, usize, u64)>,
    len: u64,
    /// One digest per expert held, layer-major (also in the header).
    pub digests: Vec<String>,
}

/// Every expert's digest of a model, each computed the first time a shard needs it.
pub struct Digests {
    layout: ExpertLayout,
    cells: Vec<OnceLock<String>>,
}

impl Digests {
    pub fn new(src: &GgufFile) -> Result<Digests, ShardError> {
        let layout = ExpertLayout::of(src)?;
        let cells = (0..layout.n_layer * layout.n_expert).map(|_| OnceLock::new()).collect();
        Ok(Digests { layout, cells })
    }

    /// The digests of `spec`'s experts, layer-major; those not yet known are computed here, in parallel
    /// (every byte of those experts read once).
    pub fn of(&self, src: &GgufFile, spec: &SliceSpec) -> Result<Vec<String>, ShardError> {
        let keys: Vec<(usize, usize)> = spec
            .layers
            .clone()
            .flat_map(|l| spec.experts.clone().map(move |e| (l, e)))
            .collect();
        keys.par_iter().map(|&(l, e)| self.get(src, l, e)).collect()
    }

    fn get(&self, src: &GgufFile, layer: usize, expert: usize) -> Result<String, ShardError> {
        let cell = &self.cells[layer * self.layout.n_expert + expert];
        if let Some(d) = cell.get() {
            return Ok(d.clone());
        }
        let d = self
            .layout
            .carried_digest(src, layer, expert)
            .ok_or_else(|| ShardError::NoExpert {
                path: src.path().to_path_buf(),
                layer,
                expert,
            })?;
        Ok(cell
            .get_or_init(|| blake3::Hash::from_bytes(d).to_hex().to_string())
            .clone())
    }
}

impl Shard {
    /// Plans the shard of `spec` (its digests as [`Digests::of`] gives them).
    pub fn plan(src: &Arc<GgufFile>, spec: &SliceSpec, digests: &Digests) -> Result<Shard, ShardError> {
        Shard::check(src, spec)?;
        Shard::lay_out(src, spec, &digests.layout, digests.of(src, spec)?)
    }

    /// The length in bytes of the shard of `spec`, without reading an expert: every digest is 64 hex
    /// digits, so the header's length does not depend on them. What a node is told to expect, so that a
    /// download longer than its shard is cut off.
    pub fn size(src: &Arc<GgufFile>, spec: &SliceSpec, digests: &Digests) -> Result<u64, ShardError> {
        Shard::check(src, spec)?;
        let n = spec.layers.clone().count() * spec.experts.clone().count();
        Ok(Shard::lay_out(src, spec, &digests.layout, vec!["0".repeat(64); n])?.len)
    }

    /// Whether `src` can give the shard of `spec`.
    fn check(src: &GgufFile, spec: &SliceSpec) -> Result<(), ShardError> {
        let config = Config::from_gguf(src)?;
        if *spec.layers.end() >= config.n_layer || *spec.experts.end() >= config.n_expert {
            return Err(ShardError::OutsideModel {
                layers: spec.layers.clone(),
                experts: spec.experts.clone(),
                n_layer: config.n_layer,
                n_expert: config.n_expert,
            });
        }
        if *spec.layers.start() < config.dense_lead {
            return Err(ShardError::DenseLayers {
                layers: spec.layers.clone(),
                dense: config.dense_lead,
            });
        }
        // Llama 4's dense layers between its MoE ones: a shard's layers are one range, all with experts.
        if let Some(layer) = spec.layers.clone().find(|&l| !config.is_moe(l)) {
            return Err(ShardError::InterleavedDense {
                layers: spec.layers.clone(),
                layer,
                every: config.moe_every,
            });
        }
        Ok(())
    }

    /// The shard of `spec` (checked), its header holding `digests`, one per expert, layer-major.
    fn lay_out(
        src: &Arc<GgufFile>,
        spec: &SliceSpec,
        layout: &ExpertLayout,
        digests: Vec<String>,
    ) -> Result<Shard, ShardError> {
        let mut w = GgufWriter::new();
        for (k, v) in &src.metadata {
            if !k.starts_with("titan.shard.") {
                w.set(k, v.clone());
            }
        }
        w.set(KEY_MODEL, Value::String(ModelIdentity::of(src)?.to_string()));
        let pair = |r: &RangeInclusive<usize>| {
            Value::Array(
                ValueType::U32,
                vec![Value::U32(*r.start() as u32), Value::U32(*r.end() as u32)],
            )
        };
        w.set(KEY_LAYERS, pair(&spec.layers));
        w.set(KEY_EXPERTS, pair(&spec.experts));
        w.set(
            KEY_DIGESTS,
            Value::Array(ValueType::String, digests.iter().cloned().map(Value::String).collect()),
        );
        let count = spec.experts.end() - spec.experts.start() + 1;
        let mut sources = Vec::new();
        for l in spec.layers.clone() {
            let entry = layout.layer(l).ok_or(ShardError::NoExperts(l))?;
            for part in Part::ALL {
                let slice = entry.part(part);
                let (start, per) = entry.range(*spec.experts.start(), part);
                let dims = [slice.cols as u64, slice.rows as u64, count as u64];
                w.add_tensor(&weight_name(l, part), &dims, slice.ty)
                    .map_err(ShardError::io("planning the shard's header"))?;
                sources.push((start as usize, per * count as u64));
            }
            // The bias rows of the same experts (gpt-oss), after the layer's matrices; none for a model
            // without, whose shards stay as they were.
            for (part, b) in entry.biases.iter().flat_map(|b| Part::ALL.map(|p| (p, b))) {
                let row = &b.parts[part as usize];
                let (start, per) = b.range(*spec.experts.start(), part);
                w.add_tensor(&bias_name(l, part), &[row.cols as u64, count as u64], row.ty)
                    .map_err(ShardError::io("planning the shard's header"))?;
                sources.push((start as usize, per * count as u64));
            }
        }
        let mut header = Vec::new();
        w.write_header(&mut header)
            .map_err(ShardError::io("writing the shard's header"))?;
        let mut at = header.len() as u64;
        let align = src.alignment;
        let mut pieces = Vec::with_capacity(sources.len());
        for ((name, size), (start, len)) in w.tensor_sizes().zip(sources) {
            debug_assert_eq!(size, len, "{name}");
            pieces.push((at, start, len));
            at = (at + len).div_ceil(align) * align;
        }
        Ok(Shard {
            src: src.clone(),
            header,
            pieces,
            len: at,
            digests,
        })
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Fills `buf` with the shard's bytes from `offset` (which, with `buf.len()`, must lie inside it).
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) {
        buf.fill(0);
        let end = offset + buf.len() as u64;
        let mut copy = |at: u64, bytes: &[u8]| {
            let (lo, hi) = (at.max(offset), (at + bytes.len() as u64).min(end));
            if lo < hi {
                buf[(lo - offset) as usize..(hi - offset) as usize]
                    .copy_from_slice(&bytes[(lo - at) as usize..(hi - at) as usize]);
            }
        };
        copy(0, &self.header);
        let first = self.pieces.partition_point(|&(at, _, len)| at + len <= offset);
        for &(at, src, len) in &self.pieces[first..] {
            if at >= end {
                break;
            }
            copy(
                at,
                self.src.bytes(src, len as usize).expect("bounds checked when planned"),
            );
        }
    }

    /// Writes the whole shard to `w`, reporting progress in bytes.
    pub fn write_to(&self, w: &mut impl Write, progress: &mut dyn FnMut(u64, u64)) -> std::io::Result<()> {
        let mut buf = vec![0u8; 4 << 20];
        let mut at = 0;
        while at < self.len {
            let n = (self.len - at).min(buf.len() as u64) as usize;
            self.read_at(at, &mut buf[..n]);
            w.write_all(&buf[..n])?;
            at += n as u64;
            progress(at, self.len);
        }
        Ok(())
    }
}

/// Writes the shard of `spec` of `src` to `out`, atomically (a temporary file renamed into place).
pub fn write_shard(
    src: &Arc<GgufFile>,
    spec: &SliceSpec,
    out: &Path,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<u64, ShardError> {
    let shard = Shard::plan(src, spec, &Digests::new(src)?)?;
    let tmp = out.with_extension("part");
    let file = std::fs::File::create(&tmp).map_err(ShardError::io(format!("creating {}", tmp.display())))?;
    let mut f = std::io::BufWriter::new(file);
    shard
        .write_to(&mut f, progress)
        .and_then(|()| f.into_inner().map_err(|e| e.into_error()))
        .and_then(|file| file.sync_all())
        .map_err(ShardError::io(format!("writing {}", tmp.display())))?;
    std::fs::rename(&tmp, out).map_err(ShardError::io(format!(
        "renaming {} to {}",
        tmp.display(),
        out.display()
    )))?;
    Ok(shard.len())
}

/// The experts of a shard file, served in place from its mapping.
pub struct ShardExperts {
    file: GgufFile,
    pub spec: SliceSpec,
    /// The model the shard came from (its identity, `ModelIdentity`'s text).
    pub model: String,
    pub config: Config,
    /// The shard's own tensors: `n_expert` is the count it holds, its first expert being `spec`'s first.
    layout: ExpertLayout,
    /// Q4_0, Q8_0 and MXFP4 tensors regrouped for the SIMD kernels (as a resident model's are), by file offset; their
    /// mapped pages are released, so the node holds each expert once.
    regrouped: std::collections::HashMap<u64, Vec<u8>>,
    /// Every expert's digest as the shard's header gives it, layer-major (checked against the bytes when
    /// opened with `verify`).
    digests: Vec<String>,
    /// The experts' activation, and their bias rows if the shard holds them, decoded to f32 (indexed by
    /// expert as the shard holds them, from 0).
    extras: ExpertExtras,
}

impl ShardExperts {
    /// Opens a shard and checks it: its keys, its tensors' shapes, and (with `verify`) every expert's digest.
    pub fn open(path: &Path, verify: bool) -> Result<ShardExperts, ShardError> {
        let file = GgufFile::open(path)?;
        let bad = |what: String| ShardError::Invalid {
            path: path.to_path_buf(),
            what,
        };
        let model = file
            .get_str(KEY_MODEL)?
            .ok_or_else(|| {
                bad(format!(
                    "not a TITAN shard (no {KEY_MODEL}; write one with titan slice)"
                ))
            })?
            .to_string();
        let range = |key: &str| -> Result<RangeInclusive<usize>, ShardError> {
            match file.get_array(key)? {
                Some([a, b]) => match (a.as_u64(), b.as_u64()) {
                    (Some(a), Some(b)) if a <= b => Ok(a as usize..=b as usize),
                    _ => Err(bad(format!("{key} is not a range"))),
                },
                _ => Err(bad(format!("{key} missing or not two numbers"))),
            }
        };
        let spec = SliceSpec {
            layers: range(KEY_LAYERS)?,
            experts: range(KEY_EXPERTS)?,
        };
        let config = Config::of_part(&file)?;
        if *spec.layers.end() >= config.n_layer || *spec.experts.end() >= config.n_expert {
            return Err(bad(format!(
                "holds layers {:?} × experts {:?} of a model of {} × {}",
                spec.layers, spec.experts, config.n_layer, config.n_expert
            )));
        }
        let count = spec.experts.end() - spec.experts.start() + 1;
        let layout = ExpertLayout::of(&file)?;
        let held: Vec<usize> = layout.layers.iter().map(|l| l.layer).collect();
        if layout.n_expert != count || held != spec.layers.clone().collect::<Vec<_>>() {
            return Err(bad(format!(
                "its tensors hold layers {held:?} × {} experts, its keys say layers {:?} × experts {:?}",
                layout.n_expert, spec.layers, spec.experts
            )));
        }
        let want = [
            (config.n_embd, config.expert_ff),
            (config.n_embd, config.expert_ff),
            (config.expert_ff, config.n_embd),
        ];
        for l in &layout.layers {
            for (part, (cols, rows)) in Part::ALL.into_iter().zip(want) {
                let s = l.part(part);
                if (s.cols, s.rows) != (cols, rows) {
                    return Err(bad(format!(
                        "tensor {} has experts of {}×{}, expected {cols}×{rows}",
                        weight_name(l.layer, part),
                        s.cols,
                        s.rows
                    )));
                }
            }
        }
        let digests = file
            .strings(KEY_DIGESTS)?
            .ok_or_else(|| bad(format!("no {KEY_DIGESTS}")))?;
        if digests.len() != spec.layers.clone().count() * count {
            return Err(bad(format!(
                "{} digests for {} experts",
                digests.len(),
                spec.layers.clone().count() * count
            )));
        }
        // The bias tensors hold the shard's experts only: read them as a model of that many experts.
        let held = Config {
            n_expert: count,
            ..config.clone()
        };
        let extras = ExpertExtras::load(&file, &held)?;
        let mut shard = ShardExperts {
            file,
            spec,
            model,
            config,
            layout,
            regrouped: Default::default(),
            digests,
            extras,
        };
        if verify {
            shard.verify(path)?;
        }
        shard.regroup();
        Ok(shard)
    }

    /// Copies each Q4_0, Q8_0 and MXFP4 tensor into the regrouped layout the SIMD kernels read fastest (the same
    /// bits), one tensor at a time, releasing its mapped pages as it goes.
    fn regroup(&mut self) {
        let n = self.layout.n_expert as u64;
        for l in &self.layout.layers {
            for (s, &start) in l.parts.iter().zip(&l.offsets) {
                let (start, len) = (start as usize, (s.bytes * n) as usize);
                let src = self.file.bytes(start, len).expect("bounds checked by the reader");
                if let Some(buf) = regroup::regrouped(s.ty, s.cols, src) {
                    self.regrouped.insert(start as u64, buf);
                    self.file.release(start, len);
                }
            }
        }
    }

    /// Checks every expert's bytes against its digest; names the first that fails.
    fn verify(&self, path: &Path) -> Result<(), ShardError> {
        let keys: Vec<(usize, usize)> = self
            .spec
            .layers
            .clone()
            .flat_map(|l| self.spec.experts.clone().map(move |e| (l, e)))
            .collect();
        keys.par_iter().zip(&self.digests).try_for_each(|(&(l, e), want)| {
            let [g, u, d] = self.views(l, e).map(|v| v.data);
            let i = e - self.spec.experts.start();
            let biases = self.layout.bias_bytes(&self.file, l, i).into_iter().flatten();
            if blake3::Hash::from_bytes(titan_layout::digest_of([g, u, d].into_iter().chain(biases)))
                .to_hex()
                .as_str()
                != want
            {
                return Err(ShardError::Damaged {
                    path: path.to_path_buf(),
                    layer: l,
                    expert: e,
                });
            }
            Ok(())
        })
    }

    /// The digest the shard's header gives expert `e` of layer `l`, if it holds it.
    pub fn digest(&self, l: usize, e: usize) -> Option<&str> {
        if !self.spec.contains(l, e) {
            return None;
        }
        let width = self.spec.experts.end() - self.spec.experts.start() + 1;
        let i = (l - self.spec.layers.start()) * width + (e - self.spec.experts.start());
        self.digests.get(i).map(String::as_str)
    }

    /// Expert `e` of layer `l`, if this shard holds it.
    pub fn weights(&self, l: usize, e: usize) -> Option<ExpertWeights<'_>> {
        self.spec.contains(l, e).then(|| {
            let [gate, up, down] = self.views(l, e);
            ExpertWeights {
                gate,
                up,
                down,
                bias: self.extras.bias(l, e - self.spec.experts.start()),
                act: self.extras.act,
            }
        })
    }

    /// Gate, up and down of expert `e` of layer `l` (held).
    fn views(&self, l: usize, e: usize) -> [WeightView<'_>; 3] {
        let i = e - self.spec.experts.start();
        let entry = self.layout.layer(l).expect("a held layer");
        Part::ALL.map(|part| {
            let s = entry.part(part);
            let (at, len) = entry.range(i, part);
            let start = entry.offsets[part as usize];
            match self.regrouped.get(&start) {
                Some(buf) => WeightView {
                    ty: s.ty,
                    rows: s.rows,
                    cols: s.cols,
                    data: &buf[(at - start) as usize..(at - start + len) as usize],
                    layout: WeightLayout::Regrouped,
                },
                None => {
                    let data = self
                        .file
                        .bytes(at as usize, len as usize)
                        .expect("bounds checked by the reader");
                    WeightView::new(s.ty, s.rows, s.cols, data).expect("shape checked at open")
                }
            }
        })
    }

    /// The activation format its experts of layer `l` take, if it holds the layer.
    fn input_type(&self, l: usize) -> Option<GgmlType> {
        self.layout.layer(l).map(|e| e.part(Part::Gate).ty.act_type())
    }

    /// Bytes of the experts held.
    pub fn expert_bytes(&self) -> u64 {
        self.file
            .tensors
            .iter()
            .filter(|t| is_expert_tensor(&t.name))
            .map(|t| t.size)
            .sum()
    }
}

/// The experts of several shards of one model, served together (a node's cache).
pub struct Shards {
    pub shards: Vec<ShardExperts>,
    scratch: ScratchPool<ExpertScratch>,
}

impl Shards {
    pub fn new(shards: Vec<ShardExperts>) -> Shards {
        Shards {
            shards,
            scratch: ScratchPool::default(),
        }
    }

    /// What each shard holds: (layers, experts) per shard.
    pub fn holdings(&self) -> Vec<crate::proto::Held> {
        self.shards
            .iter()
            .map(|s| {
                (
                    (*s.spec.layers.start(), *s.spec.layers.end()),
                    (*s.spec.experts.start(), *s.spec.experts.end()),
                )
            })
            .collect()
    }
}

impl Experts for Shards {
    fn input_type(&self, layer: usize) -> Result<GgmlType, EngineError> {
        self.shards
            .iter()
            .find_map(|s| s.input_type(layer))
            .ok_or_else(|| EngineError::Expert {
                layer,
                expert: 0,
                what: "no shard of this node holds the layer".into(),
            })
    }

    fn apply(
        &self,
        job: &ExpertJob,
        meanwhile: &mut dyn FnMut() -> Result<(), EngineError>,
        deliver: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<(), EngineError> {
        meanwhile()?;
        let find = |e: u32| {
            let w = self.shards.iter().find_map(|sh| sh.weights(job.layer, e as usize));
            w.ok_or_else(|| EngineError::Expert {
                layer: job.layer,
                expert: e,
                what: "not in this node's shards".into(),
            })
        };
        if let Some(&e) = job.ids.iter().find(|&&e| find(e).is_err()) {
            return find(e).map(|_| ());
        }
        let batch = job
            .ids
            .iter()
            .enumerate()
            .filter_map(|(i, &e)| Some((i, find(e).ok()?)));
        self.scratch.with(|s| s.compute(job, batch, deliver))
    }
}

/// The fewest rectangles (runs of layers × runs of expert ids) covering `cells`, a set of (layer, expert)
/// given as a per-layer list of held flags: each layer's runs of consecutive experts, merged across
/// consecutive layers with the same run.
pub fn cover(n_layer: usize, n_expert: usize, wanted: impl Fn(usize, usize) -> bool) -> Vec<SliceSpec> {
    let mut open: Vec<SliceSpec> = Vec::new();
    let mut done = Vec::new();
    for l in 0..n_layer {
        let mut runs = Vec::new();
        let mut e = 0;
        while e < n_expert {
            if wanted(l, e) {
                let start = e;
                while e + 1 < n_expert && wanted(l, e + 1) {
                    e += 1;
                }
                runs.push(start..=e);
            }
            e += 1;
        }
        let mut next = Vec::new();
        for r in runs {
            match open.iter().position(|s| s.experts == r && *s.layers.end() + 1 == l) {
                Some(i) => {
                    let s = open.swap_remove(i);
                    next.push(SliceSpec {
                        layers: *s.layers.start()..=l,
                        experts: r,
                    });
                }
                None => next.push(SliceSpec {
                    layers: l..=l,
                    experts: r,
                }),
            }
        }
        done.append(&mut open);
        open = next;
    }
    done.append(&mut open);
    done.sort_by_key(|s| (*s.layers.start(), *s.experts.start()));
    done
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_parse() {
        assert_eq!(parse_range("3-7").unwrap(), 3..=7);
        assert_eq!(parse_range("5").unwrap(), 5..=5);
        assert!(parse_range("7-3").is_err() && parse_range("a-b").is_err());
    }

    #[test]
    fn cover_merges_runs_across_layers() {
        let c = cover(3, 8, |l, e| (2..=4).contains(&e) || (l == 2 && e == 7));
        assert_eq!(
            c,
            [
                SliceSpec {
                    layers: 0..=2,
                    experts: 2..=4
                },
                SliceSpec {
                    layers: 2..=2,
                    experts: 7..=7
                }
            ]
        );
        assert!(cover(2, 4, |_, _| false).is_empty());
        let all = cover(2, 4, |_, _| true);
        assert_eq!(
            all,
            [SliceSpec {
                layers: 0..=1,
                experts: 0..=3
            }]
        );
    }

    /// A gpt-oss shard carries its experts' bias rows: opened (every digest checked), each expert's
    /// biases and activation are the model's own, and its digest is not the matrices' alone.
    #[test]
    fn a_shard_carries_its_experts_biases() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/gpt-oss/q8_0.gguf");
        let src = Arc::new(GgufFile::open(path).unwrap());
        let spec = SliceSpec {
            layers: 1..=2,
            experts: 3..=6,
        };
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("shard.gguf");
        write_shard(&src, &spec, &out, &mut |_, _| {}).unwrap();
        let shard = ShardExperts::open(&out, true).unwrap();
        let model = ExpertExtras::load(&src, &Config::from_gguf(&src).unwrap()).unwrap();
        let layout = ExpertLayout::of(&src).unwrap();
        for l in spec.layers.clone() {
            for e in spec.experts.clone() {
                let w = shard.weights(l, e).unwrap();
                let (got, want) = (w.bias.unwrap(), model.bias(l, e).unwrap());
                assert_eq!((got.gate, got.up, got.down), (want.gate, want.up, want.down));
                assert_eq!(w.act, model.act);
                let matrices = blake3::Hash::from_bytes(layout.digest(&src, l, e).unwrap());
                assert_ne!(shard.digest(l, e), Some(matrices.to_hex().as_str()));
            }
        }
    }

    #[test]
    fn any_window_of_a_shard_reads_as_the_whole() {
        let src = Arc::new(
            GgufFile::open(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../tests/fixtures/qwen3moe/q8_0.gguf"
            ))
            .unwrap(),
        );
        let shard = Shard::plan(
            &src,
            &SliceSpec {
                layers: 1..=1,
                experts: 2..=5,
            },
            &Digests::new(&src).unwrap(),
        )
        .unwrap();
        let spec = SliceSpec {
            layers: 1..=1,
            experts: 2..=5,
        };
        assert_eq!(
            Shard::size(&src, &spec, &Digests::new(&src).unwrap()).unwrap(),
            shard.len()
        );
        let mut whole = vec![0u8; shard.len() as usize];
        shard.read_at(0, &mut whole);
        for (off, len) in [
            (0, 7),
            (100, 5000),
            (shard.len() - 33, 33),
            (shard.header.len() as u64 - 3, 9),
        ] {
            let mut part = vec![0u8; len as usize];
            shard.read_at(off, &mut part);
            assert_eq!(part, whole[off as usize..(off + len) as usize], "window at {off}");
        }
    }
}
