//! A fixed-size bitset with word-level range operations: loss maps cover tens of thousands of
//! blocks per report, so marking and scanning must go 64 blocks at a time.

/// A set of `len` bits, numbered from 0 (a transfer's blocks: set = received or acknowledged).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bitset {
    /// Empty until the first bit is set: a transfer that is queued but not started (a peer
    /// may queue many) costs no memory for its blocks.
    words: Vec<u64>,
    len: u64,
    ones: u64,
}

impl Bitset {
    /// `len` bits, all clear; allocates nothing until a bit is set.
    pub fn new(len: u64) -> Self {
        Bitset {
            words: Vec::new(),
            len,
            ones: 0,
        }
    }

    /// The number of bits (set or not).
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether no bit is set.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of set bits.
    pub fn count_ones(&self) -> u64 {
        self.ones
    }

    /// Whether every bit is set.
    pub fn is_full(&self) -> bool {
        self.ones == self.len
    }

    /// Whether bit `i` is set (false beyond `len`).
    pub fn get(&self, i: u64) -> bool {
        self.word(i / 64) & (1 << (i % 64)) != 0
    }

    /// Word `wi`, zero where nothing is stored yet.
    fn word(&self, wi: u64) -> u64 {
        self.words.get(wi as usize).copied().unwrap_or(0)
    }

    fn words_mut(&mut self) -> &mut [u64] {
        if self.words.is_empty() {
            self.words = vec![0; self.len.div_ceil(64) as usize];
        }
        &mut self.words
    }

    /// Sets bit `i`; returns true if it was clear before.
    pub fn set(&mut self, i: u64) -> bool {
        debug_assert!(i < self.len);
        let w = &mut self.words_mut()[(i / 64) as usize];
        let m = 1u64 << (i % 64);
        if *w & m == 0 {
            *w |= m;
            self.ones += 1;
            true
        } else {
            false
        }
    }

    /// Sets every bit in `[a, b)` (clamped to the length); returns how many were newly set.
    pub fn set_range(&mut self, a: u64, b: u64) -> u64 {
        let b = b.min(self.len);
        if a >= b {
            return 0;
        }
        let mut newly = 0u64;
        let (wa, wb) = ((a / 64) as usize, ((b - 1) / 64) as usize);
        for (wi, w) in self.words_mut()[wa..=wb].iter_mut().enumerate() {
            let wi = wi + wa;
            let lo = if wi == wa { a % 64 } else { 0 };
            let hi = if wi == wb { (b - 1) % 64 + 1 } else { 64 };
            let mask = if hi - lo == 64 {
                u64::MAX
            } else {
                ((1u64 << (hi - lo)) - 1) << lo
            };
            newly += (mask & !*w).count_ones() as u64;
            *w |= mask;
        }
        self.ones += newly;
        newly
    }

    /// First clear bit at or after `from`, or `len` if none.
    pub fn next_zero(&self, from: u64) -> u64 {
        self.scan(from, true)
    }

    /// First set bit at or after `from`, or `len` if none.
    pub fn next_one(&self, from: u64) -> u64 {
        self.scan(from, false)
    }

    /// First clear bit in `[from, to)`, or `to`: never looks past `to`.
    pub fn next_zero_before(&self, from: u64, to: u64) -> u64 {
        self.scan_to(from, to.min(self.len), true)
    }

    /// First set bit in `[from, to)`, or `to`.
    pub fn next_one_before(&self, from: u64, to: u64) -> u64 {
        self.scan_to(from, to.min(self.len), false)
    }

    fn scan(&self, from: u64, zero: bool) -> u64 {
        self.scan_to(from, self.len, zero)
    }

    fn scan_to(&self, from: u64, to: u64, zero: bool) -> u64 {
        if from >= to {
            return to;
        }
        let last_word = (to - 1) / 64;
        let mut wi = from / 64;
        let mut w = if zero { !self.word(wi) } else { self.word(wi) };
        w &= u64::MAX << (from % 64);
        loop {
            if w != 0 {
                return (wi * 64 + w.trailing_zeros() as u64).min(to);
            }
            wi += 1;
            if wi > last_word {
                return to;
            }
            w = if zero { !self.word(wi) } else { self.word(wi) };
        }
    }

    /// The maximal runs of set bits, as `[a, b)` ranges.
    pub fn ones_ranges(&self) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut i = self.next_one(0);
        while i < self.len {
            let j = self.next_zero(i);
            out.push((i, j));
            i = self.next_one(j);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_and_scans_match_a_naive_model() {
        let mut seed = 0x9e3779b97f4a7c15u64;
        let mut rnd = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for len in [0u64, 1, 63, 64, 65, 200, 1000] {
            let mut bs = Bitset::new(len);
            let mut model = vec![false; len as usize];
            for _ in 0..200 {
                if len == 0 {
                    break;
                }
                let a = rnd() % len;
                let b = a + rnd() % (len - a + 1);
                let newly = bs.set_range(a, b);
                let mut m = 0;
                for x in &mut model[a as usize..b as usize] {
                    if !*x {
                        m += 1;
                    }
                    *x = true;
                }
                assert_eq!(newly, m);
                assert_eq!(bs.count_ones(), model.iter().filter(|x| **x).count() as u64);
                let from = rnd() % (len + 1);
                let nz = (from..len).find(|&i| !model[i as usize]).unwrap_or(len);
                let no = (from..len).find(|&i| model[i as usize]).unwrap_or(len);
                assert_eq!(bs.next_zero(from), nz);
                assert_eq!(bs.next_one(from), no);
                let to = from + rnd() % (len - from + 1);
                assert_eq!(bs.next_zero_before(from, to), nz.min(to));
                assert_eq!(bs.next_one_before(from, to), no.min(to));
            }
        }
    }

    #[test]
    fn single_set_reports_novelty() {
        let mut bs = Bitset::new(10);
        assert!(bs.set(3));
        assert!(!bs.set(3));
        assert!(bs.get(3));
        assert!(!bs.get(4));
        assert!(!bs.get(100));
        assert_eq!(bs.ones_ranges(), vec![(3, 4)]);
    }

    #[test]
    fn nothing_is_allocated_until_a_bit_is_set() {
        let mut bs = Bitset::new(1 << 40);
        assert!(bs.words.is_empty());
        assert_eq!(bs.next_zero(5), 5);
        assert_eq!(bs.next_one(5), 1 << 40);
        assert!(!bs.get(7));
        assert!(bs.words.is_empty());
        let mut small = Bitset::new(130);
        assert_eq!(small.set_range(60, 70), 10);
        assert_eq!(small.words.len(), 3);
        assert_eq!(small.next_zero(60), 70);
        bs = small;
        assert!(bs.get(65));
    }
}
