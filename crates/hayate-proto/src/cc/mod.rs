//! Rate control: decides how fast the sender paces. The connection feeds it every feedback
//! signal the receiver reports; implementations pick a pacing rate from them.

mod adaptive;
mod fixed;

pub use adaptive::{
    Ablation, Adaptive, Mode as AdaptiveMode, Params as AdaptiveParams, Policy, ResumePhase,
    Rule as AdaptiveRule,
};
pub use fixed::Fixed;

/// What one ACK (with its loss maps) told the sender.
#[derive(Debug, Clone, Default)]
pub struct Feedback {
    /// Sender's clock, µs.
    pub now_us: u64,
    /// RTT measured on this ACK, if it acknowledged a newer packet than before.
    pub rtt_us: Option<u64>,
    /// When the packet `rtt_us` was measured on was sent, sender's clock, µs (0 without an
    /// RTT sample). Not `now_us` less the RTT: a sender its host woke late reads the ACKs
    /// that came in meanwhile all at once, each later than it arrived.
    pub rtt_sent_us: u64,
    /// The receiver's delay between the arrival of the newest datagram it acknowledges and
    /// the ACK (its backlog plus deliberate ACK delay), µs; not part of `rtt_us`.
    pub rx_lag_us: u64,
    /// What this ACK waited behind on the way back, µs, if it dates a data packet's
    /// arrival: the RTT less that packet's one-way delay, over the least of that in the RTT's
    /// window (the two hosts' clocks differ by a constant, which the difference takes out).
    /// Part of `rtt_us`, and not a queue the sender's pace makes.
    pub back_queue_us: Option<u64>,
    /// Smoothed RTT so far, µs.
    pub srtt_us: u64,
    /// Minimum RTT in the estimator's window, µs.
    pub min_rtt_us: u64,
    /// Receive rate measured by the receiver between this ACK and the previous one, bytes/s.
    pub rx_rate: Option<u64>,
    /// The receiver's time between those two ACKs, µs (weighs `rx_rate` in means).
    pub rx_interval_us: u64,
    /// Data bytes newly delivered since the previous ACK.
    pub delivered: u64,
    /// Blocks newly declared lost by this feedback.
    pub lost_blocks: u64,
    /// Their bytes.
    pub lost_bytes: u64,
    /// Of the bytes delivered, those the pacer sent catching up after its host held it
    /// (faster than the rate: their losses are the sender's bursts, not the path's).
    pub catch_up_delivered: u64,
    /// Of the bytes lost, those sent catching up.
    pub catch_up_lost_bytes: u64,
    /// Bytes waiting in the receiver's socket buffer, as its kernel counts them (overhead
    /// included).
    pub rx_buffered: u64,
    /// That buffer's size, counted the same way; 0: unknown.
    pub rx_buffer: u64,
    /// Sending time (bytes at the pacing rate) the sender's host took from it while it sent
    /// the packets this ACK newly covers: their delivery rate is the sender's, not the path's.
    pub send_stall_bytes: u64,
    /// The same of sending time the sender had nothing to send or no room in flight for (an
    /// app- or window-limited sender): what arrives after such a gap says nothing of the
    /// path's rate either.
    pub send_idle_bytes: u64,
    /// Of `send_idle_bytes`, the time the sender had nothing at all to send (its
    /// application was slower than the rate, as an ssh session through a tunnel is between
    /// commands): such deliveries are application-limited, a floor under the path's rate.
    pub send_app_idle_bytes: u64,
    /// Datagrams the receiver's OS dropped since the previous ACK.
    pub rx_drops: u64,
    /// Data bytes sent but not yet known delivered or lost.
    pub in_flight: u64,
}

/// A path as an earlier session to the same peer measured it, given to a new session's
/// controller so it can start near that rate (careful resume, RFC 9959; see the adaptive
/// controller's module doc). The I/O shell keeps these (the core never touches a file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RememberedPath {
    /// The bottleneck rate the earlier session found, bytes/s.
    pub rate: u64,
    /// Its minimum RTT, µs.
    pub min_rtt_us: u64,
    /// How long ago it was measured, µs.
    pub age_us: u64,
}

/// What a controller measured of the path, for the I/O shell to remember (see
/// [`RateControl::measured`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathMeasurement {
    /// The bottleneck rate found, bytes/s.
    pub rate: u64,
    /// The minimum RTT, µs.
    pub min_rtt_us: u64,
}

/// A rate controller: told what is sent and what the receiver's feedback said, it sets the
/// pacing rate and, optionally, a cap on data in flight.
pub trait RateControl: Send + std::fmt::Debug {
    /// Pacing rate in bytes per second; `None` = send as fast as the host allows.
    fn pacing_rate(&self) -> Option<u64>;
    /// The same while `in_flight` data bytes are unacknowledged: a controller may hold back
    /// when its feedback is overdue. Asked after every feedback and every datagram sent.
    fn pacing_rate_with(&self, _in_flight: u64) -> Option<u64> {
        self.pacing_rate()
    }
    /// `bytes` (a whole datagram) went out at `now_us`.
    fn on_sent(&mut self, _now_us: u64, _bytes: u64) {}
    /// An ACK (and the loss maps with it) arrived.
    fn on_feedback(&mut self, _fb: &Feedback) {}
    /// Most data bytes that may be in flight (sent, not yet acknowledged or lost).
    fn in_flight_cap(&self) -> Option<u64> {
        None
    }
    /// Short name for stats lines.
    fn name(&self) -> &'static str;
    /// The pacer makes up sending time its host took away (see `Pacer::set_make_up`; asked
    /// after each feedback):
    /// where the rate is a promise to keep on average, or a share held beside a flow that
    /// keeps the buffer full and takes whatever is left unsent. Not by default: made up,
    /// that time goes into a link other flows share, as a queue they yield to.
    fn makes_up_stalls(&self) -> bool {
        false
    }
    /// Before the session sends anything: the path as an earlier session measured it. A
    /// controller may start from it (once the path confirms it) or ignore it.
    fn remember(&mut self, _path: RememberedPath) {}
    /// The handshake took `rtt_us` (the client's hello to the server's answer, timed from
    /// the hello's first sending), at `now_us`, before any data: a controller holding a
    /// remembered path may take it as the first RTT sample that confirms the path.
    fn on_handshake_rtt(&mut self, _now_us: u64, _rtt_us: u64) {}
    /// What this session measured of the path, when that is worth remembering: the rate was
    /// found (not only searched for), and not held down by a rate cap or an application
    /// slower than the path. `None` otherwise.
    fn measured(&self) -> Option<PathMeasurement> {
        None
    }
}

/// How the user configured the rate: bits per second in the CLI, bytes per second here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateConfig {
    /// Fixed pacing rate, bytes/s.
    Fixed(u64),
    /// No pacing at all.
    Unlimited,
    /// Find the rate by itself, within `[min, max]` bytes/s (`max` None = no cap).
    Adaptive {
        /// Highest rate, bytes/s; `None`: no cap.
        max: Option<u64>,
        /// Lowest rate, bytes/s.
        min: u64,
        /// How it shares a bottleneck with traffic that keeps a queue standing.
        policy: Policy,
    },
}

impl RateConfig {
    /// Found by itself, no cap, no floor, a fair share (what `hayate cp` does without
    /// `--rate`, `--rate-min`, `--fixed` or `--policy`).
    pub const ADAPTIVE: RateConfig = RateConfig::Adaptive {
        max: None,
        min: 0,
        policy: Policy::Fair,
    };

    /// As sent in `Ctrl::Params`: (rate_max, rate_min, adaptive, policy), 0 = no limit.
    pub fn to_params(self) -> (u64, u64, bool, Policy) {
        match self {
            RateConfig::Fixed(r) => (r, 0, false, Policy::Fair),
            RateConfig::Unlimited => (0, 0, false, Policy::Fair),
            RateConfig::Adaptive { max, min, policy } => (max.unwrap_or(0), min, true, policy),
        }
    }

    /// The client's wish, bounded by what this side allows (`self`): the lower cap wins,
    /// the client's floor is kept below it.
    pub fn negotiate(
        self,
        rate_max: u64,
        rate_min: u64,
        adaptive: bool,
        policy: Policy,
    ) -> RateConfig {
        let my_cap = match self {
            RateConfig::Fixed(r) => Some(r),
            RateConfig::Adaptive { max, .. } => max,
            RateConfig::Unlimited => None,
        };
        let wish_cap = (rate_max > 0).then_some(rate_max);
        let cap = match (my_cap, wish_cap) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if adaptive {
            let min = cap.map_or(rate_min, |c| rate_min.min(c));
            RateConfig::Adaptive {
                max: cap,
                min,
                policy,
            }
        } else {
            match cap {
                Some(c) => RateConfig::Fixed(c),
                None => RateConfig::Unlimited,
            }
        }
    }

    /// The controller this configuration asks for.
    pub fn build(self) -> Box<dyn RateControl> {
        match self {
            RateConfig::Fixed(r) => Box::new(Fixed::new(Some(r))),
            RateConfig::Unlimited => Box::new(Fixed::new(None)),
            RateConfig::Adaptive { max, min, policy } => Box::new(Adaptive::with_params(
                max,
                min,
                AdaptiveParams {
                    policy,
                    ..AdaptiveParams::default()
                },
            )),
        }
    }
}
