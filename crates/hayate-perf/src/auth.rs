//! Key files and the challenge-response that gates every test on a keyed server (and every
//! reverse test anywhere): the server never sends data to a peer that has not proved the key.

use anyhow::{Context, Result};
use hayate_proto::crypto::Psk;
use ring::{hmac, rand::SecureRandom};
use std::path::Path;

pub const PROOF_LABEL: &[u8] = b"hayate perf v1";

/// A 256-bit pre-shared key.
#[derive(Clone)]
pub struct Key([u8; 32]);

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(..)") // never print key material
    }
}

impl Key {
    #[cfg(test)]
    pub fn from_bytes(b: [u8; 32]) -> Self {
        Key(b)
    }

    /// Reads a key file with the core's parser (`hayate-key-v1 <64 hex>` after optional `#`
    /// comment lines); warns when others may read it.
    pub fn load(path: &Path) -> Result<Self> {
        let kf = hayate_io::keyfile::read_key_file(path)?;
        if kf.too_open {
            eprintln!(
                "warning: key file {} has mode {:o}: others may read it (chmod 600)",
                path.display(),
                kf.mode
            );
        }
        Self::parse(&kf.contents).with_context(|| format!("key file {}", path.display()))
    }

    pub fn parse(text: &str) -> Result<Self> {
        let psk = Psk::parse_key_file(text)?;
        Ok(Key(*psk.as_bytes()))
    }

    /// The same key as hayate's transport takes it (`--hayate` tests).
    pub fn psk(&self) -> Psk {
        Psk::from_bytes(self.0)
    }

    /// HMAC-SHA256(key, "hayate perf v1" || challenge || nonce).
    pub fn proof(&self, challenge: &[u8], nonce: &[u8]) -> Vec<u8> {
        let k = hmac::Key::new(hmac::HMAC_SHA256, &self.0);
        let mut ctx = hmac::Context::with_key(&k);
        ctx.update(PROOF_LABEL);
        ctx.update(challenge);
        ctx.update(nonce);
        ctx.sign().as_ref().to_vec()
    }

    /// Constant-time check of a peer's proof (ring's verify compares in constant time).
    pub fn verify(&self, challenge: &[u8], nonce: &[u8], proof: &[u8]) -> bool {
        let k = hmac::Key::new(hmac::HMAC_SHA256, &self.0);
        let mut msg = Vec::with_capacity(PROOF_LABEL.len() + challenge.len() + nonce.len());
        msg.extend_from_slice(PROOF_LABEL);
        msg.extend_from_slice(challenge);
        msg.extend_from_slice(nonce);
        hmac::verify(&k, &msg, proof).is_ok()
    }
}

/// Equality of secrets without an early exit on the first differing byte.
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

pub fn random_bytes<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    ring::rand::SystemRandom::new()
        .fill(&mut b)
        .expect("system random source failed");
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: &str = "# made by hayate keygen\n\nhayate-key-v1 000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\n";

    #[test]
    fn parse_ok() {
        let k = Key::parse(K).unwrap();
        assert_eq!(k.0[31], 0x1f);
    }

    #[test]
    fn parse_rejects() {
        assert!(Key::parse("").is_err());
        assert!(Key::parse("# only comment\n").is_err());
        assert!(Key::parse("hayate-key-v2 00").is_err());
        assert!(Key::parse("hayate-key-v1 0011").is_err());
        assert!(Key::parse(&format!("{} extra", K.trim())).is_err());
        let bad_hex = "hayate-key-v1 ".to_string() + &"zz".repeat(32);
        assert!(Key::parse(&bad_hex).is_err());
    }

    #[test]
    fn proof_roundtrip() {
        let k = Key::parse(K).unwrap();
        let other = Key::from_bytes([7; 32]);
        let ch = [1u8; 32];
        let n = [2u8; 32];
        let p = k.proof(&ch, &n);
        assert!(k.verify(&ch, &n, &p));
        assert!(!other.verify(&ch, &n, &p));
        assert!(!k.verify(&[3u8; 32], &n, &p));
        assert!(!k.verify(&ch, &[3u8; 32], &p));
        assert!(!k.verify(&ch, &n, &p[..31]));
        // Known answer: label || challenge || nonce, checked against ring's one-shot sign.
        let rk = hmac::Key::new(hmac::HMAC_SHA256, &k.0);
        let mut msg = b"hayate perf v1".to_vec();
        msg.extend_from_slice(&ch);
        msg.extend_from_slice(&n);
        assert_eq!(hmac::sign(&rk, &msg).as_ref(), &p[..]);
    }
}
