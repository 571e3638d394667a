//! The seam for dense products split by output rows: the attention and linear-attention projections and
//! the LM head ask one question — "these matrices times these rows" — and where each matrix row is computed
//! is the [`Rows`] implementation's business: all of them here ([`LocalRows`]), or shares on a cluster's
//! nodes. An output element is one weight row times one activation row, computed whole by the same kernel
//! from the same quantised input wherever it runs, so any split of the rows gives the same bits
//! (docs/determinism.md: splitting dense work exactly).

use titan_kernels::{matmul_many, Activations, MatmulJob};

use crate::experts::ScratchPool;
use crate::scratch::recycle;
use crate::weights::{Mat, Weights};
use crate::Result;

/// One product: `w` times every row of `input`, into `out` as `titan_kernels::matmul` lays it out
/// (`out[i * w.rows + r]`).
pub struct RowJob<'a> {
    pub w: Mat,
    pub input: &'a Activations,
    pub out: &'a mut [f32],
}

/// Where row-split products are computed.
pub trait Rows: Send + Sync {
    /// Every job of `jobs`, with the matrices of `weights`.
    fn matmul_many(&self, weights: &Weights, jobs: &mut [RowJob]) -> Result<()>;
}

impl<T: Rows + ?Sized> Rows for std::sync::Arc<T> {
    fn matmul_many(&self, weights: &Weights, jobs: &mut [RowJob]) -> Result<()> {
        (**self).matmul_many(weights, jobs)
    }
}

/// Every row here, in one parallel region for all the jobs.
#[derive(Default)]
pub struct LocalRows {
    /// Always empty: the allocation of the kernels' job list (see `scratch::recycle`).
    jobs: ScratchPool<Vec<MatmulJob<'static>>>,
}

impl Rows for LocalRows {
    fn matmul_many(&self, weights: &Weights, jobs: &mut [RowJob]) -> Result<()> {
        self.jobs.with(|kept| {
            let mut list: Vec<MatmulJob> = recycle(std::mem::take(kept));
            list.extend(jobs.iter_mut().map(|j| MatmulJob {
                w: weights.view(&j.w),
                acts: j.input,
                out: &mut j.out[..],
            }));
            let r = matmul_many(&mut list);
            *kept = recycle(list);
            Ok(r?)
        })
    }
}

/// Rows `rows` of `m`: a matrix of its own, whose products are those rows of `m`'s.
pub fn row_range(m: &Mat, rows: std::ops::Range<usize>) -> Mat {
    Mat {
        start: m.start + rows.start * m.row_bytes(),
        rows: rows.len(),
        ..*m
    }
}
