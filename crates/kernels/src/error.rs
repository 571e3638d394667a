//! The one error type of the crate.

use crate::GgmlType;

/// What went wrong in a kernel call. Every variant is a caller mistake about shapes or formats;
/// the message names the sizes involved so the caller can find which tensor was mis-described.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// A row length that is not a whole number of blocks of its format.
    #[error("{len} elements is not a whole number of {ty} blocks ({block_len} elements each)")]
    NotWholeBlocks { ty: GgmlType, len: usize, block_len: usize },

    /// A buffer whose size does not match the shape it is said to hold.
    #[error("{what} holds {actual} {unit} but the shape needs {expected}")]
    SizeMismatch {
        what: &'static str,
        unit: &'static str,
        expected: usize,
        actual: usize,
    },

    /// A shape so large that its byte size does not fit in `usize`.
    #[error("{what} of {rows} x {cols} elements is too large to address")]
    TooLarge {
        what: &'static str,
        rows: usize,
        cols: usize,
    },

    /// `quantize_row` / `Activations::quantize` asked for a type that is not an activation format.
    #[error("{0} is not an activation format: use F32, Q8_0, Q8_1 or Q8_K (see GgmlType::act_type)")]
    NotActivationType(GgmlType),

    /// Activations quantised to a different format than the weights need.
    #[error("{weight} weights need {expected} activations, got {actual}")]
    ActivationTypeMismatch {
        weight: GgmlType,
        expected: GgmlType,
        actual: GgmlType,
    },

    /// `set_isa` asked for an instruction set this CPU lacks.
    #[error("this CPU cannot run {isa} kernels: choose one of {available:?} (see available_isas)")]
    IsaUnavailable {
        isa: crate::Isa,
        available: Vec<crate::Isa>,
    },

    /// Activations whose row length differs from the weight matrix's.
    #[error("weights have {weight_cols} columns but activation rows have {act_cols} elements")]
    ColumnMismatch { weight_cols: usize, act_cols: usize },
}
