//! On/off cross traffic: short TCP CUBIC flows (slow start, mostly) arriving at random
//! (Poisson: exponential gaps between starts) with sizes drawn from a distribution, each
//! ending once its bytes are delivered, so the link carries a given mean load on top of
//! whatever else runs (web pages, RPCs, small file fetches). The draws come from their own
//! random stream: adding the generator changes no other random choice of a scenario.

use super::Rng;

/// How big each short flow is, data bytes.
#[derive(Debug, Clone, Copy)]
pub enum FlowSize {
    /// Every flow the same size.
    Fixed(u64),
    /// Pareto (heavy-tailed: many small flows, a few big ones) with this mean and shape
    /// (`> 1`; 1.2-1.5 is typical of web traffic, larger is tamer).
    Pareto {
        /// Mean size, data bytes.
        mean: u64,
        /// The tail's index α: P(size > x) ∝ x^-α.
        shape: f64,
    },
}

impl FlowSize {
    /// The mean size, data bytes.
    pub fn mean(&self) -> u64 {
        match *self {
            FlowSize::Fixed(n) => n,
            FlowSize::Pareto { mean, .. } => mean,
        }
    }

    fn draw(&self, rng: &mut Rng) -> u64 {
        match *self {
            FlowSize::Fixed(n) => n,
            FlowSize::Pareto { mean, shape } => {
                let scale = mean as f64 * (shape - 1.0) / shape;
                (scale * unit(rng).powf(-1.0 / shape)).round() as u64
            }
        }
    }
}

/// A generator of short flows through the forward link.
#[derive(Debug, Clone)]
pub struct ShortFlows {
    /// The mean load they offer, data bytes/s (e.g. 30 % of the link: `0.3 × rate × 1448 /
    /// 1500`): flows start at `load / size.mean()` per second on average.
    pub load: u64,
    /// Each flow's size.
    pub size: FlowSize,
    /// No flow starts before this, µs of virtual time.
    pub start_us: u64,
    /// Nor after this (the ones running finish).
    pub stop_us: u64,
}

/// A uniform draw in (0, 1].
fn unit(rng: &mut Rng) -> f64 {
    ((rng.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
}

/// The generator's state: when the next flow starts, and what the flows did.
#[derive(Debug)]
pub(super) struct Generator {
    pub spec: ShortFlows,
    rng: Rng,
    /// When the next flow starts, µs.
    pub next_us: u64,
    pub started: u64,
    pub finished: u64,
    /// Data bytes the flows that started asked to send.
    pub offered: u64,
    /// Data bytes that reached the receivers per 100 ms.
    pub rx_trace: Vec<u64>,
}

impl Generator {
    pub fn new(spec: ShortFlows, rng: Rng) -> Self {
        let mut g = Generator {
            next_us: spec.start_us,
            spec,
            rng,
            started: 0,
            finished: 0,
            offered: 0,
            rx_trace: Vec::new(),
        };
        g.next_us = g.spec.start_us + g.gap();
        g
    }

    /// µs until the next start: exponential with the mean that gives `load`.
    fn gap(&mut self) -> u64 {
        let mean_us = self.spec.size.mean() as f64 * 1e6 / self.spec.load.max(1) as f64;
        (-unit(&mut self.rng).ln() * mean_us).round() as u64
    }

    /// When the next flow starts, if one will.
    pub fn next_start(&self) -> Option<u64> {
        (self.next_us < self.spec.stop_us).then_some(self.next_us)
    }

    /// The sizes (data bytes) of the flows that start by `now`.
    pub fn poll_start(&mut self, now: u64) -> Vec<u64> {
        let mut out = Vec::new();
        while self.next_start().is_some_and(|t| t <= now) {
            let size = self.spec.size.draw(&mut self.rng).max(1);
            self.started += 1;
            self.offered += size;
            out.push(size);
            self.next_us += self.gap();
        }
        out
    }

    pub fn on_delivered(&mut self, now: u64, bytes: u64) {
        let bucket = (now / 100_000) as usize;
        if self.rx_trace.len() <= bucket {
            self.rx_trace.resize(bucket + 1, 0);
        }
        self.rx_trace[bucket] += bytes;
    }
}
