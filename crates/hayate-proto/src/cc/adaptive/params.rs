//! Every tunable of the adaptive controller, with its unit and the reason for its value.
//! The reasons are what the simulator and the WAN harness showed; `Default` holds the
//! values the controller runs with.

use super::policy::Policy;

/// The adaptive controller's tunables. Rates are bytes/s, times µs, shares and gains plain
/// ratios; "a `_div` of n" means one n-th (integer division, as the rules compute it).
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    // ---- Rates --------------------------------------------------------------------------
    /// The first pacing rate, bytes/s (32 Mbit/s): a rate most paths carry for one round trip.
    pub initial_rate: u64,
    /// The lowest pacing rate, bytes/s, whatever the estimate says.
    pub min_rate: u64,
    /// Rounds over which the largest delivery rate is the estimate (BBR's max filter).
    pub bw_window: usize,
    /// A round lasts the smoothed RTT, but no less than this, µs.
    pub min_round_us: u64,
    /// The minimum RTT is taken as at least this in the rate and cap rules, µs (a path
    /// under a millisecond would make increments and caps explode or vanish).
    pub rtt_floor_us: u64,

    // ---- Startup ------------------------------------------------------------------------
    /// Pacing gain while searching: the rate doubles per round trip, so the round that finds
    /// the limit overfills the queue by at most one BDP.
    pub startup_gain: f64,
    /// Startup's in-flight cap, in BDPs of what gets delivered: past the bottleneck it bounds
    /// the queue the search leaves to half a BDP (1.75 lost 3.5 % on a 0.1-BDP buffer, 2
    /// overflowed a 1-BDP one); doubling per round trip needs about 1.44 of them when the
    /// rate rises smoothly with the deliveries.
    pub startup_in_flight_bdps: f64,
    /// Room for bursts on top of every in-flight cap, bytes.
    pub cap_burst_bytes: u64,
    /// Startup's delivery rate is read over the latest `1/startup_recent_rtt_div` of the
    /// minimum RTT (a quarter round), so its pace rises smoothly with what gets through ...
    pub startup_recent_rtt_div: u64,
    /// ... and over at least this, µs.
    pub startup_recent_min_us: u64,
    /// Startup believes at most `1/startup_sent_headroom_div` over what it sent (half):
    /// more is the receiver's timestamps bunching.
    pub startup_sent_headroom_div: u64,
    /// The search goes on while the estimate grows by this factor per round (BBR's
    /// full-pipe test: 25 %) ...
    pub startup_full_growth: f64,
    /// ... and ends after this many rounds without that growth.
    pub startup_full_rounds: u32,
    /// ... or while this round's deliveries so far are this many times the last round's
    /// rate (a newcomer the flows already there yield to).
    pub startup_round_growth: f64,
    /// A search round that loses more than this share ends the search: a burst of loss is a
    /// short buffer overflowing (random loss is lower).
    pub startup_exit_loss: f64,
    /// A search round losing over this many times the recent loss ...
    pub startup_overshoot_loss_ratio: f64,
    /// ... and over this share is its own overshoot: it does not count as the path's loss,
    /// nor as deliveries still growing.
    pub startup_overshoot_min_loss: f64,
    /// RTT samples in a row over the queue target (standing `grow_queue_persist`) that end
    /// the search: fewer are a host stall's late ACKs.
    pub startup_exit_samples: u32,
    /// Startup holds its flight once its own queue shows this much over the last round's
    /// least, µs (over a real host's timestamp jitter), plus what the queue target allows
    /// for the path's own delay variation (`spread_allowance_us`: a delay that grows with
    /// the packet rate as a jittery link's does, with the way back's jitter no longer in
    /// the signal, held a 250 ms Startup at a third of the link) ...
    pub startup_hold_queue_us: u64,
    /// ... on this many RTT samples in a row ...
    pub startup_hold_samples: u32,
    /// ... from this many rounds in (a newcomer's first rounds read flat while it only sends
    /// its first guess).
    pub startup_hold_rounds: u32,
    /// The hold is never under this many datagrams (`grow_step` bytes each; BBR's minimum
    /// window is 4): what was in flight when the queue showed can be nothing (everything
    /// just acknowledged, or lost since), and a cap of nothing sends nothing, so no
    /// acknowledgement comes to lift it.
    pub startup_hold_min_datagrams: u32,
    /// The held flight is no less than this share of what the path carries over the base
    /// RTT: all of it overflowed short buffers, much less left the search short.
    pub hold_carried: f64,

    // ---- Careful resume (a remembered path, RFC 9959) -----------------------------------
    /// A remembered path older than this is ignored, µs (an hour: paths change).
    pub resume_max_age_us: u64,
    /// The first RTT sample must be at least this share of the remembered minimum RTT ...
    pub resume_rtt_low: f64,
    /// ... and at most this many times it, or the path is another one and the jump is not
    /// made (the RFC's check).
    pub resume_rtt_high: f64,
    /// The contention detector measures the queue from such a path's minimum RTT for this
    /// long, µs: as long as the RTT estimator keeps a sample (its window, 10 s). Joining
    /// behind another flow's standing queue, no sample of our own shows the path's floor.
    pub resume_base_us: u64,
    /// ... unless the flow gets this share of the remembered rate delivered before: then
    /// it has the path to itself, and the floor was a route that got longer since.
    pub resume_alone_share: f64,
    /// The jump paces at this share of the remembered rate (the RFC's half of the saved
    /// window), and less if the RTT is longer now (the same window over a longer RTT); in
    /// flight at most this share of the remembered rate over the remembered RTT.
    pub resume_jump_gain: f64,
    /// While the jump is unvalidated, a path queue over this many queue targets on
    /// `grow_queue_samples` samples in a row, standing `grow_queue_persist`, is the path
    /// saying no: retreat.
    pub resume_retreat_queue: f64,
    /// So is a loss ratio over this among the jump's packets (over
    /// `overflow_min_datagrams`): random loss is lower, a buffer overflowing higher.
    pub resume_retreat_loss: f64,
    /// What a session measured is worth remembering after this many rounds past Startup
    /// (the rate was found, not only searched for) ...
    pub remember_min_rounds: u32,
    /// ... when the sender had nothing to send for at most this share of what it delivered
    /// meanwhile (an application slower than the path measures the application) ...
    pub remember_app_limited: f64,
    /// ... and the estimate is under this share of the rate cap (a capped session measures
    /// the cap).
    pub remember_under_cap: f64,

    // ---- Drain (after Startup) ----------------------------------------------------------
    /// Pacing gain while startup's queue drains, until no more than a BDP is in flight (then
    /// Drain paces at the estimate until an RTT sample shows the queue gone: three quarters
    /// of the link for that last round trip left it a quarter empty).
    pub drain_gain: f64,
    /// Drain, and ProbeBw's Down phase, last at most this many rounds.
    pub max_drain_rounds: u32,

    // ---- ProbeBw: Up ---------------------------------------------------------------------
    /// Up's first increment, bytes per round trip (one datagram); it doubles every minimum
    /// RTT, the same for every flow whatever its rate, so shares converge (additive increase).
    pub grow_step: f64,
    /// The increment is at most this share of the estimate (past it, growth is Startup's
    /// job).
    pub max_grow: f64,
    /// The increment doubles at most this many times (keeps `2^n` finite).
    pub max_grow_doublings: f64,
    /// Up ends when the path's queue exceeds this many queue targets ...
    pub grow_queue: f64,
    /// ... on this many RTT samples in a row ...
    pub grow_queue_samples: u32,
    /// ... standing for `1/grow_queue_persist_rtt_div` of the minimum RTT (a host's stall
    /// is shorter; the queue grows by at most a quarter meanwhile) ...
    pub grow_queue_persist_rtt_div: u64,
    /// ... but at least this, µs ...
    pub grow_queue_persist_min_us: u64,
    /// ... and at most this, µs.
    pub grow_queue_persist_max_us: u64,
    /// Up starts over (at Refill) when it sends this many times what gets through and no
    /// queue builds (a policer, or a receiver dropping silently).
    pub grow_undelivered: f64,
    /// ... once it has grown this many rounds.
    pub grow_undelivered_rounds: u32,

    // ---- Queue target -------------------------------------------------------------------
    /// The queue target is `1/queue_target_rtt_div` of the minimum RTT ...
    pub queue_target_rtt_div: u64,
    /// ... at least this, µs: a real host wakes the sender up to a millisecond late, and
    /// the pacer's catch-up burst queues for as long; a lower target reads those bursts as
    /// congestion ...
    pub queue_target_min_us: u64,
    /// ... and at most this, µs.
    pub queue_target_max_us: u64,
    /// A queue under this share of the target is (nearly) gone: Drain and Down end on it,
    /// and delivery samples count as a share only over it. Not 0 (the sample is half a round
    /// trip old, the drain went on meanwhile); not higher (a queue left standing inflates a
    /// newcomer's minimum RTT, and it takes more than its share).
    pub drain_floor: f64,
    /// A buffer that overflowed holding less than this many queue targets is "short" ...
    pub shallow_targets: u64,
    /// ... and the target is then a third of it (Up stops at half of it, a round trip before
    /// it overflows), but at least this, µs: a real host's ACK timing wobbles by a few
    /// hundred µs.
    pub min_shallow_target_us: u64,
    /// A buffer learnt short is forgotten this long after it last overflowed, µs: Up finds
    /// it again only by overflowing it, which costs megabytes on a long fast path.
    pub shallow_memory_us: u64,
    /// The path's own delay variation counts past this, µs: a host's timers and the
    /// pacer's bursts make samples stray by tens to a couple of hundred µs on a clean path
    /// (and another flow's bursts into a shared queue as much), which the target needs no
    /// room for ...
    pub spread_floor_us: u64,
    /// ... and the queue target is raised by this many times the rest of it (the
    /// median distance of an RTT sample from the line through its neighbours, see
    /// `queue::DelaySpread`): about twice the deviation of the variation, so that samples
    /// of a path that varies by itself seldom stray over the target when no queue stands ...
    pub spread_gain: f64,
    /// ... by at most `1/spread_max_rtt_div` of the minimum RTT (a queue that costs more is
    /// not worth the share it saves) ...
    pub spread_max_rtt_div: u64,
    /// ... measured over this many latest RTT samples (a few round trips of feedback at
    /// 300 Mbit/s, one ACK every 32 datagrams) ...
    pub spread_samples: usize,
    /// ... once at least this many came (a few samples tell a host's stall no better than
    /// the path's variation).
    pub spread_min_samples: usize,

    // ---- ProbeBw: Down (yield) ----------------------------------------------------------
    /// The estimate after a queue was found: this much of the share found. The room left is
    /// what every flow regains by equal increments, the AIMD that evens shares out; a lone
    /// flow pays for it until the increments make it up (0.99: about 99 % of the link).
    pub share_gain: f64,
    /// A share this much under or over a remembered one is "moving" ...
    pub share_moving: f64,
    /// ... and when it is apart from this many remembered shares (one odd reading is a host's
    /// hiccup, not shares moving) ...
    pub shares_apart: usize,
    /// ... the flow yields this deeper gain instead, so uneven shares even out quickly. Each
    /// such cycle leaves the gap between two flows at this fraction of what it was (both
    /// cut by it, equal increments refill the room), and a cycle lasts about ten round
    /// trips: at 0.95 a newcomer on a 100 ms path still had 0.6-0.8 of the first flow's
    /// rate 13 s in (Jain 0.94-0.99 in the simulator), at 0.9 0.8-0.95 (0.98-1.00). Deeper
    /// (0.85) evens flows faster still, but leaves more of the link idle while they do
    /// (94 % of it where 0.9 fills 96 %) and whenever on/off cross traffic moves the shares.
    pub converge_gain: f64,
    /// Shares remembered for that, one per yield.
    pub share_history: usize,
    /// A share is read off this many delivery samples of the two rounds the queue built in
    /// at least (fewer: a host stall's single sample).
    pub share_min_samples: u32,
    /// One yield cuts the estimate by at most `1/share_floor_div` of it (half): a receiver
    /// that fell behind once must not throw the rate away; a path that really got slower
    /// shows its queue again and is halved again.
    pub share_floor_div: u64,
    /// A queue over this share of the minimum RTT ...
    pub big_queue: f64,
    /// ... and over this many queue targets (an ordinary Up on a short path reaches a third
    /// of the RTT) is a newcomer's search or a slower path ...
    pub big_queue_targets: f64,
    /// ... and every flow yields this gain to it.
    pub big_queue_gain: f64,
    /// Down paces at the share times one minus the queueing delay over the minimum RTT (so
    /// the queue empties in about a round trip), at least this ...
    pub min_queue_drain_gain: f64,
    /// ... at most this (also the gain before any queue was found) ...
    pub max_queue_drain_gain: f64,
    /// ... with the queue spread over at least this, µs: on a short path draining in one
    /// round trip left the link under-filled by the drain's depth.
    pub min_drain_span_us: u64,

    // ---- Delivery samples ---------------------------------------------------------------
    /// Deliveries count at most `1/sample_headroom_div` (a quarter) over the pace as the
    /// round began (or the rate): more is the receiver's timestamps bunching or a host's
    /// catch-up; less kept a smaller flow from growing to its share.
    pub sample_headroom_div: u64,
    /// A sample is the sender's, not the path's, when the sender's host took, or it had
    /// nothing to send for, over this share of the sample's bytes in sending time.
    pub sender_limited: f64,
    /// A sample covers a stall when it is this many times longer than the round's samples
    /// on average ...
    pub gap_intervals: f64,
    /// ... after this many samples ...
    pub gap_min_samples: u32,
    /// ... and under this share of the estimate (also the "far under" of a waiting sender).
    pub gap_rate: f64,
    /// A path queue over this keeps the bottleneck busy while the sender waits, µs (over a
    /// real host's timestamp jitter).
    pub busy_queue_us: u64,

    // ---- Loss ---------------------------------------------------------------------------
    /// Weight of the newest round in the recent loss ratio (an EWMA).
    pub loss_ewma_gain: f64,
    /// Weight each calm round's loss keeps in the random-loss estimate per newer calm round.
    pub random_loss_decay: f64,
    /// Random loss over this is not compensated (too much to be noise).
    pub max_loss_compensation: f64,
    /// A round loses more than random loss when its ratio is over this many times the
    /// random loss ...
    pub overflow_ratio: f64,
    /// ... plus this many standard deviations of that loss over the round's datagrams ...
    pub overflow_sigmas: f64,
    /// ... plus this: a buffer too short for the queue target overflows before any delay
    /// shows, and this is how Up finds it.
    pub overflow_margin: f64,
    /// A loss ratio says something only over this many datagrams (`grow_step` bytes each).
    pub overflow_min_datagrams: f64,
    /// The loss test takes the random loss as at least this many datagrams of what the calm
    /// rounds settled: no loss in n datagrams rules out only a rate over about 3/n (the rule
    /// of three, 95 %). A round or two of calm with no loss in them read as a loss-free path
    /// made the first loss-rate round of a 1 %-loss path an overflow (2.8 % of 378
    /// datagrams), and the buffer it learnt short held the flow at 72 % of the link.
    pub random_loss_floor_datagrams: f64,

    // ---- The receiver -------------------------------------------------------------------
    /// The receiver's lag (its backlog plus deliberate ACK delay, up to 5 ms by design)
    /// counts as queue only over this, µs, when it does not say how full its buffer is.
    pub rx_lag_allowance_us: u64,
    /// When it does: only the backlog over this share of its buffer counts. A busy host's
    /// receiver falls tens of ms behind and catches up; Linux releases what a UDP reader
    /// took a quarter of the buffer at a time, so a quarter can be all read.
    pub rx_buffer_calm: f64,
    /// The share when the buffer holds all the congestion cap lets into flight (it cannot
    /// overflow then).
    pub rx_buffer_calm_roomy: f64,
    /// What a receiver's buffer holds of data per byte of the kernel's accounting, which
    /// counts each datagram with its overhead (about 0.62 measured on loopback).
    pub rx_buffer_payload: f64,
    /// In flight past the congestion cap while the receiver's buffer has room: this long at
    /// the estimate, µs. A receiver whose host stops it for 150-300 ms finds data waiting
    /// when it resumes, instead of an idle link.
    pub rx_stall_room_us: u64,
    /// After the receiver dropped datagrams without a rate sample, it took
    /// `1/rx_drop_guess_div` of the pace (half).
    pub rx_drop_guess_div: u64,
    /// Past Startup, in flight up to this many BDPs (of the base RTT, so a standing queue
    /// does not widen it) keeps the pipe full through ACK jitter.
    pub congestion_cap_bdps: u64,

    // ---- Sharing (see `policy.rs`) ------------------------------------------------------
    /// How this flow shares a queue that is not its own.
    pub policy: Policy,
    /// Rounds in a row with a queue over the target all round (Copa waits 5 round trips)
    /// ...
    pub contend_rounds: u32,
    /// ... through this many yields of ours, make the queue another flow's.
    pub contend_yields: u32,
    /// So do this many rounds in a row in which the queue was never (nearly) gone, through
    /// as many yields. Joining behind a loss-based flow, the minimum RTT has that flow's
    /// standing queue in it; over it our yields push the queue just under the target
    /// while that flow grows into what they give away, and the first test waits for the
    /// other flow's next cut. Our own queue, and one another hayate flow keeps, goes within
    /// a few yields (on the emulated WAN, at most 8 rounds in a row).
    pub contend_standing_rounds: u32,
    /// ... and at least this long, µs: on a short path the queue target is at its floor,
    /// within a host's timing jitter, and two hayate flows' gentle drains can leave a
    /// millisecond standing for up to 1.9 s (10 ms, in the simulator).
    pub contend_standing_us: u64,
    /// `Policy::Fair`, contended: a round losing more than random loss cuts the estimate
    /// to this share (CUBIC's multiplicative decrease) ...
    pub contend_beta: f64,
    /// Contention began: pace this times the estimate until the first overflow.
    pub contend_search_gain: f64,
    /// ... at most once in this many rounds (a loss-based flow cuts once per overflow; the
    /// rounds after a cut still hold the full buffer's samples, so none of them shows the
    /// buffer full again) ...
    pub contend_cut_rounds: u32,
    /// ... or when the RTT falls from full by this share of it (at least a queue target):
    /// the other flow lost what overflowed and cut ...
    pub contend_drop: f64,
    /// ... full being the largest RTT that stood over this many rounds: longer than a
    /// rate-based flow's cycle (BBR's 8), long enough that a loss-based flow's growth
    /// between cuts keeps its top. Not the largest since contention began: one early spike
    /// (22 ms of queue beside a BBR-like flow whose queue then ran at 7-18 ms with 1 %
    /// loss) left the buffer never full again but for rare spikes, its drains went unseen,
    /// and hayate cut at each spike: 9-11 % of a 300 Mbit/s, 50 ms path, 44-53 % with the
    /// window.
    pub contend_full_rounds: usize,
    /// ... but not within this many rounds of a delivery sample that covered a stall of
    /// our sender's host: while it was held the queue drained by what it did not send, and
    /// that fall is ours (a sender held 20 ms every 200 ms beside CUBIC cut every half
    /// second, CUBIC every two to four). The stall's samples come in the round that ends
    /// with them; the refill's, over which the RTT climbs back, in the next two.
    pub contend_stall_rounds: u32,
    /// ... unless the other flow is rate-based (`Contention::rate_based`). Then nothing
    /// cuts: the estimate is held, and probed `contend_search_gain` over for two rounds
    /// after this many at it, then `drain_gain` under it for one (BBR's cycle: 6 rounds at
    /// its estimate, one over, one under; the second round over shows the first's
    /// deliveries, which a round's mean smooths out).
    pub contend_cruise_rounds: u32,
    /// A fall from full counts as the other flow's cut only this many rounds or more after
    /// the fall before: a loss-based flow takes longer to grow back and overflow again
    /// (CUBIC's curve seconds, Reno's a segment a round trip), a rate-based one drains
    /// every few rounds without cutting (BBR every 8).
    pub contend_fall_spacing: u32,
    /// This many such quick falls in a row make the other flow rate-based (one can be
    /// a loss-based flow's burst right after a cut).
    pub contend_quick_falls: u32,
    /// ... and between cuts its rate follows CUBIC's window curve with this constant
    /// (MSS/s³, RFC 9438's C).
    pub contend_cubic_c: f64,
    /// `Policy::Low`, contended: each round the queue stands cuts the estimate to this
    /// share.
    pub low_beta: f64,

    // ---- Ablation -------------------------------------------------------------------------
    /// Rules switched off, to measure what each one pays for (`bench/sim-matrix --ablate`);
    /// empty in normal use.
    pub ablation: Ablation,
}

/// A rule of the state machine that can be switched off for an ablation run (see the module
/// doc's transition table; [`Rule::ALL`] lists them with what they are).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// Startup holds its flight once its own queue shows (`hold_at_queue`), and holds no
    /// less than what the path carries.
    StartupHold,
    /// Startup leaves on a standing queue (RTT samples), not only on a plateau or loss.
    StartupQueueExit,
    /// Startup leaves on a round that lost over `startup_exit_loss`.
    StartupLossExit,
    /// A queue does not end Startup while deliveries still grow (a newcomer's search).
    StartupStillGrowing,
    /// Startup's drain paces at the estimate once a BDP or less is in flight.
    DrainAtEstimate,
    /// Drain and Down end on the first RTT sample that shows the queue gone (Startup's
    /// drain: of what was sent since it began).
    EarlyDrainExit,
    /// Refill or Up yield at round end when a queue stood all round.
    StandingQueueYield,
    /// Refill or Up yield at round end on loss over random loss (a buffer overflowing).
    OverflowYield,
    /// Up starts over (Refill) when sending more got nothing more through (a policer).
    UndeliveredRefill,
    /// On a short buffer the increment stops doubling while a queue shows.
    ShallowGrowthPause,
    /// Moving shares take the deeper `converge_gain` cut.
    ConvergeGain,
    /// A queue far over the target takes the `big_queue_gain` cut.
    BigQueueGain,
    /// Past the congestion cap only the drained rate is sent (feedback overdue).
    BlindPastCap,
    /// Down goes on while a queue still stands (up to `max_drain_rounds`).
    DownWhileStanding,
    /// The queue target allows for the path's own delay variation (`spread_gain`).
    SpreadAllowance,
    /// `Policy::Fair` competes as a rate-based flow does beside one whose falls from full
    /// come every few rounds (`Contention::rate_based`).
    RateBasedCompete,
}

impl Rule {
    /// Every rule, with its name in the ablation table.
    pub const ALL: [(Rule, &'static str); 16] = [
        (Rule::StartupHold, "startup-hold"),
        (Rule::StartupQueueExit, "startup-queue-exit"),
        (Rule::StartupLossExit, "startup-loss-exit"),
        (Rule::StartupStillGrowing, "startup-still-growing"),
        (Rule::DrainAtEstimate, "drain-at-estimate"),
        (Rule::EarlyDrainExit, "early-drain-exit"),
        (Rule::StandingQueueYield, "standing-queue-yield"),
        (Rule::OverflowYield, "overflow-yield"),
        (Rule::UndeliveredRefill, "undelivered-refill"),
        (Rule::ShallowGrowthPause, "shallow-growth-pause"),
        (Rule::ConvergeGain, "converge-gain"),
        (Rule::BigQueueGain, "big-queue-gain"),
        (Rule::BlindPastCap, "blind-past-cap"),
        (Rule::DownWhileStanding, "down-while-standing"),
        (Rule::SpreadAllowance, "spread-allowance"),
        (Rule::RateBasedCompete, "rate-based-compete"),
    ];
}

/// A set of [`Rule`]s switched off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Ablation(u32);

impl Ablation {
    /// `rule` switched off too.
    pub fn without(self, rule: Rule) -> Self {
        Ablation(self.0 | 1 << rule as u32)
    }

    /// Whether `rule` is on.
    pub fn on(self, rule: Rule) -> bool {
        self.0 & (1 << rule as u32) == 0
    }
}

impl Default for Params {
    fn default() -> Self {
        Params {
            initial_rate: 4_000_000,
            min_rate: 50_000,
            bw_window: 10,
            min_round_us: 2_000,
            rtt_floor_us: 1_000,

            startup_gain: 2.0,
            startup_in_flight_bdps: 1.5,
            cap_burst_bytes: 256 * 1024,
            startup_recent_rtt_div: 4,
            startup_recent_min_us: 4_000,
            startup_sent_headroom_div: 2,
            startup_full_growth: 1.25,
            startup_full_rounds: 3,
            startup_round_growth: 1.5,
            startup_exit_loss: 0.15,
            startup_overshoot_loss_ratio: 3.0,
            startup_overshoot_min_loss: 0.05,
            startup_exit_samples: 3,
            startup_hold_queue_us: 500,
            startup_hold_samples: 2,
            startup_hold_rounds: 3,
            startup_hold_min_datagrams: 4,
            hold_carried: 0.9,

            resume_max_age_us: 3_600_000_000,
            resume_rtt_low: 0.5,
            resume_rtt_high: 10.0,
            resume_base_us: 10_000_000,
            resume_alone_share: 0.9,
            resume_jump_gain: 0.5,
            resume_retreat_queue: 1.5,
            resume_retreat_loss: 0.05,
            remember_min_rounds: 8,
            remember_app_limited: 0.25,
            remember_under_cap: 0.95,

            drain_gain: 0.75,
            max_drain_rounds: 3,

            grow_step: 1500.0,
            max_grow: 0.25,
            max_grow_doublings: 40.0,
            grow_queue: 1.5,
            grow_queue_samples: 3,
            grow_queue_persist_rtt_div: 4,
            grow_queue_persist_min_us: 2_000,
            grow_queue_persist_max_us: 25_000,
            grow_undelivered: 1.1,
            grow_undelivered_rounds: 2,

            queue_target_rtt_div: 20,
            queue_target_min_us: 2_000,
            queue_target_max_us: 25_000,
            drain_floor: 0.5,
            shallow_targets: 3,
            min_shallow_target_us: 450,
            shallow_memory_us: 20_000_000,
            spread_floor_us: 250,
            spread_gain: 3.0,
            spread_max_rtt_div: 2,
            spread_samples: 64,
            spread_min_samples: 16,

            share_gain: 0.99,
            share_moving: 0.9,
            shares_apart: 2,
            converge_gain: 0.9,
            share_history: 4,
            share_min_samples: 3,
            share_floor_div: 2,
            big_queue: 1.0 / 3.0,
            big_queue_targets: 4.0,
            big_queue_gain: 0.7,
            min_queue_drain_gain: 0.7,
            max_queue_drain_gain: 0.95,
            min_drain_span_us: 30_000,

            sample_headroom_div: 4,
            sender_limited: 1.0 / 3.0,
            gap_intervals: 4.0,
            gap_min_samples: 3,
            gap_rate: 0.5,
            busy_queue_us: 500,

            loss_ewma_gain: 0.25,
            random_loss_decay: 0.9,
            max_loss_compensation: 0.25,
            overflow_ratio: 1.25,
            overflow_sigmas: 4.0,
            overflow_margin: 0.002,
            overflow_min_datagrams: 50.0,
            random_loss_floor_datagrams: 3.0,

            rx_lag_allowance_us: 5_000,
            rx_buffer_calm: 0.25,
            rx_buffer_calm_roomy: 0.5,
            rx_buffer_payload: 0.5,
            rx_stall_room_us: 250_000,
            rx_drop_guess_div: 2,
            congestion_cap_bdps: 2,
            policy: Policy::Fair,
            contend_rounds: 10,
            contend_yields: 4,
            contend_standing_rounds: 12,
            contend_standing_us: 3_000_000,
            contend_beta: 0.7,
            contend_search_gain: 1.25,
            contend_cubic_c: 0.4,
            contend_cut_rounds: 3,
            contend_drop: 0.08,
            contend_full_rounds: 48,
            contend_stall_rounds: 2,
            contend_cruise_rounds: 7,
            contend_fall_spacing: 16,
            contend_quick_falls: 2,
            low_beta: 0.5,
            ablation: Ablation::default(),
        }
    }
}
