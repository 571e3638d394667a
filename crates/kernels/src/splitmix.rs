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
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
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
}
