//! Stateless address-validation tokens (QUIC's Retry, RFC 9000 section 8.1). When
//! ClientHellos arrive faster than the endpoint spends key exchanges on, it answers with a
//! HelloRetry carrying a token bound to the sender's address and hello ids; only a hello that
//! comes back with a valid token from that address costs an X25519 exchange. The endpoint
//! keeps no state per token: a MAC under a key it drew at start proves it minted it.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ring::hmac;

use crate::rng::Rng;
use crate::wire::RETRY_TOKEN_LEN;

/// How long a token stays good: enough for a hello's round trip and retransmissions
/// (a client's connect timeout is a few seconds), short enough that a captured token is
/// soon worthless.
pub const TOKEN_TTL: Duration = Duration::from_secs(10);

/// Mints and checks retry tokens.
pub struct RetryTokens {
    key: hmac::Key,
    epoch: Instant,
}

impl RetryTokens {
    /// A fresh token key from `rng`; token times count from `now`.
    pub fn new(rng: &mut Rng, now: Instant) -> Self {
        RetryTokens {
            key: hmac::Key::new(hmac::HMAC_SHA256, &rng.array::<32>()),
            epoch: now,
        }
    }

    fn tag(&self, issued: u32, addr: SocketAddr, cid: u64, random: &[u8; 32]) -> hmac::Tag {
        let ip = match addr.ip() {
            std::net::IpAddr::V4(v4) => v4.to_ipv6_mapped(),
            std::net::IpAddr::V6(v6) => v6,
        };
        let mut m = [0u8; 4 + 16 + 2 + 8 + 32];
        m[..4].copy_from_slice(&issued.to_be_bytes());
        m[4..20].copy_from_slice(&ip.octets());
        m[20..22].copy_from_slice(&addr.port().to_be_bytes());
        m[22..30].copy_from_slice(&cid.to_be_bytes());
        m[30..].copy_from_slice(random);
        hmac::sign(&self.key, &m)
    }

    fn secs(&self, now: Instant) -> u32 {
        u32::try_from(now.saturating_duration_since(self.epoch).as_secs()).unwrap_or(u32::MAX)
    }

    /// A token for a hello with these ids from `addr`.
    pub fn mint(
        &self,
        now: Instant,
        addr: SocketAddr,
        cid: u64,
        random: &[u8; 32],
    ) -> [u8; RETRY_TOKEN_LEN] {
        let issued = self.secs(now);
        let mut t = [0u8; RETRY_TOKEN_LEN];
        t[..4].copy_from_slice(&issued.to_be_bytes());
        t[4..]
            .copy_from_slice(&self.tag(issued, addr, cid, random).as_ref()[..RETRY_TOKEN_LEN - 4]);
        t
    }

    /// Whether `token` was minted by us, for these ids and this address, within
    /// [`TOKEN_TTL`].
    pub fn check(
        &self,
        now: Instant,
        addr: SocketAddr,
        cid: u64,
        random: &[u8; 32],
        token: &[u8; RETRY_TOKEN_LEN],
    ) -> bool {
        let issued = u32::from_be_bytes(token[..4].try_into().expect("4 bytes"));
        let age = self.secs(now).checked_sub(issued);
        if age.is_none_or(|a| u64::from(a) > TOKEN_TTL.as_secs()) {
            return false;
        }
        let want = self.tag(issued, addr, cid, random);
        let diff = want.as_ref()[..RETRY_TOKEN_LEN - 4]
            .iter()
            .zip(&token[4..])
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        diff == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_holds_only_for_its_address_ids_and_time() {
        let t0 = Instant::now();
        let tokens = RetryTokens::new(&mut Rng::seeded(1), t0);
        let a: SocketAddr = "192.0.2.1:4000".parse().unwrap();
        let b: SocketAddr = "192.0.2.1:4001".parse().unwrap();
        let r = [5u8; 32];
        let t = tokens.mint(t0, a, 9, &r);
        assert!(tokens.check(t0 + Duration::from_secs(3), a, 9, &r, &t));
        assert!(!tokens.check(t0, b, 9, &r, &t), "another port");
        assert!(!tokens.check(t0, a, 8, &r, &t), "another cid");
        assert!(!tokens.check(t0, a, 9, &[6; 32], &t), "another random");
        assert!(!tokens.check(t0 + TOKEN_TTL + Duration::from_secs(1), a, 9, &r, &t));
        let mut forged = t;
        forged[31] ^= 1;
        assert!(!tokens.check(t0, a, 9, &r, &forged));
        let other = RetryTokens::new(&mut Rng::seeded(2), t0);
        assert!(!other.check(t0, a, 9, &r, &t), "another endpoint's key");
    }
}
