//! Small, seeded, portable random numbers (SplitMix64). Identical streams on every target.

/// SplitMix64 generator: tiny state, good statistical quality, bit-identical everywhere.
#[derive(Clone, Debug)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator seeded with `seed`.
    pub const fn new(seed: u64) -> Self {
        Self { state: seed }
    }
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.state)
    }
    /// Uniform in `[0, 1)` with 24 bits of precision.
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * (1.0 / (1u64 << 24) as f32)
    }
    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * self.next_f32()
    }
    /// Uniform integer in `[0, n)` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        // Lemire's multiply-shift; the tiny bias is irrelevant for shuffling data.
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
}

/// Stateless hash of a counter: `hash(seed, i)` gives the i-th random word of stream `seed`. Used where a
/// value must be regenerated later instead of stored (dropout masks).
pub fn hash2(seed: u64, i: u64) -> u64 {
    mix(seed ^ mix(i.wrapping_add(0x9E37_79B9_7F4A_7C15)))
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
