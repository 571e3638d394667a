//! One expert's weights in memory: the bytes read from the store's file, and typed views of its gate, up
//! and down matrices.

use titan_kernels::{GgmlType, WeightLayout, WeightView};

use crate::AlignedBuf;

/// Where one matrix sits inside a record's buffer, and its shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Part {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub start: usize,
    pub len: usize,
    /// Plain as read, until [`ExpertRecord::regroup`].
    pub layout: WeightLayout,
}

/// The gate, up and down parts of a record. Types and shapes are the layer's; where the parts start
/// depends on the record's reads (the same for every expert of a copied layer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RecordShape {
    pub gate: Part,
    pub up: Part,
    pub down: Part,
}

/// One (layer, expert) record, digest-checked (unless checking was turned off), held in an aligned buffer.
#[derive(Debug)]
pub struct ExpertRecord {
    pub layer: usize,
    pub expert: usize,
    shape: RecordShape,
    /// The record's aligned reads, exactly as read: one for a copied record, padded to the alignment;
    /// one per part in place, each rounded out to the alignment at both ends. A reused buffer may be
    /// longer than the reads, and hold another record's bytes outside them.
    buf: AlignedBuf,
}

/// One matrix of an expert: `rows` rows of `cols` elements of type `ty`, encoded as in the GGUF.
#[derive(Clone, Copy, Debug)]
pub struct ExpertTensor<'a> {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    /// As in the GGUF, unless the record was regrouped for the kernels (then see `layout`).
    pub data: &'a [u8],
    pub layout: WeightLayout,
}

impl<'a> ExpertTensor<'a> {
    /// The matrix as the kernels take it; shapes were checked against the model when the store was opened.
    pub fn weight_view(&self) -> WeightView<'a> {
        WeightView {
            ty: self.ty,
            rows: self.rows,
            cols: self.cols,
            data: self.data,
            layout: self.layout,
        }
    }
}

impl ExpertRecord {
    pub(crate) fn new(layer: usize, expert: usize, shape: RecordShape, buf: AlignedBuf) -> ExpertRecord {
        ExpertRecord {
            layer,
            expert,
            shape,
            buf,
        }
    }

    pub fn gate(&self) -> ExpertTensor<'_> {
        self.part(self.shape.gate)
    }

    pub fn up(&self) -> ExpertTensor<'_> {
        self.part(self.shape.up)
    }

    pub fn down(&self) -> ExpertTensor<'_> {
        self.part(self.shape.down)
    }

    /// Lay the record's Q4_0 and Q8_0 matrices out as the SIMD kernels take them (`regroup_weights`: the
    /// same bytes moved within each row, the same bits out of the kernels), as the resident weights are at
    /// load. A streamed expert then decodes as fast as a resident one: on the 2-core AMD EPYC (AVX2), a Q4_0
    /// matvec of one row runs at 60 GFLOP/s per CPU second regrouped against 41 transposing in registers.
    /// Done once per read, after the digest check, on the reading thread, in place.
    pub(crate) fn regroup(&mut self) {
        for part in [&mut self.shape.gate, &mut self.shape.up, &mut self.shape.down] {
            if part.layout == WeightLayout::Plain {
                let data = &mut self.buf.as_mut_slice()[part.start..part.start + part.len];
                part.layout = titan_layout::regroup::regroup_in_place(part.ty, part.cols, data);
            }
        }
    }

    /// Memory the record occupies (its buffer, which may be larger than its reads): what the cache budget
    /// counts.
    pub fn resident_bytes(&self) -> u64 {
        self.buf.len() as u64
    }

    /// The record's buffer, for another read to reuse.
    pub(crate) fn into_buf(self) -> AlignedBuf {
        self.buf
    }

    fn part(&self, p: Part) -> ExpertTensor<'_> {
        // The reader built `shape` from the store's table and its reads, and sized `buf` to hold all
        // three parts.
        ExpertTensor {
            ty: p.ty,
            rows: p.rows,
            cols: p.cols,
            data: &self.buf.as_slice()[p.start..p.start + p.len],
            layout: p.layout,
        }
    }
}
