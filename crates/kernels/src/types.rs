//! The tensor formats TITAN understands, numbered and sized exactly as ggml numbers and sizes them.

use crate::formats::{bf16, fp16, fp32, mxfp4, q2_k, q3_k, q4_0, q4_1, q4_k, q5_0, q5_1, q5_k, q6_k, q8_0, q8_1, q8_k};

/// A GGUF / ggml tensor encoding. The discriminant is the `GGML_TYPE_*` id stored in GGUF files.
// Variant names are ggml's (`Q4_K`, not `Q4K`), so they read the same here, in GGUF tools and in llama.cpp.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2_K = 10,
    Q3_K = 11,
    Q4_K = 12,
    Q5_K = 13,
    Q6_K = 14,
    Q8_K = 15,
    /// 32-bit integers: a table (DeepSeek-V4's token-to-expert one), never a weight that is multiplied.
    I32 = 26,
    BF16 = 30,
    MXFP4 = 39,
}

impl GgmlType {
    /// Every supported type, in id order.
    pub const ALL: [GgmlType; 16] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q8_1,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q8_K,
        GgmlType::BF16,
        GgmlType::MXFP4,
    ];

    /// The type with ggml id `id`, or `None` for ids TITAN does not support (IQ*, TQ*, NVFP4, I8, I16,
    /// I64, ...). I32 is read (as a table) but not in [`GgmlType::ALL`], the number formats.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        GgmlType::ALL.into_iter().chain([GgmlType::I32]).find(|t| t.id() == id)
    }

    /// The ggml id (`GGML_TYPE_*`), as stored in GGUF tensor infos.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// The name ggml and gguf-py use ("F32", "Q4_K", ...).
    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_1 => "Q4_1",
            GgmlType::Q5_0 => "Q5_0",
            GgmlType::Q5_1 => "Q5_1",
            GgmlType::Q8_0 => "Q8_0",
            GgmlType::Q8_1 => "Q8_1",
            GgmlType::Q2_K => "Q2_K",
            GgmlType::Q3_K => "Q3_K",
            GgmlType::Q4_K => "Q4_K",
            GgmlType::Q5_K => "Q5_K",
            GgmlType::Q6_K => "Q6_K",
            GgmlType::Q8_K => "Q8_K",
            GgmlType::BF16 => "BF16",
            GgmlType::MXFP4 => "MXFP4",
            GgmlType::I32 => "I32",
        }
    }

    /// Elements per block: 1 for the float formats, 32 for the legacy quants and MXFP4, 256 for the
    /// K-quants.
    pub fn block_len(self) -> usize {
        match self {
            GgmlType::F32 => fp32::BLOCK_LEN,
            GgmlType::F16 => fp16::BLOCK_LEN,
            GgmlType::BF16 => bf16::BLOCK_LEN,
            GgmlType::Q4_0 => q4_0::BLOCK_LEN,
            GgmlType::Q4_1 => q4_1::BLOCK_LEN,
            GgmlType::Q5_0 => q5_0::BLOCK_LEN,
            GgmlType::Q5_1 => q5_1::BLOCK_LEN,
            GgmlType::Q8_0 => q8_0::BLOCK_LEN,
            GgmlType::Q8_1 => q8_1::BLOCK_LEN,
            GgmlType::Q2_K => q2_k::BLOCK_LEN,
            GgmlType::Q3_K => q3_k::BLOCK_LEN,
            GgmlType::Q4_K => q4_k::BLOCK_LEN,
            GgmlType::Q5_K => q5_k::BLOCK_LEN,
            GgmlType::Q6_K => q6_k::BLOCK_LEN,
            GgmlType::Q8_K => q8_k::BLOCK_LEN,
            GgmlType::MXFP4 => mxfp4::BLOCK_LEN,
            GgmlType::I32 => 1,
        }
    }

    /// Bytes per block (ggml's `type_size`).
    pub fn block_bytes(self) -> usize {
        match self {
            GgmlType::F32 => fp32::BLOCK_BYTES,
            GgmlType::F16 => fp16::BLOCK_BYTES,
            GgmlType::BF16 => bf16::BLOCK_BYTES,
            GgmlType::Q4_0 => q4_0::BLOCK_BYTES,
            GgmlType::Q4_1 => q4_1::BLOCK_BYTES,
            GgmlType::Q5_0 => q5_0::BLOCK_BYTES,
            GgmlType::Q5_1 => q5_1::BLOCK_BYTES,
            GgmlType::Q8_0 => q8_0::BLOCK_BYTES,
            GgmlType::Q8_1 => q8_1::BLOCK_BYTES,
            GgmlType::Q2_K => q2_k::BLOCK_BYTES,
            GgmlType::Q3_K => q3_k::BLOCK_BYTES,
            GgmlType::Q4_K => q4_k::BLOCK_BYTES,
            GgmlType::Q5_K => q5_k::BLOCK_BYTES,
            GgmlType::Q6_K => q6_k::BLOCK_BYTES,
            GgmlType::Q8_K => q8_k::BLOCK_BYTES,
            GgmlType::MXFP4 => mxfp4::BLOCK_BYTES,
            GgmlType::I32 => 4,
        }
    }

    /// Bytes taken by `n` elements, or `None` if `n` is not a whole number of blocks (or the size overflows).
    pub fn row_bytes(self, n: usize) -> Option<usize> {
        if !n.is_multiple_of(self.block_len()) {
            return None;
        }
        (n / self.block_len()).checked_mul(self.block_bytes())
    }

    /// The activation format that weights of this type are multiplied with.
    ///
    /// Float weights take f32 activations (more accurate than llama.cpp, which rounds activations to f16);
    /// the quantised types take what llama.cpp's CPU backend uses (`vec_dot_type`). The activation formats
    /// themselves pair with their own kind, so every type can be a weight.
    /// An I32 table has itself, which no activation can be: a product with one is refused.
    pub fn act_type(self) -> GgmlType {
        match self {
            GgmlType::I32 => GgmlType::I32,
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => GgmlType::F32,
            GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::MXFP4 => GgmlType::Q8_0,
            GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q8_1 => GgmlType::Q8_1,
            GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K | GgmlType::Q8_K => {
                GgmlType::Q8_K
            }
        }
    }

    /// Whether activations can be quantised into this type (`quantize_row` accepts it).
    pub fn is_act_type(self) -> bool {
        matches!(self, GgmlType::F32 | GgmlType::Q8_0 | GgmlType::Q8_1 | GgmlType::Q8_K)
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_unknown_ids_are_none() {
        for t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
        }
        assert_eq!(GgmlType::from_id(26), Some(GgmlType::I32));
        // Q4_2/Q4_3 (removed), IQ2_XXS, I8, NVFP4 and an id past the end.
        for id in [4, 5, 16, 24, 40, 1000] {
            assert_eq!(GgmlType::from_id(id), None);
        }
    }

    #[test]
    fn sizes_match_ggml_type_traits() {
        // (type, blck_size, type_size) from ggml.c's type_traits table.
        let table = [
            (GgmlType::F32, 1, 4),
            (GgmlType::F16, 1, 2),
            (GgmlType::BF16, 1, 2),
            (GgmlType::Q4_0, 32, 18),
            (GgmlType::Q4_1, 32, 20),
            (GgmlType::Q5_0, 32, 22),
            (GgmlType::Q5_1, 32, 24),
            (GgmlType::Q8_0, 32, 34),
            (GgmlType::Q8_1, 32, 36),
            (GgmlType::Q2_K, 256, 84),
            (GgmlType::Q3_K, 256, 110),
            (GgmlType::Q4_K, 256, 144),
            (GgmlType::Q5_K, 256, 176),
            (GgmlType::Q6_K, 256, 210),
            (GgmlType::Q8_K, 256, 292),
            (GgmlType::MXFP4, 32, 17),
        ];
        for (t, len, bytes) in table {
            assert_eq!((t.block_len(), t.block_bytes()), (len, bytes), "{t}");
        }
    }

    #[test]
    fn row_bytes_needs_whole_blocks() {
        assert_eq!(GgmlType::Q4_K.row_bytes(512), Some(288));
        assert_eq!(GgmlType::Q4_K.row_bytes(100), None);
        assert_eq!(GgmlType::F16.row_bytes(7), Some(14));
        assert_eq!(GgmlType::Q8_0.row_bytes(0), Some(0));
        assert_eq!(GgmlType::F32.row_bytes(usize::MAX), None);
    }

    #[test]
    fn act_types_are_activation_formats() {
        for t in GgmlType::ALL {
            assert!(t.act_type().is_act_type(), "{t}");
        }
        assert_eq!(GgmlType::Q4_1.act_type(), GgmlType::Q8_1);
        assert_eq!(GgmlType::Q6_K.act_type(), GgmlType::Q8_K);
        assert_eq!(GgmlType::MXFP4.act_type(), GgmlType::Q8_0);
    }
}
