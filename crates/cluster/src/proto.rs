//! The messages of the data plane, inside `titan_net` frames.
//!
//! Hello / Welcome (JSON): the backbone's token and the model it runs; the node's model, budget and
//! what it holds. Compute (binary): one layer's rows and the experts to apply to them —
//!
//! ```text
//! u32 layer, u32 activation type (GGML id), u32 cols, u32 rows, rows × row_bytes encoded rows,
//! u32 experts, then per expert: u32 id, u32 n, n × u32 row indices (into the rows above)
//! ```
//!
//! Output (binary): `u32 experts, u32 cols`, then each expert's output rows (f32, in the order of its
//! row indices), expert after expert in the request's order.
//!
//! Rows (binary): dense products split by output rows (the projections, the LM head) —
//!
//! ```text
//! u32 inputs, then per input: u32 activation type, u32 cols, u32 rows, rows × row_bytes encoded rows;
//! u32 jobs, then per job: u64 file offset of its first weight row, u32 weight type, u32 weight rows,
//! u32 cols, u32 input
//! ```
//!
//! RowsOutput (binary): per job, the input's rows × the job's weight rows, f32, as `matmul` lays them out.

use serde::{Deserialize, Serialize};
use titan_engine::experts::ExpertJob;
use titan_kernels::{Activations, GgmlType};
use titan_net::{PayloadError, PayloadReader, PayloadWriter};

/// `v` as a JSON frame body.
pub fn json(v: &impl Serialize, what: &'static str) -> Result<Vec<u8>, crate::ExchangeError> {
    serde_json::to_vec(v).map_err(|error| crate::ExchangeError::Json { what, error })
}

/// The backbone's first frame: no secret, only what a node checks and answers (`auth`).
#[derive(Serialize, Deserialize)]
pub struct Hello {
    /// The model the backbone runs (its identity); a node with another model refuses.
    pub model: String,
    /// The backbone's fresh nonce, hex.
    pub nonce: String,
    /// Whether the connection's frames are encrypted (else authenticated only).
    #[serde(default)]
    pub encrypt: bool,
}

/// The node's answer: its nonce and its proof that it knows the token, hex.
#[derive(Serialize, Deserialize)]
pub struct Challenge {
    pub nonce: String,
    pub proof: String,
}

/// The backbone's proof that it knows the token, hex.
#[derive(Serialize, Deserialize)]
pub struct Proof {
    pub proof: String,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Welcome {
    pub model: String,
    /// Bytes of experts the node offers to hold.
    pub budget: u64,
    pub n_layer: usize,
    pub n_expert: usize,
    /// Kernels the node computes with (informational: every ISA gives the same bits).
    pub isa: String,
    pub threads: usize,
    /// The layers and experts of each shard the node holds; `None`: the whole model.
    #[serde(default)]
    pub holds: Option<Vec<Held>>,
    /// Whether the node computes shares of dense products split by output rows (it holds the whole
    /// model's weights).
    #[serde(default)]
    pub rows: bool,
    /// Bytes of quantised weights the node multiplies by one row per second (`calibrate`); 0: unknown.
    #[serde(default)]
    pub speed: f64,
}

/// A rectangle of a model's experts: ((first layer, last layer), (first expert, last expert)), inclusive.
pub type Held = ((usize, usize), (usize, usize));

/// What a node checks a request against.
#[derive(Clone, Copy)]
pub struct Shape {
    pub n_layer: usize,
    pub n_expert: usize,
    pub n_embd: usize,
}

/// A decoded Compute request, its buffers reused from one request to the next.
#[derive(Default)]
pub struct Compute {
    pub layer: usize,
    pub input: Activations,
    pub ids: Vec<u32>,
    pub rows: Vec<usize>,
    pub starts: Vec<usize>,
}

impl Compute {
    pub fn job(&self) -> ExpertJob<'_> {
        ExpertJob {
            layer: self.layer,
            input: &self.input,
            ids: &self.ids,
            rows: &self.rows,
            starts: &self.starts,
        }
    }

    /// Decodes `body`, checking every field against `shape`: a request that names a layer, an expert
    /// or a row that does not exist, repeats an expert, or carries more or fewer bytes than it
    /// declares is refused with the reason.
    pub fn decode(&mut self, body: &[u8], shape: Shape) -> Result<(), PayloadError> {
        let mut r = PayloadReader::new("compute request", body);
        let layer = r.u32()? as usize;
        if layer >= shape.n_layer {
            return Err(r.error(format!("layer {layer} of a {}-layer model", shape.n_layer)));
        }
        let ty = r.u32()?;
        let act_ty = GgmlType::from_id(ty)
            .filter(|t| t.is_act_type())
            .ok_or_else(|| r.error(format!("type {ty} is not an activation format")))?;
        let cols = r.u32()? as usize;
        if cols != shape.n_embd {
            return Err(r.error(format!("rows of {cols} elements, the model's are {}", shape.n_embd)));
        }
        let row_bytes = act_ty
            .row_bytes(cols)
            .filter(|&b| b > 0)
            .ok_or_else(|| r.error(format!("{cols} is not a whole number of {} blocks", act_ty.name())))?;
        let n_rows = r.count(row_bytes)?;
        let data = r.bytes(n_rows * row_bytes)?;
        self.input
            .set_encoded(act_ty, cols, n_rows, data)
            .map_err(|e| r.error(e.to_string()))?;
        let n_experts = r.count(8)?;
        if n_experts > shape.n_expert {
            return Err(r.error(format!("{n_experts} experts of a layer of {}", shape.n_expert)));
        }
        self.ids.clear();
        self.rows.clear();
        self.starts.clear();
        self.starts.push(0);
        for _ in 0..n_experts {
            let id = r.u32()?;
            if id as usize >= shape.n_expert || self.ids.last().is_some_and(|&last| id <= last) {
                return Err(r.error(format!(
                    "expert {id} out of range or order (layer of {} experts, ids ascending)",
                    shape.n_expert
                )));
            }
            let n = r.count(4)?;
            for _ in 0..n {
                let row = r.u32()? as usize;
                if row >= n_rows {
                    return Err(r.error(format!("row {row} of {n_rows}")));
                }
                self.rows.push(row);
            }
            self.ids.push(id);
            self.starts.push(self.rows.len());
        }
        self.layer = layer;
        r.finish()
    }
}

/// One product of a Rows request: rows of a matrix of the model file (`start` is the file offset of its
/// first row) times one of the request's inputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowsJob {
    pub start: u64,
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub input: usize,
}

/// A decoded Rows request, its buffers reused from one request to the next.
#[derive(Default)]
pub struct RowsRequest {
    pub inputs: Vec<Activations>,
    pub jobs: Vec<RowsJob>,
}

/// Most inputs one Rows request carries (a step's projections quantise their input once per format).
const MAX_INPUTS: usize = 8;

impl RowsRequest {
    /// Decodes `body`: every input a whole number of rows of an activation format `n_embd`… wide
    /// (`max_cols` at most), every job naming an input that exists. Whether a job's rows are a matrix of
    /// the node's model is the caller's check.
    pub fn decode(&mut self, body: &[u8], max_cols: usize) -> Result<(), PayloadError> {
        let mut r = PayloadReader::new("rows request", body);
        let n_inputs = r.count(12)?;
        if n_inputs == 0 || n_inputs > MAX_INPUTS {
            return Err(r.error(format!("{n_inputs} inputs (1..={MAX_INPUTS})")));
        }
        if self.inputs.len() < n_inputs {
            self.inputs.resize_with(n_inputs, Activations::new);
        }
        for input in &mut self.inputs[..n_inputs] {
            let ty = r.u32()?;
            let act_ty = GgmlType::from_id(ty)
                .filter(|t| t.is_act_type())
                .ok_or_else(|| r.error(format!("type {ty} is not an activation format")))?;
            let cols = r.u32()? as usize;
            if cols == 0 || cols > max_cols {
                return Err(r.error(format!("rows of {cols} elements, at most {max_cols}")));
            }
            let row_bytes = act_ty
                .row_bytes(cols)
                .filter(|&b| b > 0)
                .ok_or_else(|| r.error(format!("{cols} is not a whole number of {} blocks", act_ty.name())))?;
            let n_rows = r.count(row_bytes)?;
            let data = r.bytes(n_rows * row_bytes)?;
            input
                .set_encoded(act_ty, cols, n_rows, data)
                .map_err(|e| r.error(e.to_string()))?;
        }
        self.inputs.truncate(n_inputs);
        let n_jobs = r.count(24)?;
        self.jobs.clear();
        for _ in 0..n_jobs {
            let start = r.u64()?;
            let ty = r.u32()?;
            let ty = GgmlType::from_id(ty).ok_or_else(|| r.error(format!("unknown weight type {ty}")))?;
            let (rows, cols, input) = (r.u32()? as usize, r.u32()? as usize, r.u32()? as usize);
            if input >= n_inputs || self.inputs[input].cols() != cols || rows == 0 {
                return Err(r.error(format!("a job of {rows} rows × {cols} on input {input} of {n_inputs}")));
            }
            self.jobs.push(RowsJob {
                start,
                ty,
                rows,
                cols,
                input,
            });
        }
        r.finish()
    }

    /// Floats of the answer: per job, its input's rows × its weight rows.
    pub fn output_len(&self) -> usize {
        self.jobs.iter().map(|j| self.inputs[j.input].rows() * j.rows).sum()
    }
}

/// Encodes a Rows request into `body`: `inputs`, whole, then the jobs.
pub fn encode_rows<'a>(body: &mut Vec<u8>, inputs: &[&Activations], jobs: impl Iterator<Item = &'a RowsJob>) {
    body.clear();
    let mut w = PayloadWriter(body);
    w.u32(inputs.len() as u32);
    for a in inputs {
        w.u32(a.act_type().id()).u32(a.cols() as u32).u32(a.rows() as u32);
        w.bytes(a.encoded());
    }
    let at = w.0.len();
    w.u32(0);
    let mut n = 0u32;
    for j in jobs {
        w.u64(j.start)
            .u32(j.ty.id())
            .u32(j.rows as u32)
            .u32(j.cols as u32)
            .u32(j.input as u32);
        n += 1;
    }
    body[at..at + 4].copy_from_slice(&n.to_le_bytes());
}

/// Decodes a RowsOutput body of exactly `len` floats into `out`.
pub fn decode_rows_output(body: &[u8], len: usize, out: &mut Vec<f32>) -> Result<(), PayloadError> {
    let mut r = PayloadReader::new("rows output", body);
    let data = r.bytes(len * 4)?;
    r.finish()?;
    out.clear();
    out.extend(
        data.chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes"))),
    );
    Ok(())
}

/// Encodes a Compute request into `body`: rows `rows` of `input` (in that order) and, per expert, its
/// id and its rows as indices into that list.
pub fn encode_compute<'a>(
    body: &mut Vec<u8>,
    layer: usize,
    input: &Activations,
    rows: &[usize],
    experts: impl ExactSizeIterator<Item = (u32, &'a [u32])>,
) {
    body.clear();
    let mut w = PayloadWriter(body);
    w.u32(layer as u32)
        .u32(input.act_type().id())
        .u32(input.cols() as u32)
        .u32(rows.len() as u32);
    for &r in rows {
        w.bytes(input.row(r));
    }
    w.u32(experts.len() as u32);
    for (id, local_rows) in experts {
        w.u32(id).u32(local_rows.len() as u32);
        for &r in local_rows {
            w.u32(r);
        }
    }
}

/// Starts an Output body for `experts` experts of `cols`-wide rows holding `total_rows` rows in all;
/// [`write_output`] then fills each expert's place.
pub fn start_output(body: &mut Vec<u8>, experts: usize, cols: usize, total_rows: usize) {
    body.clear();
    PayloadWriter(body).u32(experts as u32).u32(cols as u32);
    body.resize(8 + total_rows * cols * 4, 0);
}

/// Writes `y` at row `first_row` of an Output body.
pub fn write_output(body: &mut [u8], cols: usize, first_row: usize, y: &[f32]) {
    let at = 8 + first_row * cols * 4;
    for (dst, v) in body[at..at + y.len() * 4].chunks_exact_mut(4).zip(y) {
        dst.copy_from_slice(&v.to_le_bytes());
    }
}

/// Decodes an Output body that must answer `counts[i]` rows for each expert `i`, into `out` (all rows,
/// expert after expert).
pub fn decode_output(
    body: &[u8],
    counts: impl Iterator<Item = usize> + Clone,
    cols: usize,
    out: &mut Vec<f32>,
) -> Result<(), PayloadError> {
    let mut r = PayloadReader::new("expert output", body);
    let (experts, got_cols) = (r.u32()? as usize, r.u32()? as usize);
    let total: usize = counts.clone().sum();
    if experts != counts.count() || got_cols != cols {
        return Err(r.error(format!(
            "{experts} experts of {got_cols} columns, asked for {} of {cols}",
            experts
        )));
    }
    let data = r.bytes(total * cols * 4)?;
    r.finish()?;
    out.clear();
    out.extend(
        data.chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes"))),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> Shape {
        Shape {
            n_layer: 2,
            n_expert: 8,
            n_embd: 64,
        }
    }

    fn request() -> (Activations, Vec<u8>) {
        let x: Vec<f32> = (0..3 * 64).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut input = Activations::new();
        input.quantize(GgmlType::Q8_0, &x, 3, 64).unwrap();
        let mut body = Vec::new();
        encode_compute(
            &mut body,
            1,
            &input,
            &[2, 0],
            [(3u32, &[0u32, 1][..]), (6, &[1][..])].into_iter(),
        );
        (input, body)
    }

    #[test]
    fn compute_round_trip() {
        let (input, body) = request();
        let mut c = Compute::default();
        c.decode(&body, shape()).unwrap();
        assert_eq!(
            (c.layer, &c.ids[..], &c.rows[..], &c.starts[..]),
            (1, &[3, 6][..], &[0, 1, 1][..], &[0, 2, 3][..])
        );
        assert_eq!(c.input.row(0), input.row(2));
        assert_eq!(c.input.row(1), input.row(0));
    }

    #[test]
    fn every_truncation_and_bad_field_is_refused() {
        let (_, body) = request();
        let mut c = Compute::default();
        for n in 0..body.len() {
            assert!(c.decode(&body[..n], shape()).is_err(), "truncated at {n} accepted");
        }
        let mut longer = body.clone();
        longer.push(0);
        assert!(c
            .decode(&longer, shape())
            .unwrap_err()
            .to_string()
            .contains("left over"));
        for (field, value, why) in [
            (0, 2, "layer 2"),
            (4, 2, "not an activation format"),
            (8, 32, "rows of 32"),
            (12, 1000, "declares 1000"),
        ] {
            let mut b = body.clone();
            b[field..field + 4].copy_from_slice(&(value as u32).to_le_bytes());
            let e = c.decode(&b, Shape { ..shape() }).unwrap_err().to_string();
            assert!(e.contains(why), "{e}");
        }
        let experts_at = 16 + 2 * 68;
        let mut b = body.clone();
        b[experts_at + 4..experts_at + 8].copy_from_slice(&9u32.to_le_bytes());
        assert!(c.decode(&b, shape()).unwrap_err().to_string().contains("expert 9"));
    }

    #[test]
    fn output_round_trip() {
        let mut body = Vec::new();
        start_output(&mut body, 2, 4, 3);
        write_output(&mut body, 4, 1, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
        write_output(&mut body, 4, 0, &[-1.0, -2.0, -3.0, -4.0]);
        let mut out = Vec::new();
        decode_output(&body, [1, 2].into_iter(), 4, &mut out).unwrap();
        assert_eq!(out, [-1.0, -2.0, -3.0, -4.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
        assert!(decode_output(&body, [1, 1].into_iter(), 4, &mut out).is_err());
        assert!(decode_output(&body[..20], [1, 2].into_iter(), 4, &mut out).is_err());
    }
}
