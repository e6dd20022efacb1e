//! Where the protocol's random numbers come from: the OS, or a seeded generator so that a
//! simulated run (connection ids, handshake randoms, ephemeral keys, path tokens) is the same
//! every time, as quinn-proto's `rng_seed`. Never seed a real endpoint: its keys would be
//! predictable.

use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;

/// A source of random bytes.
pub enum Rng {
    /// The operating system's generator (every real session).
    Os,
    /// A reproducible stream for simulations and tests.
    Seeded(Box<ChaCha20Rng>),
}

impl Rng {
    /// The OS generator.
    pub fn os() -> Self {
        Rng::Os
    }

    /// A reproducible generator: the same `seed` gives the same bytes.
    pub fn seeded(seed: u64) -> Self {
        Rng::Seeded(Box::new(ChaCha20Rng::seed_from_u64(seed)))
    }

    /// Fills `buf` with random bytes.
    pub fn fill(&mut self, buf: &mut [u8]) {
        match self {
            Rng::Os => crate::crypto::fill_random(buf),
            Rng::Seeded(r) => r.fill_bytes(buf),
        }
    }

    /// `N` random bytes.
    pub fn array<const N: usize>(&mut self) -> [u8; N] {
        let mut b = [0u8; N];
        self.fill(&mut b);
        b
    }

    /// A fresh generator drawn from this one (seeded from it if this one is seeded), for a
    /// session that needs its own.
    pub fn fork(&mut self) -> Self {
        match self {
            Rng::Os => Rng::Os,
            Rng::Seeded(r) => Rng::seeded(r.next_u64()),
        }
    }
}

impl std::fmt::Debug for Rng {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Rng::Os => "Rng::Os",
            Rng::Seeded(_) => "Rng::Seeded",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_repeats_and_different_seeds_differ() {
        let a: [u8; 16] = Rng::seeded(7).array();
        let b: [u8; 16] = Rng::seeded(7).array();
        let c: [u8; 16] = Rng::seeded(8).array();
        assert_eq!(a, b);
        assert_ne!(a, c);
        let (x, y): ([u8; 16], [u8; 16]) = (Rng::os().array(), Rng::os().array());
        assert_ne!(x, y);
    }
}
