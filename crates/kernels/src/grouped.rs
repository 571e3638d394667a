//! Q8_0 activations regrouped for the SIMD Q4_0, Q5_0, Q8_0 and MXFP4 kernels.
//!
//! A SIMD register multiplies 4 bytes per 32-bit lane, so a 32-element block spans eight lanes, and the
//! block's sum would have to be gathered from them (a horizontal reduction per block and activation
//! row: most of the arithmetic in a prefill matmul). Instead, eight consecutive blocks are laid out
//! *across* the lanes: register `j` holds four quants of block `k` in lane `k`, so eight
//! multiply-accumulates leave block `k`'s exact sum in lane `k` with no reduction at all. The weights
//! are transposed the same way in registers (once per weight block, shared by every activation row);
//! the activations are transposed here, once per row, when they are quantised.
//!
//! A group (8 blocks, 256 elements) takes [`GROUP_BYTES`]:
//!
//! - `[0, 32)`: the blocks' scales as f32 (each the block's f16 scale widened, exactly);
//! - `[32, 64)`: each block's sum of quants as i32 (the kernels use unsigned weight bytes and take
//!   `offset · Σa` back out);
//! - `[64, 320)`: eight registers of 32 bytes; register `j = 2m + h` holds, in lane `k`, the quants of
//!   elements `16h + 4m .. 16h + 4m + 4` of block `k` — the elements a Q4_0 byte quad `m` holds in its
//!   low (`h = 0`) and high (`h = 1`) nibbles, and the two 16-byte halves of a Q8_0 block.
//!
//! A row's last group is padded with zero blocks (scale 0, quants 0), whose terms are ±0 and leave the
//! accumulators as they are. The bytes hold exactly the information of the plain Q8_0 row, so the
//! kernels reading them produce the plain scalar twin's bits.

use crate::formats::{mxfp4, q4_0, q8_0};
use crate::GgmlType;

/// Blocks per group: the eight lanes of a 256-bit register of i32.
pub(crate) const GROUP_BLOCKS: usize = 8;
/// Bytes per group.
pub(crate) const GROUP_BYTES: usize = 64 + GROUP_BLOCKS * q8_0::BLOCK_LEN;
/// Offset of the quant registers within a group.
pub(crate) const QUANTS_AT: usize = 64;

/// Bytes of a regrouped row of `blocks` Q8_0 blocks.
pub(crate) fn row_bytes(blocks: usize) -> usize {
    blocks.div_ceil(GROUP_BLOCKS) * GROUP_BYTES
}

/// Writes the regrouped form of the plain Q8_0 row `plain` into `dst` (`row_bytes` of its blocks).
pub(crate) fn regroup(plain: &[u8], dst: &mut [u8]) {
    dst.fill(0);
    for (b, block) in plain.chunks_exact(q8_0::BLOCK_BYTES).enumerate() {
        let (group, k) = (b / GROUP_BLOCKS, b % GROUP_BLOCKS);
        let g = &mut dst[group * GROUP_BYTES..(group + 1) * GROUP_BYTES];
        let quants = q8_0::quants(block);
        g[4 * k..4 * k + 4].copy_from_slice(&q8_0::scale(block).to_le_bytes());
        let sum: i32 = quants.iter().map(|&q| i32::from(q as i8)).sum();
        g[32 + 4 * k..32 + 4 * k + 4].copy_from_slice(&sum.to_le_bytes());
        for (e, quad) in quants.chunks_exact(4).enumerate() {
            // Elements 4e.. are quad m = e % 4 of half h = e / 4.
            let j = 2 * (e % 4) + e / 4;
            let at = QUANTS_AT + 32 * j + 4 * k;
            g[at..at + 4].copy_from_slice(quad);
        }
    }
}

/// Q4_0, Q8_0 or MXFP4 weights laid out for the SIMD kernels, once at load: each row's groups of
/// eight blocks become the eight blocks' scales (f16, 16 bytes; MXFP4's E8M0 exponents, 8 bytes),
/// then the quants in the registers the kernels would otherwise build by transposing (`4 · 32` bytes
/// for Q4_0 and MXFP4: register `m` holds byte quad `m` of block `k` in lane `k`; `8 · 32` for Q8_0:
/// register `2m + h` holds quants `16h + 4m ..` of block `k` in lane `k`, as the activations). A group
/// keeps its size, so a row does too. A row's last `t < 8` blocks (DeepSeek-V2-Lite's and Qwen2-MoE's
/// 1408-wide expert rows end in four, gpt-oss's 2880-wide rows in two) are laid out the same way with
/// `t` lanes: their `t` scales, then each register's `t` lanes (`4t` bytes), which the kernels load
/// with a lane mask — the zero lanes a padded group would have, without building one per row.
///
/// This is the bytes of one block's scale in that layout: an f16, or MXFP4's one exponent byte.
fn scale_bytes(ty: GgmlType) -> usize {
    if ty == GgmlType::MXFP4 {
        1
    } else {
        2
    }
}

/// Whether `ty` rows of `cols` elements can be regrouped: Q4_0, Q8_0 or MXFP4 rows of at least one group.
pub fn weights_regroupable(ty: GgmlType, cols: usize) -> bool {
    matches!(ty, GgmlType::Q4_0 | GgmlType::Q8_0 | GgmlType::MXFP4)
        && cols.is_multiple_of(q8_0::BLOCK_LEN)
        && cols >= GROUP_BLOCKS * q8_0::BLOCK_LEN
}

/// Writes the regrouped form of the `ty` rows `src` (`row_bytes` each) into `dst` (the same length).
/// The caller has checked [`weights_regroupable`] for the row length.
pub(crate) fn regroup_weights(ty: GgmlType, row_bytes: usize, src: &[u8], dst: &mut [u8]) {
    regroup_rows(ty, row_bytes, Some(src), dst)
}

/// [`regroup_weights`] in place.
pub(crate) fn regroup_weights_in_place(ty: GgmlType, row_bytes: usize, data: &mut [u8]) {
    regroup_rows(ty, row_bytes, None, data)
}

/// `dst` regrouped from `src`, or from its own bytes when `src` is `None`.
fn regroup_rows(ty: GgmlType, row_bytes: usize, src: Option<&[u8]>, dst: &mut [u8]) {
    match ty {
        GgmlType::Q4_0 => regroup_groups::<{ q4_0::BLOCK_BYTES }, 2, false>(row_bytes, src, dst),
        GgmlType::Q8_0 => regroup_groups::<{ q8_0::BLOCK_BYTES }, 2, true>(row_bytes, src, dst),
        GgmlType::MXFP4 => regroup_groups::<{ mxfp4::BLOCK_BYTES }, 1, false>(row_bytes, src, dst),
        _ => unreachable!("{} weights are not regrouped (weights_regroupable)", ty.name()),
    }
}

/// [`regroup_rows`] for blocks of `BB` bytes whose scale takes the first `S` (`Q8`: Q8_0's register
/// order), each run of up to eight blocks copied to the stack first (which is also what lets it work
/// in place): with the sizes and offsets known to the compiler the copies need no bounds checks, which
/// made a 2.65 MB Qwen3-30B-A3B Q4_0 expert regroup in 0.5 ms instead of 1.5 (the store's `record_cpu`
/// example) — time its I/O thread takes from the two cores of a small machine for every record
/// streamed.
fn regroup_groups<const BB: usize, const S: usize, const Q8: bool>(
    row_bytes: usize,
    src: Option<&[u8]>,
    dst: &mut [u8],
) {
    let mut group = [0u8; GROUP_BLOCKS * q8_0::BLOCK_BYTES];
    let group = &mut group[..GROUP_BLOCKS * BB];
    for (r, row) in dst.chunks_mut(row_bytes).enumerate() {
        let src_row = src.map(|src| &src[r * row_bytes..(r + 1) * row_bytes]);
        for (i, g_dst) in row.chunks_mut(GROUP_BLOCKS * BB).enumerate() {
            let group = &mut group[..g_dst.len()];
            match src_row {
                Some(s) => group.copy_from_slice(&s[i * GROUP_BLOCKS * BB..][..g_dst.len()]),
                None => group.copy_from_slice(g_dst),
            }
            let lanes = g_dst.len() / BB;
            for (k, block) in group.chunks_exact(BB).enumerate() {
                g_dst[S * k..S * k + S].copy_from_slice(&block[..S]);
                for quad in 0..(BB - S) / 4 {
                    let at = lanes * (S + 4 * quad_register(Q8, quad)) + 4 * k;
                    g_dst[at..at + 4].copy_from_slice(&block[S + 4 * quad..S + 4 + 4 * quad]);
                }
            }
        }
    }
}

/// The plain blocks of one regrouped run of blocks (a group, or a row's last `t < 8` blocks) into `dst`
/// (as long).
pub(crate) fn ungroup_weights(ty: GgmlType, group: &[u8], dst: &mut [u8]) {
    let (bb, s) = (ty.block_bytes(), scale_bytes(ty));
    let lanes = group.len() / bb;
    for (k, block) in dst.chunks_exact_mut(bb).enumerate() {
        block[..s].copy_from_slice(&group[s * k..s * k + s]);
        for quad in 0..(bb - s) / 4 {
            let at = lanes * (s + 4 * quad_register(ty == GgmlType::Q8_0, quad)) + 4 * k;
            block[s + 4 * quad..s + 4 * quad + 4].copy_from_slice(&group[at..at + 4]);
        }
    }
}

/// The register that holds byte quad `quad` of a block's quants: Q4_0's and MXFP4's four quads in order (each
/// holds elements `4m ..` and `16 + 4m ..`); Q8_0's (`q8`) eight in the activations' order.
fn quad_register(q8: bool, quad: usize) -> usize {
    if q8 {
        2 * (quad % 4) + quad / 4
    } else {
        quad
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::f16_bytes;

    #[test]
    fn each_block_sits_in_its_own_lane_of_every_register() {
        // 9 blocks: one full group and one block of the next. Block b's quant i is (b * 32 + i) % 127.
        let mut plain = Vec::new();
        for b in 0..9 {
            plain.extend_from_slice(&f16_bytes(0.5 + b as f32));
            plain.extend((0..32).map(|i| ((b * 32 + i) % 127) as u8));
        }
        let mut g = vec![0xAAu8; row_bytes(9)];
        assert_eq!(g.len(), 2 * GROUP_BYTES);
        regroup(&plain, &mut g);
        for b in 0..9 {
            let (grp, k) = (b / 8, b % 8);
            let base = grp * GROUP_BYTES;
            let at = |off: usize| base + off + 4 * k;
            let scale = f32::from_le_bytes(g[at(0)..at(0) + 4].try_into().unwrap());
            assert_eq!(scale, 0.5 + b as f32);
            let quant = |i: usize| ((b * 32 + i) % 127) as i32;
            let sum = i32::from_le_bytes(g[at(32)..at(32) + 4].try_into().unwrap());
            assert_eq!(sum, (0..32).map(quant).sum::<i32>());
            // Element 16h + 4m + t is byte t of lane k of register 2m + h.
            for h in 0..2 {
                for m in 0..4 {
                    for t in 0..4 {
                        let byte = g[at(QUANTS_AT + 32 * (2 * m + h)) + t];
                        assert_eq!(i32::from(byte), quant(16 * h + 4 * m + t), "block {b}");
                    }
                }
            }
        }
        // The padding blocks of the second group are all zero.
        let pad = &g[GROUP_BYTES..];
        for k in 1..8 {
            assert_eq!(pad[4 * k..4 * k + 4], [0; 4]);
            assert_eq!(pad[32 + 4 * k..32 + 4 * k + 4], [0; 4]);
            for j in 0..8 {
                let at = QUANTS_AT + 32 * j + 4 * k;
                assert_eq!(pad[at..at + 4], [0; 4]);
            }
        }
    }
}
