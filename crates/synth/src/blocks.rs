//! Random weights written straight into their GGUF encoding: no f32 matrix, no quantiser.
//!
//! Every quant is `offset + a - b` with `a`, `b` independent and uniform: a symmetric, triangular,
//! zero-mean distribution over the format's whole range (bell-shaped like real weights, and — unlike
//! uniform nibbles, whose mean is -0.5 — with no common direction that every row would share and
//! that would add up over the layers). The block scale is chosen so the decoded elements have the
//! standard deviation the caller asks for, jittered by up to ±12.5% per block so that blocks are not
//! all alike. K-quant mins are set so the decoded values stay centred: `dmin · min = d · scale · offset`.
//!
//! Packing mirrors the layouts documented in `titan_kernels::formats`; the tests decode what is
//! written with `titan_kernels::dequantize_row` and compare with the quants that were drawn.

use half::f16;
use titan_kernels::GgmlType;

/// A small, fast generator (wyrand). Each chunk of a tensor gets its own, seeded from the file's
/// seed and the chunk's position, so the bytes do not depend on the thread count.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(splitmix(seed))
    }

    #[inline(always)]
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0xa076_1d64_78bd_642f);
        let t = (self.0 as u128).wrapping_mul((self.0 ^ 0xe703_7ed1_a0b4_28db) as u128);
        ((t >> 64) ^ t) as u64
    }

    /// Uniform in [0, 1).
    pub(crate) fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Approximately standard normal (sum of four uniforms: mean 0, variance 1, bounded by ±3.46).
    pub(crate) fn normal(&mut self) -> f32 {
        let s = self.next_f32() + self.next_f32() + self.next_f32() + self.next_f32();
        (s - 2.0) * 3f32.sqrt()
    }
}

/// Spreads nearby seeds (chunk 0, 1, 2, ...) over unrelated states.
pub(crate) use titan_kernels::splitmix::mix as splitmix;

/// Draws `bits`-bit triangular quants `a - b` (in `-(2^bits - 1) ..= 2^bits - 1`), 64 random bits at a time.
struct Tri<'a> {
    rng: &'a mut Rng,
    pool: u64,
    left: u32,
    bits: u32,
}

impl<'a> Tri<'a> {
    fn new(rng: &'a mut Rng, bits: u32) -> Self {
        Tri {
            rng,
            pool: 0,
            left: 0,
            bits,
        }
    }

    #[inline(always)]
    fn next(&mut self) -> i32 {
        if self.left < 2 * self.bits {
            self.pool = self.rng.next_u64();
            self.left = 64;
        }
        let mask = (1u64 << self.bits) - 1;
        let a = (self.pool & mask) as i32;
        let b = ((self.pool >> self.bits) & mask) as i32;
        self.pool >>= 2 * self.bits;
        self.left -= 2 * self.bits;
        a - b
    }
}

/// Standard deviation of `a - b`, `a` and `b` uniform over `0 .. 2^bits`: sqrt(2 (4^bits - 1) / 12).
fn tri_std(bits: u32) -> f32 {
    let n = (1u64 << bits) as f32;
    (2.0 * (n * n - 1.0) / 12.0).sqrt()
}

/// K-quant sub-block scales are drawn from 4..=7 (Q4_K, Q5_K) or 8..=15 (Q6_K): their root mean square.
const RMS_SCALE_4_7: f32 = 5.612_486; // sqrt((16 + 25 + 36 + 49) / 4)
const RMS_SCALE_8_15: f32 = 11.726_039; // sqrt((64 + 81 + ... + 225) / 8)

/// The types [`fill`] can write.
pub(crate) fn supported(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(ty, F32 | F16 | Q4_0 | Q5_0 | Q8_0 | Q4_K | Q5_K | Q6_K | MXFP4)
}

/// MXFP4's 4-bit floats, doubled to integers as ggml's `kvalues_mxfp4` holds them: 16 codes, symmetric.
const MXFP4_VALUES: [f32; 16] = [0., 1., 2., 3., 4., 6., 8., 12., 0., -1., -2., -3., -4., -6., -8., -12.];

/// Fill `out` (whole blocks of `ty`) with random values of standard deviation `sigma`.
///
/// # Panics
///
/// If `ty` is not [`supported`] (the planner never asks for one that is not).
pub(crate) fn fill(ty: GgmlType, sigma: f32, rng: &mut Rng, out: &mut [u8]) {
    let jitter = |rng: &mut Rng| 0.875 + 0.25 * rng.next_f32();
    match ty {
        GgmlType::F32 => {
            for c in out.chunks_exact_mut(4) {
                c.copy_from_slice(&(sigma * rng.normal()).to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for c in out.chunks_exact_mut(2) {
                c.copy_from_slice(&f16::from_f32(sigma * rng.normal()).to_le_bytes());
            }
        }
        GgmlType::Q4_0 => {
            let d0 = sigma / tri_std(3);
            for block in out.chunks_exact_mut(18) {
                let d = f16::from_f32(d0 * jitter(rng));
                block[..2].copy_from_slice(&d.to_le_bytes());
                let mut tri = Tri::new(rng, 3);
                let q: [u8; 32] = std::array::from_fn(|_| (8 + tri.next()) as u8);
                pack_q4_0(&q, &mut block[2..]);
            }
        }
        GgmlType::Q5_0 => {
            let d0 = sigma / tri_std(4);
            for block in out.chunks_exact_mut(22) {
                let d = f16::from_f32(d0 * jitter(rng));
                block[..2].copy_from_slice(&d.to_le_bytes());
                let mut tri = Tri::new(rng, 4);
                let q: [u8; 32] = std::array::from_fn(|_| (16 + tri.next()) as u8);
                pack_q5_0(&q, &mut block[2..]);
            }
        }
        GgmlType::Q8_0 => {
            let d0 = sigma / tri_std(7);
            for block in out.chunks_exact_mut(34) {
                let d = f16::from_f32(d0 * jitter(rng));
                block[..2].copy_from_slice(&d.to_le_bytes());
                let mut tri = Tri::new(rng, 7);
                for b in &mut block[2..] {
                    *b = tri.next() as i8 as u8;
                }
            }
        }
        GgmlType::Q4_K => {
            let d0 = sigma / (tri_std(3) * RMS_SCALE_4_7);
            for block in out.chunks_exact_mut(144) {
                let d = f16::from_f32(d0 * jitter(rng));
                // value = d·scale·q - dmin·min with dmin = d, min = 8·scale: d·scale·(q - 8).
                let scales = k_scales(rng, 8, 1);
                block[..2].copy_from_slice(&d.to_le_bytes());
                block[2..4].copy_from_slice(&d.to_le_bytes());
                pack_scale_min(&scales, &mut block[4..16]);
                let mut tri = Tri::new(rng, 3);
                let q: [u8; 256] = std::array::from_fn(|_| (8 + tri.next()) as u8);
                pack_q4_k(&q, &mut block[16..]);
            }
        }
        GgmlType::Q5_K => {
            let d0 = sigma / (tri_std(4) * RMS_SCALE_4_7);
            for block in out.chunks_exact_mut(176) {
                let d = f16::from_f32(d0 * jitter(rng));
                // dmin = 2d, min = 8·scale: d·scale·(q - 16).
                let dmin = f16::from_f32(2.0 * d.to_f32());
                let scales = k_scales(rng, 16, 2);
                block[..2].copy_from_slice(&d.to_le_bytes());
                block[2..4].copy_from_slice(&dmin.to_le_bytes());
                pack_scale_min(&scales, &mut block[4..16]);
                let mut tri = Tri::new(rng, 4);
                let q: [u8; 256] = std::array::from_fn(|_| (16 + tri.next()) as u8);
                pack_q5_k(&q, &mut block[16..]);
            }
        }
        GgmlType::Q6_K => {
            let d0 = sigma / (tri_std(5) * RMS_SCALE_8_15);
            for block in out.chunks_exact_mut(210) {
                let d = f16::from_f32(d0 * jitter(rng));
                let mut tri = Tri::new(rng, 5);
                let q: [u8; 256] = std::array::from_fn(|_| (32 + tri.next()) as u8);
                pack_q6_k(&q, &mut block[..192]);
                let bits = rng.next_u64();
                for s in 0..16 {
                    block[192 + s] = 8 + ((bits >> (3 * s)) & 7) as u8;
                }
                block[208..].copy_from_slice(&d.to_le_bytes());
            }
        }
        GgmlType::MXFP4 => {
            // Codes uniform over all 16 (zero-mean, and bell-shaped in value: the codes crowd near 0).
            // The scale is a power of two, so no single one gives `sigma`: each block takes the one
            // below or the one above at random, with odds that make the mean square exact.
            let code_rms = (MXFP4_VALUES.iter().map(|v| v * v).sum::<f32>() / 16.0).sqrt();
            // value = 2^(e - 128) · doubled code (ggml's `ggml_e8m0_to_fp32_half`)
            let want = sigma / code_rms;
            let e_lo = want.log2().floor();
            let up = ((want / e_lo.exp2()).powi(2) - 1.0) / 3.0;
            let e_lo = (e_lo + 128.0).clamp(1.0, 253.0) as u8;
            for block in out.chunks_exact_mut(17) {
                block[0] = e_lo + u8::from(rng.next_f32() < up);
                let bits = rng.next_u64() as u128 | (rng.next_u64() as u128) << 64;
                for (j, b) in block[1..].iter_mut().enumerate() {
                    *b = (bits >> (8 * j)) as u8;
                }
            }
        }
        other => panic!("synth cannot write {other} blocks"),
    }
}

/// Encode the given values `x` (whole blocks of `ty`) with one fixed step for the whole tensor: the step
/// `fill` would use for `sigma`, a fixed sub-block scale for K-quants, round to nearest, clamp to the
/// format's range. For the few tensors with structure (token_embd, output) the values come first.
pub(crate) fn encode(ty: GgmlType, sigma: f32, x: &[f32], out: &mut [u8]) {
    let quant = |v: f32, d: f32, lo: i32, hi: i32| ((v / d).round() as i32).clamp(lo, hi);
    match ty {
        GgmlType::F32 => {
            for (c, &v) in out.chunks_exact_mut(4).zip(x) {
                c.copy_from_slice(&v.to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for (c, &v) in out.chunks_exact_mut(2).zip(x) {
                c.copy_from_slice(&f16::from_f32(v).to_le_bytes());
            }
        }
        GgmlType::Q4_0 => {
            let d = f16::from_f32(sigma / tri_std(3));
            for (block, xs) in out.chunks_exact_mut(18).zip(x.chunks_exact(32)) {
                block[..2].copy_from_slice(&d.to_le_bytes());
                let q: [u8; 32] = std::array::from_fn(|i| (8 + quant(xs[i], d.to_f32(), -8, 7)) as u8);
                pack_q4_0(&q, &mut block[2..]);
            }
        }
        GgmlType::Q5_0 => {
            let d = f16::from_f32(sigma / tri_std(4));
            for (block, xs) in out.chunks_exact_mut(22).zip(x.chunks_exact(32)) {
                block[..2].copy_from_slice(&d.to_le_bytes());
                let q: [u8; 32] = std::array::from_fn(|i| (16 + quant(xs[i], d.to_f32(), -16, 15)) as u8);
                pack_q5_0(&q, &mut block[2..]);
            }
        }
        GgmlType::Q8_0 => {
            let d = f16::from_f32(sigma / tri_std(7));
            for (block, xs) in out.chunks_exact_mut(34).zip(x.chunks_exact(32)) {
                block[..2].copy_from_slice(&d.to_le_bytes());
                for (b, &v) in block[2..].iter_mut().zip(xs) {
                    *b = quant(v, d.to_f32(), -127, 127) as i8 as u8;
                }
            }
        }
        GgmlType::Q4_K | GgmlType::Q5_K => {
            let (bits, bytes, centre, dmin_over_d) = if ty == GgmlType::Q4_K {
                (3, 144, 8, 1)
            } else {
                (4, 176, 16, 2)
            };
            let d = f16::from_f32(sigma / (tri_std(bits) * 6.0));
            let dmin = f16::from_f32(dmin_over_d as f32 * d.to_f32());
            let step = d.to_f32() * 6.0;
            let sm = [(6u8, centre * 6 / dmin_over_d); 8];
            for (block, xs) in out.chunks_exact_mut(bytes).zip(x.chunks_exact(256)) {
                block[..2].copy_from_slice(&d.to_le_bytes());
                block[2..4].copy_from_slice(&dmin.to_le_bytes());
                pack_scale_min(&sm, &mut block[4..16]);
                let c = centre as i32;
                let q: [u8; 256] = std::array::from_fn(|i| (c + quant(xs[i], step, -c, c - 1)) as u8);
                if ty == GgmlType::Q4_K {
                    pack_q4_k(&q, &mut block[16..]);
                } else {
                    pack_q5_k(&q, &mut block[16..]);
                }
            }
        }
        GgmlType::Q6_K => {
            let d = f16::from_f32(sigma / (tri_std(5) * 12.0));
            let step = d.to_f32() * 12.0;
            for (block, xs) in out.chunks_exact_mut(210).zip(x.chunks_exact(256)) {
                let q: [u8; 256] = std::array::from_fn(|i| (32 + quant(xs[i], step, -32, 31)) as u8);
                pack_q6_k(&q, &mut block[..192]);
                block[192..208].fill(12);
                block[208..].copy_from_slice(&d.to_le_bytes());
            }
        }
        other => panic!("synth cannot write {other} blocks"),
    }
}

/// Eight (scale, min) pairs for Q4_K / Q5_K: scale in 4..=7, min = centre · scale / dmin_over_d.
fn k_scales(rng: &mut Rng, centre: u8, dmin_over_d: u8) -> [(u8, u8); 8] {
    let bits = rng.next_u64();
    std::array::from_fn(|s| {
        let scale = 4 + ((bits >> (2 * s)) & 3) as u8;
        (scale, centre * scale / dmin_over_d)
    })
}

/// The inverse of `q4_k::scale_min`: 8 six-bit scales and mins into 12 bytes.
fn pack_scale_min(sm: &[(u8, u8); 8], out: &mut [u8]) {
    out.fill(0);
    for (s, &(scale, min)) in sm.iter().enumerate() {
        if s < 4 {
            out[s] |= scale & 63;
            out[s + 4] |= min & 63;
        } else {
            out[s + 4] = (scale & 0x0F) | ((min & 0x0F) << 4);
            out[s - 4] |= (scale >> 4) << 6;
            out[s] |= (min >> 4) << 6;
        }
    }
}

/// Q4_0: element i < 16 in the low nibble of qs[i], element i + 16 in its high nibble.
fn pack_q4_0(q: &[u8; 32], qs: &mut [u8]) {
    for i in 0..16 {
        qs[i] = q[i] | (q[i + 16] << 4);
    }
}

/// Q5_0: `qh` (u32) holds bit 4 of element i at bit i; low nibbles as Q4_0.
fn pack_q5_0(q: &[u8; 32], out: &mut [u8]) {
    let mut qh = 0u32;
    for (i, &v) in q.iter().enumerate() {
        qh |= u32::from(v >> 4) << i;
    }
    out[..4].copy_from_slice(&qh.to_le_bytes());
    for i in 0..16 {
        out[4 + i] = (q[i] & 0x0F) | ((q[i + 16] & 0x0F) << 4);
    }
}

/// Q4_K: element e of sub-block s = e / 32 is the low (even s) or high (odd s) nibble of qs[32(s/2) + e%32].
fn pack_q4_k(q: &[u8; 256], qs: &mut [u8]) {
    for pair in 0..4 {
        for l in 0..32 {
            qs[32 * pair + l] = q[64 * pair + l] | (q[64 * pair + 32 + l] << 4);
        }
    }
}

/// Q5_K: `qh[32]` then `qs[128]`; the fifth bit of element e (sub-block s, l = e % 32) is bit s of qh[l].
fn pack_q5_k(q: &[u8; 256], out: &mut [u8]) {
    let (qh, qs) = out.split_at_mut(32);
    qh.fill(0);
    for (e, &v) in q.iter().enumerate() {
        qh[e % 32] |= (v >> 4) << (e / 32);
    }
    for pair in 0..4 {
        for l in 0..32 {
            qs[32 * pair + l] = (q[64 * pair + l] & 0x0F) | ((q[64 * pair + 32 + l] & 0x0F) << 4);
        }
    }
}

/// Q6_K: `ql[128]` then `qh[64]`; element e = 128n + 32k + l.
fn pack_q6_k(q: &[u8; 256], out: &mut [u8]) {
    let (ql, qh) = out.split_at_mut(128);
    ql.fill(0);
    qh.fill(0);
    for (e, &v) in q.iter().enumerate() {
        let (n, k, l) = (e / 128, e % 128 / 32, e % 32);
        let byte = &mut ql[64 * n + 32 * (k % 2) + l];
        *byte |= if k < 2 { v & 0x0F } else { (v & 0x0F) << 4 };
        qh[32 * n + l] |= (v >> 4) << (2 * k);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decoding what `fill` wrote gives values of the requested spread, centred on zero, on the
    /// format's grid.
    #[test]
    fn every_type_decodes_to_the_requested_spread() {
        for ty in [
            GgmlType::F32,
            GgmlType::F16,
            GgmlType::Q4_0,
            GgmlType::Q5_0,
            GgmlType::Q8_0,
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
            GgmlType::MXFP4,
        ] {
            let n = 256 * 512;
            let mut bytes = vec![0u8; ty.row_bytes(n).unwrap()];
            fill(ty, 0.02, &mut Rng::new(3), &mut bytes);
            let mut x = vec![0f32; n];
            titan_kernels::dequantize_row(ty, &bytes, &mut x).unwrap();
            let mean = x.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
            let std = (x.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n as f64).sqrt();
            assert!(mean.abs() < 0.0005, "{ty}: mean {mean}");
            assert!((std - 0.02).abs() < 0.0006, "{ty}: std {std}");
        }
    }

    /// `encode` keeps values within a quantisation step (away from the clamped tails).
    #[test]
    fn encode_round_trips_within_a_step() {
        let mut rng = Rng::new(4);
        let x: Vec<f32> = (0..4096).map(|_| 0.5 * rng.normal()).collect();
        for (ty, step) in [
            (GgmlType::Q4_0, 0.155),
            (GgmlType::Q8_0, 0.0097),
            (GgmlType::Q4_K, 0.155),
            (GgmlType::Q5_K, 0.077),
            (GgmlType::Q6_K, 0.039),
            (GgmlType::Q5_0, 0.077),
            (GgmlType::F16, 0.001),
        ] {
            let mut bytes = vec![0u8; ty.row_bytes(x.len()).unwrap()];
            encode(ty, 0.5, &x, &mut bytes);
            let mut y = vec![0f32; x.len()];
            titan_kernels::dequantize_row(ty, &bytes, &mut y).unwrap();
            for (a, b) in x.iter().zip(&y) {
                if a.abs() < 0.9 {
                    assert!((a - b).abs() <= step * 0.5 + 1e-3, "{ty}: {a} -> {b}");
                }
            }
        }
    }

    /// The packers are exact inverses of the kernels' layouts: a block of known quants decodes to
    /// `d · scale · (q - centre)` element by element.
    #[test]
    fn packers_match_the_kernels_layouts() {
        let mut rng = Rng::new(9);
        let q: [u8; 256] = std::array::from_fn(|_| (rng.next_u64() % 64) as u8);
        let d = f16::from_f32(0.5);
        let decode = |ty: GgmlType, block: &[u8], n: usize| {
            let mut x = vec![0f32; n];
            titan_kernels::dequantize_row(ty, block, &mut x).unwrap();
            x
        };

        let mut b = vec![0u8; 18];
        b[..2].copy_from_slice(&d.to_le_bytes());
        let q4: [u8; 32] = std::array::from_fn(|i| q[i] & 15);
        pack_q4_0(&q4, &mut b[2..]);
        assert_eq!(
            decode(GgmlType::Q4_0, &b, 32),
            q4.iter().map(|&v| 0.5 * (v as f32 - 8.0)).collect::<Vec<_>>()
        );

        let mut b = vec![0u8; 22];
        b[..2].copy_from_slice(&d.to_le_bytes());
        let q5: [u8; 32] = std::array::from_fn(|i| q[i] & 31);
        pack_q5_0(&q5, &mut b[2..]);
        assert_eq!(
            decode(GgmlType::Q5_0, &b, 32),
            q5.iter().map(|&v| 0.5 * (v as f32 - 16.0)).collect::<Vec<_>>()
        );

        let sm: [(u8, u8); 8] = std::array::from_fn(|s| (1 + 7 * s as u8, 60 - 5 * s as u8));
        let mut b = vec![0u8; 144];
        b[..2].copy_from_slice(&d.to_le_bytes());
        b[2..4].copy_from_slice(&f16::from_f32(0.25).to_le_bytes());
        pack_scale_min(&sm, &mut b[4..16]);
        let q4: [u8; 256] = std::array::from_fn(|i| q[i] & 15);
        pack_q4_k(&q4, &mut b[16..]);
        let want: Vec<f32> = (0..256)
            .map(|e| 0.5 * sm[e / 32].0 as f32 * q4[e] as f32 - 0.25 * sm[e / 32].1 as f32)
            .collect();
        assert_eq!(decode(GgmlType::Q4_K, &b, 256), want);

        let mut b = vec![0u8; 176];
        b[..2].copy_from_slice(&d.to_le_bytes());
        b[2..4].copy_from_slice(&f16::from_f32(0.25).to_le_bytes());
        pack_scale_min(&sm, &mut b[4..16]);
        let q5: [u8; 256] = std::array::from_fn(|i| q[i] & 31);
        pack_q5_k(&q5, &mut b[16..]);
        let want: Vec<f32> = (0..256)
            .map(|e| 0.5 * sm[e / 32].0 as f32 * q5[e] as f32 - 0.25 * sm[e / 32].1 as f32)
            .collect();
        assert_eq!(decode(GgmlType::Q5_K, &b, 256), want);

        let mut b = vec![0u8; 210];
        pack_q6_k(&q, &mut b[..192]);
        for s in 0..16 {
            b[192 + s] = (s as i8 - 8) as u8;
        }
        b[208..].copy_from_slice(&d.to_le_bytes());
        let want: Vec<f32> = (0..256)
            .map(|e| 0.5 * (e / 16) as f32 - 4.0)
            .zip(&q)
            .map(|(ds, &v)| ds * (v as f32 - 32.0))
            .collect();
        let got = decode(GgmlType::Q6_K, &b, 256);
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g, w);
        }
    }
}
