//! SplitMix64: the one small random generator of the project — the sampler's draws, synthetic weights,
//! test data. Well known, stateless to seed, and the same numbers on every platform.

/// The generator: a counter advanced by the golden ratio, each value mixed by [`mix`].
#[derive(Clone, Debug)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GOLDEN);
        finalise(self.0)
    }

    /// Uniform in [0, 1), 24 bits.
    pub fn next_f32(&mut self) -> f32 {
        unit_f32(self.next_u64())
    }

    /// Value `index` (from 0) of the stream seeded with `seed`, without drawing those before it: what the
    /// `index + 1`-th [`next_u64`](Self::next_u64) of `SplitMix64(seed)` returns.
    pub fn nth_u64(seed: u64, index: u64) -> u64 {
        finalise(seed.wrapping_add(GOLDEN.wrapping_mul(index.wrapping_add(1))))
    }

    /// [`nth_u64`](Self::nth_u64) as [`next_f32`](Self::next_f32) makes a float of it.
    pub fn nth_f32(seed: u64, index: u64) -> f32 {
        unit_f32(Self::nth_u64(seed, index))
    }
}

/// Uniform in [0, 1) from the top 24 bits of `x`.
fn unit_f32(x: u64) -> f32 {
    (x >> 40) as f32 / (1u64 << 24) as f32
}

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// The generator's output for state `z + GOLDEN`: spreads nearby inputs (seed and index, chunk 0, 1,
/// 2…) over unrelated values, so a value can be drawn for any position without drawing those before it.
pub fn mix(z: u64) -> u64 {
    finalise(z.wrapping_add(GOLDEN))
}

fn finalise(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference values of SplitMix64 seeded with 1234567 (Vigna's splitmix64.c).
    #[test]
    fn the_published_sequence() {
        let mut g = SplitMix64(1234567);
        let want = [
            6457827717110365317u64,
            3203168211198807973,
            9817491932198370423,
            4593380528125082431,
        ];
        for w in want {
            assert_eq!(g.next_u64(), w);
        }
        assert_eq!(mix(1234567), 6457827717110365317);
    }

    #[test]
    fn any_value_of_a_stream_without_those_before_it() {
        let mut g = SplitMix64(42);
        for i in 0..100 {
            assert_eq!(SplitMix64::nth_u64(42, i), g.next_u64());
        }
        let mut g = SplitMix64(7);
        g.0 = g.0.wrapping_add(GOLDEN.wrapping_mul(3));
        assert_eq!(SplitMix64::nth_f32(7, 3), g.next_f32());
    }
}
