//! Weight matrices borrowed from a GGUF mapping, activations quantised once per use, and the matrix
//! multiply that combines them.

use rayon::prelude::*;

use crate::{checked_row_bytes, dequantize_blocks, quantizer, vec_dot, GgmlType, KernelError};

/// Weight rows handed to one rayon task at a time. A row dot product costs about a microsecond at
/// typical widths, so smaller pieces would be dominated by scheduling. The split never changes a
/// result: each output is computed whole by one task.
const MIN_ROWS_PER_TASK: usize = 16;

/// A weight matrix in its GGUF encoding: `rows` rows of `cols` elements; row `r` is
/// `data[r * row_bytes .. (r + 1) * row_bytes]`. Borrowed (zero-copy from an mmap).
#[derive(Clone, Copy, Debug)]
pub struct WeightView<'a> {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub data: &'a [u8],
}

impl<'a> WeightView<'a> {
    /// Checks that `cols` is a whole number of blocks and that `data` holds exactly `rows` rows.
    pub fn new(
        ty: GgmlType,
        rows: usize,
        cols: usize,
        data: &'a [u8],
    ) -> Result<Self, KernelError> {
        let view = WeightView {
            ty,
            rows,
            cols,
            data,
        };
        view.check()?;
        Ok(view)
    }

    /// The checks of [`WeightView::new`], repeated by [`matmul`] because the fields are public.
    fn check(&self) -> Result<(), KernelError> {
        let row_bytes = checked_row_bytes(self.ty, self.cols)?;
        let expected = row_bytes
            .checked_mul(self.rows)
            .ok_or(KernelError::TooLarge {
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
    /// If `r >= rows` or `dst.len() != cols`.
    pub fn dequantize_row(&self, r: usize, dst: &mut [f32]) {
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
        }
    }

    /// Quantises `x` (`rows` × `cols`, row-major) as `act_ty`, reusing this buffer. Rows are
    /// independent, so they are quantised in parallel without any effect on the bytes. On error the
    /// previous contents are left as they were.
    pub fn quantize(
        &mut self,
        act_ty: GgmlType,
        x: &[f32],
        rows: usize,
        cols: usize,
    ) -> Result<(), KernelError> {
        let quantize = quantizer(act_ty)?;
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
        if total > 0 {
            self.data
                .par_chunks_mut(row_bytes)
                .zip(x.par_chunks(cols))
                .for_each(|(dst, src)| quantize(src, dst));
        }
        (self.act_ty, self.rows, self.cols) = (act_ty, rows, cols);
        Ok(())
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
        let n = self.cols / self.act_ty.block_len() * self.act_ty.block_bytes();
        &self.data[i * n..(i + 1) * n]
    }
}

/// `out[i * w.rows + r] = vec_dot(w.row(r), acts.row(i))` for every activation row `i` and weight row `r`.
///
/// Work is split over weight rows only (rayon), and each output is one whole [`vec_dot`], so the result
/// does not depend on the thread count or on how many activation rows share the call.
pub fn matmul(w: &WeightView, acts: &Activations, out: &mut [f32]) -> Result<(), KernelError> {
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
    let expected = acts
        .rows()
        .checked_mul(w.rows)
        .ok_or(KernelError::TooLarge {
            what: "matmul output",
            rows: acts.rows(),
            cols: w.rows,
        })?;
    if out.len() != expected {
        return Err(KernelError::SizeMismatch {
            what: "matmul output",
            unit: "elements",
            expected,
            actual: out.len(),
        });
    }
    if expected == 0 {
        return Ok(());
    }

    if acts.rows() == 1 {
        // Decode: the output row is indexed by weight row, so tasks write straight into it.
        let act = acts.row(0);
        out.par_iter_mut()
            .with_min_len(MIN_ROWS_PER_TASK)
            .enumerate()
            .for_each(|(r, o)| *o = vec_dot(w.ty, w.cols, w.row(r), act));
        return Ok(());
    }

    // Several activation rows: a task takes a run of weight rows and dots each against every
    // activation row, so each weight row is read once per call. Results are gathered weight-row-major
    // and then transposed into `out`; the copy does not touch the values.
    let n_act = acts.rows();
    let mut by_weight_row = vec![0f32; expected];
    by_weight_row
        .par_chunks_mut(n_act)
        .with_min_len(MIN_ROWS_PER_TASK)
        .enumerate()
        .for_each(|(r, col)| {
            let w_row = w.row(r);
            for (i, o) in col.iter_mut().enumerate() {
                *o = vec_dot(w.ty, w.cols, w_row, acts.row(i));
            }
        });
    for (r, col) in by_weight_row.chunks_exact(n_act).enumerate() {
        for (i, &v) in col.iter().enumerate() {
            out[i * w.rows + r] = v;
        }
    }
    Ok(())
}

/// Convenience: quantises `x` (`rows` × `w.cols`) with `w`'s activation type into a scratch
/// [`Activations`] and multiplies. Prefer [`Activations::quantize`] + [`matmul`] when several weight
/// matrices share the same input.
pub fn matmul_f32(
    w: &WeightView,
    x: &[f32],
    rows: usize,
    out: &mut [f32],
) -> Result<(), KernelError> {
    let mut acts = Activations::new();
    acts.quantize(w.ty.act_type(), x, rows, w.cols)?;
    matmul(w, &acts, out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{self, Rng};

    /// A random `rows` × `cols` weight matrix of type `ty` and `n_act` random activation rows.
    fn problem(
        ty: GgmlType,
        rows: usize,
        cols: usize,
        n_act: usize,
        seed: u64,
    ) -> (Vec<u8>, Vec<f32>) {
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
            acts.quantize(ty.act_type(), &x, n_act, cols)
                .expect("quantize");
            let mut out = vec![0f32; n_act * rows];
            matmul(&w, &acts, &mut out).expect("matmul");
            for i in 0..n_act {
                for r in 0..rows {
                    let expected = vec_dot(ty, cols, w.row(r), acts.row(i));
                    assert_eq!(
                        out[i * rows + r].to_bits(),
                        expected.to_bits(),
                        "{ty} out[{i}][{r}]"
                    );
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
        assert!(
            matches!(err, KernelError::ActivationTypeMismatch { .. }),
            "{err}"
        );

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
        };
        assert!(matmul(&bad, &acts, &mut [0f32; 10]).is_err());
        let err = matmul_f32(&w, &x[..300], 1, &mut out[..4]).unwrap_err();
        assert!(
            matches!(
                err,
                KernelError::SizeMismatch {
                    unit: "elements",
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn activations_quantize_checks_and_keeps_old_contents_on_error() {
        let mut acts = Activations::new();
        acts.quantize(GgmlType::Q8_0, &[1.0; 64], 2, 32)
            .expect("quantize");
        assert!(acts.quantize(GgmlType::Q4_0, &[1.0; 64], 2, 32).is_err());
        assert!(acts.quantize(GgmlType::Q8_K, &[1.0; 64], 2, 32).is_err());
        assert!(acts.quantize(GgmlType::Q8_0, &[1.0; 63], 2, 32).is_err());
        assert_eq!(
            (acts.act_type(), acts.rows(), acts.cols()),
            (GgmlType::Q8_0, 2, 32)
        );
        assert_eq!(acts.row(1).len(), 34);
        acts.quantize(GgmlType::F32, &[], 0, 8).expect("empty");
        assert_eq!(acts.rows(), 0);
    }
}
