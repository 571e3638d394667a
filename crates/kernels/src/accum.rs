//! The one float accumulator every dot product uses, so that a SIMD twin can reproduce it bit for bit.

/// Eight independent f32 partial sums. Term `i` (an element for float formats, a block for quantised
/// ones) is added to lane `i % 8` with a plain add, and the lanes are reduced in the fixed tree
/// `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))`.
///
/// That tree is what an 8-wide register (AVX2 `__m256`) reduces to with the usual sequence
/// (add the high 128 bits onto the low, then `movehl`, then a one-lane shuffle); a NEON twin with two
/// 4-wide registers adds them (`l_k + l_{k+4}`) and then must reduce in this order, not `vaddvq`'s.
#[derive(Clone, Copy, Default)]
pub(crate) struct Lanes8(pub(crate) [f32; 8]);

impl Lanes8 {
    /// Adds the `i`-th term of the sum.
    #[inline(always)]
    pub(crate) fn add(&mut self, i: usize, term: f32) {
        self.0[i % 8] += term;
    }

    /// The total, reduced in the documented order.
    #[inline(always)]
    pub(crate) fn sum(self) -> f32 {
        let l = self.0;
        ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]))
    }
}
