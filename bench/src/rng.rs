//! A seeded SplitMix64: the runs draw pod sizes reproducibly from `--seed`
//! without a dependency for a dozen lines.

/// SplitMix64 (Steele, Lea and Flood), good enough to draw pod sizes.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `low..=high`.
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.next_u64() % (high - low + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_stay_in_range_and_repeat_with_the_seed() {
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        for _ in 0..10_000 {
            let x = a.between(1, 20);
            assert!((1..=20).contains(&x));
            assert_eq!(x, b.between(1, 20));
        }
        let mut c = Rng::new(8);
        let differs = (0..100).any(|_| Rng::new(7).next_u64() != c.next_u64());
        assert!(differs);
    }
}
