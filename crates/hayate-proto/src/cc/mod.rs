//! Rate control: decides how fast the sender paces. The connection feeds it every feedback
//! signal the receiver reports; implementations pick a pacing rate from them.

mod fixed;

pub use fixed::Fixed;

/// What one ACK (with its loss maps) told the sender.
#[derive(Debug, Clone, Default)]
pub struct Feedback {
    /// Sender's clock, µs.
    pub now_us: u64,
    /// RTT measured on this ACK, if it acknowledged a newer packet than before.
    pub rtt_us: Option<u64>,
    /// Smoothed and minimum RTT so far.
    pub srtt_us: u64,
    pub min_rtt_us: u64,
    /// Receive rate measured by the receiver between this ACK and the previous one, bytes/s.
    pub rx_rate: Option<u64>,
    /// Data bytes newly delivered since the previous ACK.
    pub delivered: u64,
    /// Blocks newly declared lost by this feedback, and their bytes.
    pub lost_blocks: u64,
    pub lost_bytes: u64,
    /// Receiver's backlog (received, not yet written) in bytes.
    pub rx_queue: u64,
    /// Datagrams the receiver's OS dropped since the previous ACK.
    pub rx_drops: u64,
    /// Data bytes sent but not yet known delivered or lost.
    pub in_flight: u64,
}

pub trait RateControl: Send + std::fmt::Debug {
    /// Pacing rate in bytes per second; `None` = send as fast as the host allows.
    fn pacing_rate(&self) -> Option<u64>;
    fn on_sent(&mut self, _now_us: u64, _bytes: u64) {}
    fn on_feedback(&mut self, _fb: &Feedback) {}
    /// Short name for stats lines.
    fn name(&self) -> &'static str;
}

/// How the user configured the rate: bits per second in the CLI, bytes per second here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateConfig {
    /// Fixed pacing rate, bytes/s.
    Fixed(u64),
    /// No pacing at all.
    Unlimited,
}

impl RateConfig {
    /// As sent in `Ctrl::Params`: (rate_max, rate_min, adaptive), 0 = no limit.
    pub fn to_params(self) -> (u64, u64, bool) {
        match self {
            RateConfig::Fixed(r) => (r, 0, false),
            RateConfig::Unlimited => (0, 0, false),
        }
    }

    /// The client's wish, bounded by what this side allows (`self`).
    pub fn negotiate(self, rate_max: u64, _rate_min: u64, _adaptive: bool) -> RateConfig {
        let wish = if rate_max == 0 {
            RateConfig::Unlimited
        } else {
            RateConfig::Fixed(rate_max)
        };
        match (self, wish) {
            (RateConfig::Fixed(a), RateConfig::Fixed(b)) => RateConfig::Fixed(a.min(b)),
            (RateConfig::Fixed(a), RateConfig::Unlimited) => RateConfig::Fixed(a),
            (RateConfig::Unlimited, w) => w,
        }
    }

    pub fn build(self) -> Box<dyn RateControl> {
        match self {
            RateConfig::Fixed(r) => Box::new(Fixed::new(Some(r))),
            RateConfig::Unlimited => Box::new(Fixed::new(None)),
        }
    }
}
