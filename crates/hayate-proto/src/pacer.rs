//! Pacing: a token bucket that releases datagrams in small bursts (a "quantum") so the I/O
//! shell can hand them to the kernel in one batched call instead of waking per packet.

#[derive(Debug, Clone)]
pub struct Pacer {
    tokens: f64,
    last_us: u64,
    /// bytes per second; `None` = unpaced
    rate: Option<u64>,
    mtu: usize,
}

impl Pacer {
    pub fn new(mtu: usize) -> Self {
        Pacer {
            tokens: 0.0,
            last_us: 0,
            rate: None,
            mtu,
        }
    }

    pub fn set_rate(&mut self, rate: Option<u64>) {
        self.rate = rate.map(|r| r.max(1));
    }

    pub fn rate(&self) -> Option<u64> {
        self.rate
    }

    /// Burst size: ~250 µs of sending, between 2 and 64 datagrams. Small enough that a
    /// 1-BDP bottleneck queue does not overflow from bursts; big enough for GSO batching.
    fn quantum(&self) -> f64 {
        let r = self.rate.unwrap_or(u64::MAX) as f64;
        (r * 250e-6).clamp(2.0 * self.mtu as f64, 64.0 * self.mtu as f64)
    }

    /// Credit kept across a late wake-up: up to 1 ms of sending. A loaded host often wakes
    /// the sender a few hundred µs late; dropping that credit (as a cap of one quantum would)
    /// makes the real rate fall short of the set one, and the controller then reads its own
    /// shortfall as the path's limit.
    fn credit_cap(&self) -> f64 {
        let r = self.rate.unwrap_or(u64::MAX) as f64;
        (r * 1e-3).max(self.quantum())
    }

    fn refill(&mut self, now_us: u64) {
        if let Some(r) = self.rate {
            let dt = now_us.saturating_sub(self.last_us) as f64 * 1e-6;
            self.tokens = (self.tokens + dt * r as f64).min(self.credit_cap());
        }
        self.last_us = now_us;
    }

    /// May a datagram of `len` bytes go now?
    pub fn can_send(&mut self, now_us: u64, len: usize) -> bool {
        if self.rate.is_none() {
            return true;
        }
        self.refill(now_us);
        self.tokens >= len.min(self.mtu) as f64
    }

    pub fn on_sent(&mut self, len: usize) {
        if self.rate.is_some() {
            self.tokens -= len as f64;
        }
    }

    /// When the next burst may start, if sending is being held back.
    pub fn next_send_time(&self, now_us: u64) -> Option<u64> {
        let r = self.rate? as f64;
        let need = self.quantum().min(self.mtu as f64 * 8.0) - self.tokens;
        if need <= 0.0 {
            return Some(now_us);
        }
        Some(now_us + (need / r * 1e6).ceil() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_the_rate_over_time() {
        let mut p = Pacer::new(1500);
        p.set_rate(Some(12_500_000)); // 100 Mbit/s
        let (mut now, mut sent) = (0u64, 0usize);
        while now < 1_000_000 {
            while p.can_send(now, 1500) {
                p.on_sent(1500);
                sent += 1500;
            }
            now = p.next_send_time(now).unwrap().max(now + 1);
        }
        let err = (sent as f64 - 12_500_000.0).abs() / 12_500_000.0;
        assert!(err < 0.02, "sent {sent}");
    }

    #[test]
    fn a_late_wake_up_is_made_up_for() {
        // 100 Mbit/s, but the sender only gets to run every 500 µs (a quantum is 250 µs).
        let mut p = Pacer::new(1500);
        p.set_rate(Some(12_500_000));
        let (mut now, mut sent) = (0u64, 0usize);
        while now < 1_000_000 {
            while p.can_send(now, 1500) {
                p.on_sent(1500);
                sent += 1500;
            }
            now += 500;
        }
        let err = (sent as f64 - 12_500_000.0).abs() / 12_500_000.0;
        assert!(err < 0.02, "sent {sent}");
    }

    #[test]
    fn unpaced_always_sends() {
        let mut p = Pacer::new(1500);
        assert!(p.can_send(0, 1500));
        assert_eq!(p.next_send_time(0), None);
    }
}
