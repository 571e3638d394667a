//! Golden traces: what happened inside a run, step by step and layer by layer, and the exact diff of two.
//!
//! A trace is a safetensors file (readable from NumPy/PyTorch without TITAN). Each record is one named
//! tensor of one step (a forward call: step 0 is the prompt, then one per generated token) and, for
//! per-layer tensors, one layer: `s0003.l012.moe_out`. Records are either *tensors* (values) or
//! *decisions* (discrete choices: top-k expert ids, the sampled token). The safetensors metadata holds,
//! as JSON strings, the model's identity (`titan.model`), the run's options (`titan.options`), and the
//! records in the order they were produced with their kind and BLAKE3 digest (`titan.records`).

use std::collections::HashMap;
use std::path::Path;

use safetensors::tensor::{Dtype, TensorView};
use safetensors::SafeTensors;
use serde_json::{json, Value};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Tensor,
    Decision,
}

#[derive(Clone, Debug)]
pub struct Record {
    pub name: String,
    pub kind: Kind,
    /// f32 values (tensors) or u32 values (decisions), little-endian.
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

/// The digest TITAN records for a byte string: BLAKE3, first 128 bits in hex.
pub fn digest(bytes: &[u8]) -> String {
    blake3::hash(bytes).to_hex()[..32].to_string()
}

impl Record {
    /// The step and layer the record's name gives (`s0003.l012.moe_out`: 3 and 12; no layer for a
    /// step's own records), and the name of what it holds.
    pub fn place(&self) -> Option<(usize, Option<usize>, &str)> {
        let (step, rest) = self.name.strip_prefix('s')?.split_once('.')?;
        let step = step.parse().ok()?;
        let layer = rest.strip_prefix('l').and_then(|r| r.split_once('.'));
        Some(match layer.and_then(|(l, what)| Some((l.parse().ok()?, what))) {
            Some((l, what)) => (step, Some(l), what),
            None => (step, None, rest),
        })
    }

    pub fn digest(&self) -> String {
        digest(&self.data)
    }
    pub fn len(&self) -> usize {
        self.data.len() / 4
    }
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
    pub fn f32s(&self) -> impl Iterator<Item = f32> + '_ {
        self.data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
    }
    pub fn u32s(&self) -> impl Iterator<Item = u32> + '_ {
        self.data
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("{path}: {error}")]
    Io { path: String, error: std::io::Error },
    #[error("{path}: not a TITAN trace: {what}")]
    Format { path: String, what: String },
}

/// A trace being recorded or read back.
#[derive(Default)]
pub struct Trace {
    step: usize,
    pub records: Vec<Record>,
    /// Model identity and run options, as JSON.
    pub model: Value,
    pub options: Value,
}

impl Trace {
    pub fn new(model: Value, options: Value) -> Trace {
        Trace {
            step: 0,
            records: Vec::new(),
            model,
            options,
        }
    }

    /// Called by the forward pass at the end of each step.
    pub fn next_step(&mut self) {
        self.step += 1;
    }

    fn name(&self, layer: Option<usize>, what: &str) -> String {
        match layer {
            Some(l) => format!("s{:04}.l{l:03}.{what}", self.step),
            None => format!("s{:04}.{what}", self.step),
        }
    }

    pub fn tensor(&mut self, layer: Option<usize>, what: &str, shape: &[usize], data: &[f32]) {
        let name = self.name(layer, what);
        let data = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.records.push(Record {
            name,
            kind: Kind::Tensor,
            dtype: Dtype::F32,
            shape: shape.to_vec(),
            data,
        });
    }

    pub fn decision(&mut self, layer: Option<usize>, what: &str, shape: &[usize], data: &[u32]) {
        let name = self.name(layer, what);
        let data = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.records.push(Record {
            name,
            kind: Kind::Decision,
            dtype: Dtype::U32,
            shape: shape.to_vec(),
            data,
        });
    }

    /// Row `row` of every record of `from` (a step of several rows, recorded by itself) as a record of this
    /// trace's current step: what a step of that row alone records, since every step is row-independent.
    /// A speculative step is written this way, one step per token it kept, as plain decoding writes it.
    pub fn append_row(&mut self, from: &Trace, row: usize) {
        for r in &from.records {
            let Some((_, layer, what)) = r.place() else { continue };
            let per_row = r.data.len() / r.shape[0].max(1);
            let mut shape = r.shape.clone();
            shape[0] = 1;
            self.records.push(Record {
                name: self.name(layer, what),
                kind: r.kind,
                dtype: r.dtype,
                shape,
                data: r.data[row * per_row..(row + 1) * per_row].to_vec(),
            });
        }
    }

    /// The sampled token closes the step that produced its logits.
    pub fn token(&mut self, id: u32) {
        self.decision(None, "token", &[1], &[id]);
    }

    pub fn write(&self, path: &Path) -> Result<(), TraceError> {
        let io = |error| TraceError::Io {
            path: path.display().to_string(),
            error,
        };
        let index: Vec<Value> = self
            .records
            .iter()
            .map(|r| json!({"name": r.name, "kind": if r.kind == Kind::Tensor { "tensor" } else { "decision" }, "digest": r.digest()}))
            .collect();
        let meta = HashMap::from([
            ("format".to_string(), "titan-trace-1".to_string()),
            ("titan.model".to_string(), self.model.to_string()),
            ("titan.options".to_string(), self.options.to_string()),
            ("titan.records".to_string(), Value::Array(index).to_string()),
        ]);
        let views: Vec<(String, TensorView<'_>)> = self
            .records
            .iter()
            .map(|r| {
                (
                    r.name.clone(),
                    TensorView::new(r.dtype, r.shape.clone(), &r.data).expect("shape matches data"),
                )
            })
            .collect();
        let bytes = safetensors::serialize(views, Some(meta)).map_err(|e| io(std::io::Error::other(e)))?;
        // Write beside and rename, so an interrupted run never leaves a half trace under the final name.
        let tmp = path.with_extension("trace.partial");
        std::fs::write(&tmp, bytes).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)
    }

    pub fn read(path: &Path) -> Result<Trace, TraceError> {
        let p = path.display().to_string();
        let bad = |what: String| TraceError::Format { path: p.clone(), what };
        let bytes = std::fs::read(path).map_err(|error| TraceError::Io { path: p.clone(), error })?;
        let (_, header) = SafeTensors::read_metadata(&bytes).map_err(|e| bad(format!("safetensors header: {e}")))?;
        let meta = header.metadata().clone().ok_or_else(|| bad("no metadata".into()))?;
        let get = |k: &str| -> Result<Value, TraceError> {
            let s = meta.get(k).ok_or_else(|| bad(format!("metadata has no {k}")))?;
            serde_json::from_str(s).map_err(|e| bad(format!("metadata {k}: {e}")))
        };
        let st = SafeTensors::deserialize(&bytes).map_err(|e| bad(format!("safetensors: {e}")))?;
        let index = get("titan.records")?;
        let mut records = Vec::new();
        for entry in index
            .as_array()
            .ok_or_else(|| bad("titan.records is not a list".into()))?
        {
            let name = entry["name"]
                .as_str()
                .ok_or_else(|| bad("record without a name".into()))?;
            let kind = if entry["kind"] == "decision" {
                Kind::Decision
            } else {
                Kind::Tensor
            };
            let view = st.tensor(name).map_err(|e| bad(format!("record {name}: {e}")))?;
            let r = Record {
                name: name.to_string(),
                kind,
                dtype: view.dtype(),
                shape: view.shape().to_vec(),
                data: view.data().to_vec(),
            };
            if !matches!(r.dtype, Dtype::F32 | Dtype::U32) {
                return Err(bad(format!("record {name} has dtype {:?}", r.dtype)));
            }
            if entry["digest"].as_str() != Some(r.digest().as_str()) {
                return Err(bad(format!(
                    "record {name} does not match its digest (the file is damaged)"
                )));
            }
            records.push(r);
        }
        Ok(Trace {
            step: 0,
            records,
            model: get("titan.model")?,
            options: get("titan.options")?,
        })
    }
}

/// How two runs compare.
#[derive(Debug)]
pub struct DiffReport {
    pub tensors: usize,
    pub elements: usize,
    pub decisions: usize,
    pub first_tensor: Option<TensorDivergence>,
    pub first_decision: Option<String>,
    /// Records present in one trace only, or with different shapes.
    pub structural: Option<String>,
}

#[derive(Debug)]
pub struct TensorDivergence {
    pub name: String,
    pub differing: usize,
    pub elements: usize,
    pub max_abs: f32,
    pub max_ulp: u64,
}

impl DiffReport {
    pub fn identical(&self) -> bool {
        self.first_tensor.is_none() && self.first_decision.is_none() && self.structural.is_none()
    }
}

/// Distance in units in the last place, with -0 == +0 (ordered-integer mapping of the f32 bits).
pub fn ulp_distance(a: f32, b: f32) -> u64 {
    fn ordered(x: f32) -> i64 {
        let b = x.to_bits();
        if b & 0x8000_0000 != 0 {
            -((b & 0x7fff_ffff) as i64)
        } else {
            b as i64
        }
    }
    ordered(a).abs_diff(ordered(b))
}

/// Compare `b` against `a` record by record in `a`'s order. With `tolerance` None, tensors must be equal
/// bit for bit; otherwise an element differs when |a − b| > tolerance (or exactly one of them is NaN).
pub fn diff(a: &Trace, b: &Trace, tolerance: Option<f32>) -> DiffReport {
    let by_name: HashMap<&str, &Record> = b.records.iter().map(|r| (r.name.as_str(), r)).collect();
    let mut rep = DiffReport {
        tensors: 0,
        elements: 0,
        decisions: 0,
        first_tensor: None,
        first_decision: None,
        structural: None,
    };
    if a.records.len() != b.records.len() {
        rep.structural = Some(format!(
            "the traces have {} and {} records",
            a.records.len(),
            b.records.len()
        ));
    }
    for ra in &a.records {
        let Some(rb) = by_name.get(ra.name.as_str()) else {
            rep.structural
                .get_or_insert(format!("{} is missing from the second trace", ra.name));
            continue;
        };
        if ra.shape != rb.shape || ra.kind != rb.kind || ra.dtype != rb.dtype {
            rep.structural
                .get_or_insert(format!("{}: shape {:?} vs {:?}", ra.name, ra.shape, rb.shape));
            continue;
        }
        match ra.kind {
            Kind::Decision => {
                rep.decisions += 1;
                if ra.data != rb.data && rep.first_decision.is_none() {
                    let (x, y): (Vec<u32>, Vec<u32>) = (ra.u32s().collect(), rb.u32s().collect());
                    let i = x.iter().zip(&y).position(|(p, q)| p != q).unwrap_or(0);
                    rep.first_decision = Some(format!("{} [{}]: {} vs {}", ra.name, i, x[i], y[i]));
                }
            }
            Kind::Tensor => {
                rep.tensors += 1;
                rep.elements += ra.len();
                if ra.data == rb.data || rep.first_tensor.is_some() {
                    continue;
                }
                let (mut differing, mut max_abs, mut max_ulp) = (0, 0f32, 0u64);
                for (x, y) in ra.f32s().zip(rb.f32s()) {
                    let differs = match tolerance {
                        None => x.to_bits() != y.to_bits(),
                        Some(t) => x.is_nan() != y.is_nan() || (x - y).abs() > t,
                    };
                    if differs {
                        differing += 1;
                    }
                    if x.to_bits() != y.to_bits() {
                        max_abs = max_abs.max((x - y).abs());
                        max_ulp = max_ulp.max(ulp_distance(x, y));
                    }
                }
                if differing > 0 {
                    rep.first_tensor = Some(TensorDivergence {
                        name: ra.name.clone(),
                        differing,
                        elements: ra.len(),
                        max_abs,
                        max_ulp,
                    });
                }
            }
        }
    }
    rep
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Trace {
        let mut t = Trace::new(json!({"file": "m.gguf"}), json!({"threads": 1}));
        t.tensor(Some(0), "moe_out", &[2, 2], &[1.0, 2.0, 3.0, 4.0]);
        t.decision(Some(0), "topk_ids", &[2, 1], &[3, 5]);
        t.tensor(None, "logits", &[1, 3], &[0.5, -0.5, 0.0]);
        t.token(2);
        t.next_step();
        t.tensor(Some(0), "moe_out", &[1, 2], &[9.0, 8.0]);
        t
    }

    #[test]
    fn write_read_round_trip_is_identical() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.trace");
        sample().write(&p).unwrap();
        let back = Trace::read(&p).unwrap();
        assert_eq!(back.records.len(), 5);
        assert_eq!(back.records[4].name, "s0001.l000.moe_out");
        let rep = diff(&sample(), &back, None);
        assert!(rep.identical(), "{rep:?}");
        assert_eq!((rep.tensors, rep.elements, rep.decisions), (3, 9, 2));
    }

    #[test]
    fn one_flipped_bit_is_found_where_it_is() {
        let a = sample();
        let mut b = sample();
        b.records[4].data[0] ^= 1; // lowest mantissa bit of s0001.l000.moe_out[0]
        let rep = diff(&a, &b, None);
        let d = rep.first_tensor.expect("a divergence");
        assert_eq!((d.name.as_str(), d.differing, d.max_ulp), ("s0001.l000.moe_out", 1, 1));
        assert!(rep.first_decision.is_none());
        // within a tolerance the same traces agree
        assert!(diff(&a, &b, Some(1e-5)).identical());
    }

    #[test]
    fn decisions_are_reported() {
        let a = sample();
        let mut b = sample();
        b.records[1].data[4] = 6; // second row's expert 5 -> 6
        let rep = diff(&a, &b, None);
        assert_eq!(rep.first_decision.as_deref(), Some("s0000.l000.topk_ids [1]: 5 vs 6"));
    }

    #[test]
    fn ulp_distance_crosses_zero() {
        assert_eq!(ulp_distance(0.0, -0.0), 0);
        assert_eq!(ulp_distance(f32::from_bits(1), -f32::from_bits(1)), 2);
        assert_eq!(ulp_distance(1.0, f32::from_bits(1.0f32.to_bits() + 3)), 3);
    }

    #[test]
    fn damaged_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.trace");
        sample().write(&p).unwrap();
        let mut bytes = std::fs::read(&p).unwrap();
        let n = bytes.len();
        bytes[n - 1] ^= 0x40;
        std::fs::write(&p, &bytes).unwrap();
        let e = Trace::read(&p).err().expect("an error").to_string();
        assert!(e.contains("does not match its digest"), "{e}");
        std::fs::write(&p, b"nonsense").unwrap();
        assert!(Trace::read(&p).is_err());
    }
}
