//! The controller's tunables.

/// Pacing gain while searching for the bottleneck: the rate doubles per round trip, so the
/// round that finds the limit overfills the queue by at most one BDP.
pub(super) const STARTUP_GAIN: f64 = 2.0;
pub(super) const DRAIN_GAIN: f64 = 0.75;
/// Startup's in-flight cap, in BDPs of what gets delivered: past the bottleneck it bounds the
/// queue the search leaves to half a BDP (1.75 lost 3.5 % on a 0.1-BDP buffer, 2 overflowed a
/// 1-BDP one). Doubling the rate every round trip takes about 1.44 of them when the rate
/// rises smoothly with the deliveries (see `RecentRate`), more when it steps once a round:
/// that held the ramp to 1.5 times per round trip.
pub(super) const STARTUP_IN_FLIGHT_BDPS: f64 = 1.5;
/// Startup holds what it has in flight once its own queue begins: this much over the last
/// round's least, on this many RTT samples in a row (see `hold_at_queue`), and from this
/// many rounds in (a newcomer's first rounds read flat while it only sends its first guess).
pub(super) const STARTUP_HOLD_QUEUE_US: u64 = 500;
pub(super) const STARTUP_HOLD_SAMPLES: u32 = 2;
pub(super) const STARTUP_HOLD_ROUNDS: u32 = 3;
/// ... and no less than this share of what the path carries over the base RTT meanwhile.
pub(super) const HOLD_CARRIED: f64 = 0.9;
/// Leaving a queue behind: at most this many rounds.
pub(super) const MAX_DRAIN_ROUNDS: u32 = 3;
/// Pacing gain (of the share just found) while a queue found by growing drains: one minus
/// the queueing delay over the path's minimum RTT, within these bounds.
pub(super) const MIN_QUEUE_DRAIN_GAIN: f64 = 0.7;
pub(super) const MAX_QUEUE_DRAIN_GAIN: f64 = 0.95;
/// ... over at least this long, µs. The drain ends when an RTT sample shows the queue gone,
/// about a round trip after it went: meanwhile the link runs under-filled by the drain's
/// depth. On a short path the queue at which growing stops (3 ms) is a third of a 10 ms
/// round trip, so draining it in one round trip paces 30 % under the link for that last
/// round trip: 10 ms paths lost 4-8 points of the link on the harness. Draining over 30 ms
/// there costs a third as much (the simulator: +0.8 to +2 points at 10 ms, two-flow Jain at
/// 10-20 ms over 12 start offsets 0.924 -> 0.945 on average); a longer drain than a round trip
/// on long paths kept them fuller too but lowered their two-flow fairness.
pub(super) const MIN_DRAIN_SPAN_US: u64 = 30_000;
/// A queue under this share of the queue target is (nearly) gone: a drain stops as soon as an
/// RTT sample shows one, and delivery samples count as a share only over it.
/// Not 0: the sample is half a round trip old, the drain went on meanwhile.
/// Not higher: a queue left standing inflates the minimum RTT a newcomer measures, and it
/// takes more than its share (at 1.0 two flows on a 50 ms path got Jain 0.959).
pub(super) const DRAIN_FLOOR: f64 = 0.5;
/// The grow phase's first increment: one datagram per round trip, bytes.
pub(super) const GROW_STEP: f64 = 1500.0;
/// The increment is at most this share of the estimate (past it, growth is startup's job).
pub(super) const MAX_GROW: f64 = 0.25;
/// Growing stops when the queue exceeds this many times the queue target, on this many RTT
/// samples in a row.
pub(super) const GROW_QUEUE: f64 = 1.5;
pub(super) const GROW_QUEUE_SAMPLES: u32 = 3;
/// On a buffer short of this many queue targets the target is this share of it (growing
/// then stops at half of it, a round trip before it overflows: see `advance_growth`), but
/// at least `MIN_SHALLOW_TARGET_US`: a real host's ACK timing wobbles by a few hundred µs,
/// and at 300 a 1 ms buffer on the harness's 10 ms path held 89 % of the link where 450
/// held 91-92 % (retransmitting 1.6-2.0 %, 2.7-5.3 % without a learnt buffer).
pub(super) const SHALLOW_TARGETS: u64 = 3;
pub(super) const MIN_SHALLOW_TARGET_US: u64 = 450;
/// A buffer found short is taken for longer when a longer queue stands, and forgotten this
/// long after it overflowed, µs: growing then finds it again by overflowing it, which on a
/// 1 Gbit/s, 100 ms path with 10 ms of buffer lost 1-3 MB each time (at 5 s, the simulator
/// with host stalls retransmitted 0.05-0.07 points more of a 1 GiB file).
pub(super) const SHALLOW_MEMORY_US: u64 = 20_000_000;
/// ... and for at least this fraction of the path's minimum RTT (see `grow_queue_persist_us`).
pub(super) const GROW_QUEUE_PERSIST_RTT_DIV: u64 = 4;
/// Growing stops, too, when this much more is sent than gets through without any queue
/// building (a policer, or a receiver that drops silently).
pub(super) const GROW_UNDELIVERED: f64 = 1.1;
/// The estimate after a queue was found: this much of the share found. The room left is
/// what every flow then regains by the same increments: the AIMD that evens shares out (at
/// 1.0 it works too, but far more slowly). A lone flow pays for it until the increments make
/// it up: 0.97 kept a simulated 1 Gbit/s, 100 ms path at 98.1 %, 0.985 at 98.9 %, 0.99 at
/// 99.3 %, 0.995 at 99.5 %. Two flows (5 paths × 6 start offsets in the simulator) ended as
/// even at 0.99 as at 0.985 (mean Jain 0.963 vs 0.940), less so behind stalling senders at
/// 0.995 (0.82 vs 0.93). Shares that are far apart yield `CONVERGE_GAIN` instead, so evening
/// out stays quick.
pub(super) const SHARE_GAIN: f64 = 0.99;
/// A share this much under or over a recent one: the flow yields `CONVERGE_GAIN`.
pub(super) const SHARE_MOVING: f64 = 0.9;
pub(super) const CONVERGE_GAIN: f64 = 0.95;
/// Shares remembered for that, one per drain.
pub(super) const SHARE_HISTORY: usize = 4;
/// Shares are moving when this many remembered ones are that far from the new one.
pub(super) const SHARES_APART: usize = 2;
/// A queue over this fraction of the path's minimum RTT, and over `BIG_QUEUE_TARGETS` queue
/// targets (on a short path the target's floor is a fifth of the RTT, and growing stops only
/// past 1.5 of it: a third of the RTT there is an ordinary probe, and yielding 0.7 to it
/// kept a 10 ms path at 81 %): every flow yields `BIG_QUEUE_GAIN`.
pub(super) const BIG_QUEUE: f64 = 1.0 / 3.0;
pub(super) const BIG_QUEUE_TARGETS: f64 = 4.0;
pub(super) const BIG_QUEUE_GAIN: f64 = 0.7;
/// Another flow's overflow of a short buffer is answered once per this many minimum RTTs
/// (a search overflows it for a round or two).
pub(super) const FOREIGN_OVERFLOW_RTTS: u64 = 4;
/// Rounds over which the maximum delivery rate is remembered.
pub(super) const BW_WINDOW: usize = 10;
/// Starting guess: 32 Mbit/s, a rate most paths carry for one round trip.
pub(super) const INITIAL_RATE: u64 = 4_000_000;
pub(super) const MIN_RATE: u64 = 50_000;
/// The receiver's lag (its backlog: how long the newest datagram it acknowledges waited
/// for it) up to this counts as ordinary (ACKs are delayed up to 5 ms by design); past it,
/// as a queue the sender keeps filling. When the receiver does not say how full its socket
/// buffer is.
pub(super) const RX_LAG_ALLOWANCE_US: u64 = 5_000;
/// When it does: only the backlog over this share of its buffer counts. A busy host's
/// receiver falls tens of ms behind and catches up (on the harness at 1 Gbit/s, a third of
/// all ACKs waited over 20 ms in a 128 MiB buffer); draining that as a queue kept a 100 ms
/// path at 82-89 % of the link, where a sender at a fixed pace got 95 %. A receiver slower
/// than the link fills its buffer past this, and is followed as before.
/// Linux's count runs ahead while a backlog is read: it releases what a UDP reader took only
/// a quarter of the buffer at a time (`udp_rmem_release`), so a quarter can be all read.
pub(super) const RX_BUFFER_CALM: f64 = 0.25;
/// The share when the buffer holds all the congestion cap lets into flight (the receiver's
/// backlog is part of what is in flight, so it cannot overflow): on the harness a receiver
/// its host held back for 200 ms came back to 40 MB counted in 134 MB, and the yield that
/// followed took 0.3 of the pace for 50 ms and more on a 10 ms path.
pub(super) const RX_BUFFER_CALM_ROOMY: f64 = 0.5;
/// What a receiver's buffer holds of data, per byte of the kernel's accounting, which counts
/// each datagram with its overhead: 1430 bytes took 2304 on loopback (0.62). A session-15
/// reading of 12.3 MB in 33 MB had the batched release in it.
pub(super) const RX_BUFFER_PAYLOAD: f64 = 0.5;
/// In flight past the congestion cap, while the receiver's buffer has room for it: this
/// long at the estimate, µs. A receiver whose host stops it for a while (150-300 ms on the
/// harness) finds data waiting when it resumes, where a cap of two round trips of data
/// stopped the sender after 20 ms on a 10 ms path and left the link idle.
pub(super) const RX_STALL_ROOM_US: u64 = 250_000;

/// Random loss larger than this is not compensated (it is too much to be noise).
pub(super) const MAX_LOSS_COMPENSATION: f64 = 0.25;
/// Weight each calm round's loss keeps in the path's random-loss estimate per newer calm round.
pub(super) const RANDOM_LOSS_DECAY: f64 = 0.9;
/// A growing round loses more than random loss when its loss ratio is over
/// `OVERFLOW_RATIO` × the random loss plus `OVERFLOW_SIGMAS` standard deviations of that
/// loss over the round's datagrams plus `OVERFLOW_MARGIN`: a buffer too short for the queue
/// target (a tenth of a BDP on a short path) overflows before the delay shows anything.
pub(super) const OVERFLOW_RATIO: f64 = 1.25;
pub(super) const OVERFLOW_SIGMAS: f64 = 4.0;
pub(super) const OVERFLOW_MARGIN: f64 = 0.002;
pub(super) const OVERFLOW_MIN_DATAGRAMS: f64 = 50.0;

/// A delivery sample covers a stall when it is this many times longer than the round's
/// samples on average (after this many), and under this share of the estimate.
pub(super) const GAP_INTERVALS: f64 = 4.0;
pub(super) const GAP_MIN_SAMPLES: u32 = 3;
pub(super) const GAP_RATE: f64 = 0.5;

/// A delivery sample is the sender's, not the path's, when the sender's host took over this
/// share of the sample's bytes in sending time from it while it sent them, or it had nothing
/// to send or no room in flight for that long (it sent under three quarters of its pace).
pub(super) const SENDER_LIMITED: f64 = 1.0 / 3.0;
/// A path queue of more than this keeps the bottleneck busy while the sender waits, µs
/// (over the jitter of a real host's timestamps).
pub(super) const BUSY_QUEUE_US: u64 = 500;
