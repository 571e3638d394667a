//! Weight matrices borrowed from a GGUF mapping, activations quantised once per use, and the matrix
//! multiply that combines them.

use rayon::prelude::*;

use crate::simd::{self, ActLayout, DotKernel, MAX_ROWS};
use crate::Isa;
use crate::{checked_row_bytes, dequantize_blocks, grouped, isa, GgmlType, KernelError};

/// Weight bytes handed to one rayon task at a time (at least one row). Decode streams weights at
/// roughly 10 GB/s per core, so this is a couple of microseconds of work: enough that scheduling does
/// not dominate, small enough that a 768-row expert still splits into dozens of tasks for two
/// threads to share. The split never changes a result: each output is computed whole by one task.
const TASK_WEIGHT_BYTES: usize = 16 * 1024;

/// A weight matrix in its GGUF encoding: `rows` rows of `cols` elements; row `r` is
/// `data[r * row_bytes .. (r + 1) * row_bytes]`. Borrowed (zero-copy from an mmap, or a copy regrouped
/// at load).
#[derive(Clone, Copy, Debug)]
pub struct WeightView<'a> {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub data: &'a [u8],
    pub layout: WeightLayout,
}

/// How a weight row's blocks are laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightLayout {
    /// As in the GGUF file.
    Plain,
    /// Q4_0, Q8_0 or MXFP4 regrouped for the SIMD kernels by [`regroup_weights`]: the same bytes per row,
    /// each group of eight blocks' scales first and quants transposed.
    Regrouped,
}

/// `src` (`rows` × `cols` of `ty`, plain) regrouped into `dst` for the SIMD Q4_0, Q8_0 and MXFP4 kernels, rows in
/// parallel; `false` (and `dst` untouched) when the type or row length cannot be regrouped. Results
/// are the same bits as with the plain rows.
pub fn regroup_weights(ty: GgmlType, cols: usize, src: &[u8], dst: &mut [u8]) -> bool {
    let Some(row_bytes) = regroupable_row_bytes(ty, cols, src, dst) else {
        return false;
    };
    dst.par_chunks_mut(row_bytes)
        .zip(src.par_chunks(row_bytes))
        .for_each(|(d, s)| grouped::regroup_weights(ty, row_bytes, s, d));
    true
}

/// [`regroup_weights`] of `data` in place, on the calling thread: for an I/O thread, which must leave
/// the compute threads to the computation.
pub fn regroup_weights_in_place(ty: GgmlType, cols: usize, data: &mut [u8]) -> bool {
    let Some(row_bytes) = regroupable_row_bytes(ty, cols, data, data) else {
        return false;
    };
    grouped::regroup_weights_in_place(ty, row_bytes, data);
    true
}

fn regroupable_row_bytes(ty: GgmlType, cols: usize, src: &[u8], dst: &[u8]) -> Option<usize> {
    let row_bytes = ty.row_bytes(cols)?;
    let whole = grouped::weights_regroupable(ty, cols) && src.len() == dst.len() && src.len().is_multiple_of(row_bytes);
    whole.then_some(row_bytes)
}

impl<'a> WeightView<'a> {
    /// Checks that `cols` is a whole number of blocks and that `data` holds exactly `rows` rows.
    pub fn new(ty: GgmlType, rows: usize, cols: usize, data: &'a [u8]) -> Result<Self, KernelError> {
        let view = WeightView {
            ty,
            rows,
            cols,
            data,
            layout: WeightLayout::Plain,
        };
        view.check()?;
        Ok(view)
    }

    /// The checks of [`WeightView::new`], repeated by [`matmul`] because the fields are public.
    fn check(&self) -> Result<(), KernelError> {
        let row_bytes = checked_row_bytes(self.ty, self.cols)?;
        let expected = row_bytes.checked_mul(self.rows).ok_or(KernelError::TooLarge {
            what: "weight matrix",
            rows: self.rows,
            cols: self.cols,
        })?;
        if self.data.len() != expected {
            return Err(KernelError::SizeMismatch {
                what: "weight data",
                unit: "bytes",
                expected,
                actual: self.data.len(),
            });
        }
        Ok(())
    }

    /// Bytes per row.
    pub fn row_bytes(&self) -> usize {
        self.cols / self.ty.block_len() * self.ty.block_bytes()
    }

    /// The encoded bytes of row `r`.
    ///
    /// # Panics
    ///
    /// If `r >= rows`.
    pub fn row(&self, r: usize) -> &'a [u8] {
        let n = self.row_bytes();
        &self.data[r * n..(r + 1) * n]
    }

    /// Decodes row `r` into `dst` (e.g. an embedding lookup).
    ///
    /// # Panics
    ///
    /// If `r >= rows`, `dst.len() != cols`, or the rows are regrouped (a layout for the kernels only).
    pub fn dequantize_row(&self, r: usize, dst: &mut [f32]) {
        assert_eq!(
            self.layout,
            WeightLayout::Plain,
            "dequantize_row: regrouped weights are for the kernels only"
        );
        assert_eq!(
            dst.len(),
            self.cols,
            "dequantize_row: destination length must equal the column count"
        );
        dequantize_blocks(self.ty, self.row(r), dst);
    }
}

/// Activations quantised once (e.g. once per layer) and reused by every matmul with weights of the
/// same activation type. Holds `rows` rows of `cols` elements encoded as `act_type()`.
#[derive(Clone, Debug)]
pub struct Activations {
    act_ty: GgmlType,
    rows: usize,
    cols: usize,
    data: Vec<u8>,
    /// Q8_0 rows also in the grouped layout (`grouped.rs`) that the SIMD Q4_0 and Q8_0 kernels read;
    /// empty for other types.
    grouped: Vec<u8>,
}

impl Default for Activations {
    fn default() -> Self {
        Self::new()
    }
}

impl Activations {
    /// Empty (zero rows of F32).
    pub fn new() -> Self {
        Activations {
            act_ty: GgmlType::F32,
            rows: 0,
            cols: 0,
            data: Vec::new(),
            grouped: Vec::new(),
        }
    }

    /// Quantises `x` (`rows` × `cols`, row-major) as `act_ty`, reusing this buffer. Rows are
    /// independent, so they are quantised in parallel without any effect on the bytes. On error the
    /// previous contents are left as they were.
    pub fn quantize(&mut self, act_ty: GgmlType, x: &[f32], rows: usize, cols: usize) -> Result<(), KernelError> {
        let quantize = simd::quant_kernel(isa(), act_ty)?;
        let row_bytes = checked_row_bytes(act_ty, cols)?;
        let elements = rows.checked_mul(cols).ok_or(KernelError::TooLarge {
            what: "activations",
            rows,
            cols,
        })?;
        if x.len() != elements {
            return Err(KernelError::SizeMismatch {
                what: "activations",
                unit: "elements",
                expected: elements,
                actual: x.len(),
            });
        }
        let total = rows.checked_mul(row_bytes).ok_or(KernelError::TooLarge {
            what: "activations",
            rows,
            cols,
        })?;
        self.data.resize(total, 0);
        let grouped_bytes = if act_ty == GgmlType::Q8_0 {
            grouped::row_bytes(cols / act_ty.block_len())
        } else {
            0
        };
        // Cannot overflow: a grouped row is at most 320 / 272 of a plain one.
        self.grouped.resize(rows * grouped_bytes, 0);
        let encode = |src: &[f32], dst: &mut [u8], grouped_dst: &mut [u8]| {
            quantize.run(src, dst);
            if !grouped_dst.is_empty() {
                grouped::regroup(dst, grouped_dst);
            }
        };
        if rows == 1 {
            // Decode: one row is not worth entering the thread pool for.
            encode(x, &mut self.data, &mut self.grouped);
        } else if total > 0 {
            crate::stay_warm();
            if grouped_bytes > 0 {
                self.data
                    .par_chunks_mut(row_bytes)
                    .zip(x.par_chunks(cols))
                    .zip(self.grouped.par_chunks_mut(grouped_bytes))
                    .for_each(|((dst, src), g)| encode(src, dst, g));
            } else {
                self.data
                    .par_chunks_mut(row_bytes)
                    .zip(x.par_chunks(cols))
                    .for_each(|(dst, src)| encode(src, dst, &mut []));
            }
        }
        (self.act_ty, self.rows, self.cols) = (act_ty, rows, cols);
        Ok(())
    }

    /// Makes this hold `rows` already encoded as `act_ty` (`cols` elements each), as another machine's
    /// [`Activations::quantize`] wrote them: the bytes are taken as they are, so a row's results are the
    /// ones the sender would have computed. Reuses this buffer. Errors (leaving this unchanged) when
    /// `act_ty` is not an activation format or `data` is not exactly `rows` rows of `cols` elements.
    pub fn set_encoded(&mut self, act_ty: GgmlType, cols: usize, rows: usize, data: &[u8]) -> Result<(), KernelError> {
        if !act_ty.is_act_type() {
            return Err(KernelError::NotActivationType(act_ty));
        }
        let row_bytes = checked_row_bytes(act_ty, cols)?;
        let expected = rows.checked_mul(row_bytes).ok_or(KernelError::TooLarge {
            what: "activations",
            rows,
            cols,
        })?;
        if data.len() != expected {
            return Err(KernelError::SizeMismatch {
                what: "encoded activations",
                unit: "bytes",
                expected,
                actual: data.len(),
            });
        }
        self.data.clear();
        self.data.extend_from_slice(data);
        self.grouped.clear();
        if act_ty == GgmlType::Q8_0 && row_bytes > 0 {
            let grouped_bytes = grouped::row_bytes(cols / act_ty.block_len());
            self.grouped.resize(rows * grouped_bytes, 0);
            for (src, dst) in data
                .chunks_exact(row_bytes)
                .zip(self.grouped.chunks_exact_mut(grouped_bytes))
            {
                grouped::regroup(src, dst);
            }
        }
        (self.act_ty, self.rows, self.cols) = (act_ty, rows, cols);
        Ok(())
    }

    /// The encoded bytes of every row, row after row.
    pub fn encoded(&self) -> &[u8] {
        &self.data
    }

    /// The format the rows are encoded in.
    pub fn act_type(&self) -> GgmlType {
        self.act_ty
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The encoded bytes of row `i`.
    ///
    /// # Panics
    ///
    /// If `i >= rows`.
    pub fn row(&self, i: usize) -> &[u8] {
        let n = self.row_bytes();
        &self.data[i * n..(i + 1) * n]
    }

    fn row_bytes(&self) -> usize {
        self.cols / self.act_ty.block_len() * self.act_ty.block_bytes()
    }

    /// Row `i` in `layout` (a kernel checked by `MatmulJob::check` asks only for a layout it has).
    fn row_in(&self, layout: ActLayout, i: usize) -> &[u8] {
        match layout {
            ActLayout::Plain => self.row(i),
            ActLayout::Grouped => {
                let n = self.grouped.len() / self.rows;
                &self.grouped[i * n..(i + 1) * n]
            }
        }
    }

    /// Makes this hold rows `rows` of `src`, in that order, as byte copies: an MoE layer quantises its
    /// input once and hands each expert the rows routed to it, with exactly the bytes (and so the
    /// results) a fresh quantisation of those rows would give. Reuses this buffer.
    ///
    /// # Panics
    ///
    /// If an index is not below `src.rows()` (checked before anything changes).
    pub fn gather_from(&mut self, src: &Activations, rows: &[usize]) {
        if let Some(&bad) = rows.iter().find(|&&i| i >= src.rows) {
            panic!("gather_from: row {bad} requested from activations of {} rows", src.rows);
        }
        self.data.clear();
        self.grouped.clear();
        for &i in rows {
            self.data.extend_from_slice(src.row(i));
            if !src.grouped.is_empty() {
                self.grouped.extend_from_slice(src.row_in(ActLayout::Grouped, i));
            }
        }
        (self.act_ty, self.rows, self.cols) = (src.act_ty, rows.len(), src.cols);
    }
}

/// `out[i * w.rows + r] = vec_dot(w.row(r), acts.row(i))` for every activation row `i` and weight row `r`.
///
/// Work is split over weight rows only (rayon), and each output is computed exactly as [`vec_dot`]
/// computes it — whether its activation row shares a kernel call with up to three others, how many
/// threads run, and which ISA is selected change nothing — so the result does not depend on the
/// thread count or on how many activation rows share the call.
///
/// [`vec_dot`]: crate::vec_dot
pub fn matmul(w: &WeightView, acts: &Activations, out: &mut [f32]) -> Result<(), KernelError> {
    matmul_many(&mut [MatmulJob { w: *w, acts, out }])
}

/// One product of a [`matmul_many`] batch: `out` as [`matmul`] lays it out.
pub struct MatmulJob<'a> {
    pub w: WeightView<'a>,
    pub acts: &'a Activations,
    pub out: &'a mut [f32],
}

impl MatmulJob<'_> {
    /// The checks of [`matmul`].
    fn check(&self) -> Result<(), KernelError> {
        let (w, acts) = (&self.w, self.acts);
        w.check()?;
        if acts.act_type() != w.ty.act_type() {
            return Err(KernelError::ActivationTypeMismatch {
                weight: w.ty,
                expected: w.ty.act_type(),
                actual: acts.act_type(),
            });
        }
        if acts.cols() != w.cols {
            return Err(KernelError::ColumnMismatch {
                weight_cols: w.cols,
                act_cols: acts.cols(),
            });
        }
        let expected = acts.rows().checked_mul(w.rows).ok_or(KernelError::TooLarge {
            what: "matmul output",
            rows: acts.rows(),
            cols: w.rows,
        })?;
        if self.out.len() != expected {
            return Err(KernelError::SizeMismatch {
                what: "matmul output",
                unit: "elements",
                expected,
                actual: self.out.len(),
            });
        }
        Ok(())
    }
}

/// Several independent [`matmul`]s (e.g. the gate and up projections of every expert a layer
/// routes to) in one parallel region, their output rows split across threads together. Each job's
/// result is bit for bit what [`matmul`] gives it. At decode an expert's matrices are small (768 ×
/// 2048 is a few hundred microseconds of one core's bandwidth), and a region per matrix costs a
/// noticeable share of that; one region for all of them does not. Nothing is written if a job fails
/// its checks.
pub fn matmul_many(jobs: &mut [MatmulJob]) -> Result<(), KernelError> {
    matmul_many_on(isa(), jobs)
}

/// [`matmul_many`] on a given instruction set (tests compare them without touching the global one).
pub(crate) fn matmul_many_on(isa: Isa, jobs: &mut [MatmulJob]) -> Result<(), KernelError> {
    for job in jobs.iter() {
        job.check()?;
    }
    for region in jobs.chunks_mut(JOBS_PER_REGION) {
        run_region(isa, region);
    }
    Ok(())
}

/// Jobs that share one parallel region. Their bookkeeping lives on the stack, so a call allocates
/// nothing; a call with more jobs (a prefill that reaches many experts) runs several regions, one
/// after the other, which changes no result.
const JOBS_PER_REGION: usize = 32;

/// One job of a region, cut into tasks of `run_len` consecutive weight rows.
#[derive(Clone, Copy)]
struct Part<'a> {
    kernel: DotKernel,
    w: WeightView<'a>,
    acts: &'a Activations,
    out: OutPtr,
    run_len: usize,
    /// Index of this part's first task within the region.
    first_task: usize,
}

/// The start of a job's output, written by several tasks at once: each writes only the outputs of
/// its own weight rows, so no element is written twice or read.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);

// SAFETY: tasks write disjoint elements (see `OutPtr`), and the region ends before the `&mut` the
// pointer came from is usable again.
unsafe impl Send for OutPtr {}
// SAFETY: the pool's threads share the `Part`s by reference (`run_region`'s `task`), and all a shared
// `OutPtr` gives them is the pointer: through it each task writes only its own weight rows' outputs
// (`Part::run_rows`), disjoint from every other task's, and nothing reads them until the region ends.
unsafe impl Sync for OutPtr {}

/// Runs `jobs` (at most [`JOBS_PER_REGION`], all checked) in one parallel region.
fn run_region(isa: Isa, jobs: &mut [MatmulJob]) {
    // The jobs with work, in order; each owns the tasks from its `first_task` to the next one's.
    let mut parts: [Option<Part>; JOBS_PER_REGION] = [None; JOBS_PER_REGION];
    let (mut n, mut tasks) = (0, 0);
    for job in jobs.iter_mut() {
        let rows = job.w.rows;
        if rows == 0 || job.acts.rows() == 0 {
            continue;
        }
        let run_len = (TASK_WEIGHT_BYTES / job.w.row_bytes().max(1)).clamp(1, rows);
        parts[n] = Some(Part {
            kernel: simd::dot_kernel(isa, job.w.ty, job.w.layout),
            w: job.w,
            acts: job.acts,
            out: OutPtr(job.out.as_mut_ptr()),
            run_len,
            first_task: tasks,
        });
        n += 1;
        tasks += rows.div_ceil(run_len);
    }
    let parts = &parts[..n];
    crate::stay_warm();
    let task = |t: usize| {
        let owner = parts.partition_point(|p| p.as_ref().is_some_and(|p| p.first_task <= t)) - 1;
        let part = parts[owner].as_ref().expect("parts[..n] are all set");
        let first = (t - part.first_task) * part.run_len;
        // SAFETY: the tasks of a part cover disjoint runs of its weight rows, and `run_rows` writes
        // only those rows' outputs, inside the job's checked `out`.
        unsafe { part.run_rows(first..(first + part.run_len).min(part.w.rows)) };
    };
    if tasks == 1 {
        // Not worth entering the thread pool (which costs microseconds from outside it).
        task(0);
    } else {
        (0..tasks).into_par_iter().for_each(task);
    }
}

impl Part<'_> {
    /// Computes the outputs of weight rows `rows` for every activation row.
    ///
    /// # Safety
    ///
    /// No other thread may be writing those outputs.
    unsafe fn run_rows(&self, rows: std::ops::Range<usize>) {
        /// Weight rows per kernel call: their outputs for every activation row fit a stack buffer.
        const CALL_ROWS: usize = 64;
        let (n_act, n_out) = (self.acts.rows(), self.w.rows);
        let (step, row_bytes) = (self.kernel.max_rows, self.w.row_bytes());
        if n_act == 1 {
            // Decode: with one activation row, weight row `r`'s output is `out[r]`, so the kernel writes
            // the run's outputs in place instead of into a buffer to be scattered.
            let w = &self.w.data[rows.start * row_bytes..rows.end * row_bytes];
            // SAFETY: `check` made `out` n_out long, `rows` is inside 0..n_out, and no other thread
            // writes these outputs (the caller's contract).
            let out = unsafe { std::slice::from_raw_parts_mut(self.out.0.add(rows.start), rows.len()) };
            self.kernel
                .run(w, row_bytes, &[self.acts.row_in(self.kernel.layout, 0)], out);
            return;
        }
        let mut act_rows: [&[u8]; MAX_ROWS] = [&[]; MAX_ROWS];
        let mut values = [0f32; CALL_ROWS * MAX_ROWS];
        // Up to `step` activation rows at a time, each against every weight row of the run: the
        // activations stay in L1 while the run's weights (TASK_WEIGHT_BYTES) pass by, and each
        // weight row is unpacked once per activation chunk (each output exactly as if alone).
        for i0 in (0..n_act).step_by(step) {
            let m = (n_act - i0).min(step);
            for (a, i) in act_rows.iter_mut().zip(i0..i0 + m) {
                *a = self.acts.row_in(self.kernel.layout, i);
            }
            for r0 in rows.clone().step_by(CALL_ROWS) {
                let k = (rows.end - r0).min(CALL_ROWS);
                let w = &self.w.data[r0 * row_bytes..(r0 + k) * row_bytes];
                let values = &mut values[..k * m];
                self.kernel.run(w, row_bytes, &act_rows[..m], values);
                for (r, per_act) in (r0..r0 + k).zip(values.chunks_exact(m)) {
                    for (i, &v) in (i0..i0 + m).zip(per_act) {
                        // SAFETY: `i < n_act` and `r < n_out`, and `check` made `out` n_act × n_out.
                        unsafe { *self.out.0.add(i * n_out + r) = v };
                    }
                }
            }
        }
    }
}

/// Convenience: quantises `x` (`rows` × `w.cols`) with `w`'s activation type into a scratch
/// [`Activations`] and multiplies. Prefer [`Activations::quantize`] + [`matmul`] when several weight
/// matrices share the same input.
pub fn matmul_f32(w: &WeightView, x: &[f32], rows: usize, out: &mut [f32]) -> Result<(), KernelError> {
    let mut acts = Activations::new();
    acts.quantize(w.ty.act_type(), x, rows, w.cols)?;
    matmul(w, &acts, out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{self, Rng};
    use crate::vec_dot;

    /// A random `rows` × `cols` weight matrix of type `ty` and `n_act` random activation rows.
    fn problem(ty: GgmlType, rows: usize, cols: usize, n_act: usize, seed: u64) -> (Vec<u8>, Vec<f32>) {
        let mut rng = Rng::new(seed);
        let w: Vec<u8> = (0..rows)
            .flat_map(|_| testutil::random_row(ty, cols, &mut rng))
            .collect();
        let x: Vec<f32> = (0..n_act * cols).map(|_| rng.normal()).collect();
        (w, x)
    }

    fn run_in_pool(threads: usize, f: impl FnOnce() -> Vec<f32> + Send) -> Vec<f32> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("test thread pool");
        pool.install(f)
    }

    #[test]
    fn matmul_equals_per_row_vec_dot_for_every_type() {
        for ty in GgmlType::ALL {
            let (rows, cols, n_act) = (37, 2 * 256, 3);
            let (data, x) = problem(ty, rows, cols, n_act, ty.id().into());
            let w = WeightView::new(ty, rows, cols, &data).expect("valid view");
            let mut acts = Activations::new();
            acts.quantize(ty.act_type(), &x, n_act, cols).expect("quantize");
            let mut out = vec![0f32; n_act * rows];
            matmul(&w, &acts, &mut out).expect("matmul");
            for i in 0..n_act {
                for r in 0..rows {
                    let expected = vec_dot(ty, cols, w.row(r), acts.row(i));
                    assert_eq!(out[i * rows + r].to_bits(), expected.to_bits(), "{ty} out[{i}][{r}]");
                }
            }
            // A single activation row takes the decode path; it must give the same bits.
            let mut single = Activations::new();
            single
                .quantize(ty.act_type(), &x[cols..2 * cols], 1, cols)
                .expect("quantize");
            let mut out1 = vec![0f32; rows];
            matmul(&w, &single, &mut out1).expect("matmul");
            let row1: Vec<u32> = out[rows..2 * rows].iter().map(|v| v.to_bits()).collect();
            assert_eq!(
                out1.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                row1,
                "{ty} single row"
            );
        }
    }

    #[test]
    fn matmul_bits_do_not_depend_on_thread_count() {
        for ty in [
            GgmlType::F32,
            GgmlType::BF16,
            GgmlType::Q4_0,
            GgmlType::Q5_1,
            GgmlType::Q4_K,
            GgmlType::Q6_K,
        ] {
            let (rows, cols, n_act) = (100, 512, 4);
            let (data, x) = problem(ty, rows, cols, n_act, 99);
            let w = WeightView::new(ty, rows, cols, &data).expect("valid view");
            let compute = || {
                let mut out = vec![0f32; n_act * rows];
                matmul_f32(&w, &x, n_act, &mut out).expect("matmul");
                out
            };
            let one = run_in_pool(1, compute);
            let two = run_in_pool(2, compute);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&one), bits(&two), "{ty}");
        }
    }

    #[test]
    fn weight_view_checks_its_shape() {
        let data = vec![0u8; 2 * 144];
        assert!(WeightView::new(GgmlType::Q4_K, 2, 256, &data).is_ok());
        let err = WeightView::new(GgmlType::Q4_K, 3, 256, &data).unwrap_err();
        assert!(
            matches!(
                err,
                KernelError::SizeMismatch {
                    expected: 432,
                    actual: 288,
                    ..
                }
            ),
            "{err}"
        );
        let err = WeightView::new(GgmlType::Q4_K, 2, 128, &data).unwrap_err();
        assert!(matches!(err, KernelError::NotWholeBlocks { .. }), "{err}");
        let err = WeightView::new(GgmlType::F32, usize::MAX, 4, &data).unwrap_err();
        assert!(matches!(err, KernelError::TooLarge { .. }), "{err}");
    }

    #[test]
    fn weight_view_rows_and_dequantize() {
        let values: Vec<f32> = (0..6).map(|v| v as f32).collect();
        let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let w = WeightView::new(GgmlType::F32, 2, 3, &data).expect("valid view");
        assert_eq!(w.row_bytes(), 12);
        assert_eq!(w.row(1), &data[12..]);
        let mut row = [0f32; 3];
        w.dequantize_row(1, &mut row);
        assert_eq!(row, [3.0, 4.0, 5.0]);
    }

    #[test]
    fn matmul_rejects_mismatches_without_panicking() {
        let data = vec![0u8; 4 * 144];
        let w = WeightView::new(GgmlType::Q4_K, 4, 256, &data).expect("valid view");
        let x = vec![0.25f32; 2 * 256];
        let mut acts = Activations::new();
        acts.quantize(GgmlType::Q8_0, &x, 2, 256).expect("quantize");
        let mut out = vec![0f32; 8];
        let err = matmul(&w, &acts, &mut out).unwrap_err();
        assert!(matches!(err, KernelError::ActivationTypeMismatch { .. }), "{err}");

        acts.quantize(GgmlType::Q8_K, &x, 1, 512).expect("quantize");
        let err = matmul(&w, &acts, &mut out).unwrap_err();
        assert!(
            matches!(
                err,
                KernelError::ColumnMismatch {
                    weight_cols: 256,
                    act_cols: 512
                }
            ),
            "{err}"
        );

        acts.quantize(GgmlType::Q8_K, &x, 2, 256).expect("quantize");
        let err = matmul(&w, &acts, &mut out[..7]).unwrap_err();
        assert!(
            matches!(
                err,
                KernelError::SizeMismatch {
                    expected: 8,
                    actual: 7,
                    ..
                }
            ),
            "{err}"
        );
        assert!(matmul(&w, &acts, &mut out).is_ok());

        let bad = WeightView {
            ty: GgmlType::Q4_K,
            rows: 5,
            cols: 256,
            data: &data,
            layout: WeightLayout::Plain,
        };
        assert!(matmul(&bad, &acts, &mut [0f32; 10]).is_err());
        let err = matmul_f32(&w, &x[..300], 1, &mut out[..4]).unwrap_err();
        assert!(
            matches!(err, KernelError::SizeMismatch { unit: "elements", .. }),
            "{err}"
        );
    }

    #[test]
    fn activations_quantize_checks_and_keeps_old_contents_on_error() {
        let mut acts = Activations::new();
        acts.quantize(GgmlType::Q8_0, &[1.0; 64], 2, 32).expect("quantize");
        assert!(acts.quantize(GgmlType::Q4_0, &[1.0; 64], 2, 32).is_err());
        assert!(acts.quantize(GgmlType::Q8_K, &[1.0; 64], 2, 32).is_err());
        assert!(acts.quantize(GgmlType::Q8_0, &[1.0; 63], 2, 32).is_err());
        assert_eq!((acts.act_type(), acts.rows(), acts.cols()), (GgmlType::Q8_0, 2, 32));
        assert_eq!(acts.row(1).len(), 34);
        acts.quantize(GgmlType::F32, &[], 0, 8).expect("empty");
        assert_eq!(acts.rows(), 0);
    }

    #[test]
    fn encoded_activations_give_the_senders_results() {
        // What a peer receives (the plain bytes) must multiply exactly as what the sender quantised,
        // including the grouped layout the SIMD Q4_0/Q8_0 kernels read.
        for (wty, cols) in [(GgmlType::Q4_0, 512), (GgmlType::Q8_0, 256), (GgmlType::Q4_K, 512)] {
            let (w, x) = problem(wty, 16, cols, 5, 7);
            let view = WeightView::new(wty, 16, cols, &w).expect("valid weights");
            let mut sent = Activations::new();
            sent.quantize(wty.act_type(), &x, 5, cols).unwrap();
            let mut got = Activations::new();
            got.set_encoded(sent.act_type(), cols, 5, sent.encoded()).unwrap();
            let (mut a, mut b) = (vec![0f32; 5 * 16], vec![0f32; 5 * 16]);
            matmul(&view, &sent, &mut a).unwrap();
            matmul(&view, &got, &mut b).unwrap();
            assert_eq!(
                a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                b.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{wty:?}"
            );
            assert!(
                got.set_encoded(sent.act_type(), cols, 4, sent.encoded()).is_err(),
                "wrong row count accepted"
            );
            assert!(
                got.set_encoded(GgmlType::Q4_0, cols, 5, sent.encoded()).is_err(),
                "a weight type accepted"
            );
            assert_eq!(got.rows(), 5, "a failed call changed the buffer");
        }
    }
}
