//! A simulated network for whole sessions in virtual time: loss, reordering, duplication,
//! bit corruption, delay, a bottleneck rate with a tail-drop queue, and optionally CoDel at
//! that queue (`codel`), a token-bucket policer (`policer`), delay jitter and ACK aggregation
//! (`jitter`) and bursty loss (`gilbert`). Both ends run the real
//! [`Connection`]/[`Endpoint`] code with real crypto; only time and the wire are simulated,
//! so a 30 %-loss transfer over a 200 ms path finishes in milliseconds of real time. The
//! forward link's rate can change over time ([`RateStep`]). Cross traffic can share the
//! forward link: TCP CUBIC and BBR-like bulk flows ([`TcpSpec`], `tcp` and `bbr`), and on/off
//! short CUBIC flows at a mean load ([`ShortFlows`], `onoff`).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::cc::RateConfig;
use crate::conn::{BlockSink, BlockSource, Config, Connection, Event, ReceiverState, StorageError};
use crate::crypto::Psk;
use crate::endpoint::{Endpoint, Route};
use crate::rng::Rng as KeyRng;
use crate::transfer::XferId;
use crate::wire::{AddrFamily, Cid};

mod bbr;
mod codel;
mod gilbert;
mod jitter;
mod onoff;
mod policer;
mod tcp;
pub use codel::CoDelParams;
pub use gilbert::GilbertElliott;
pub use jitter::{JitterDist, JitterParams};
pub use onoff::{FlowSize, ShortFlows};
pub use policer::PolicerParams;
use tcp::Tcp;
pub use tcp::TcpSpec;

/// One direction of the simulated path.
#[derive(Debug, Clone)]
pub struct LinkParams {
    /// One-way propagation delay, µs.
    pub delay_us: u64,
    /// Bottleneck rate in bytes/s (`None` = infinitely fast).
    pub rate: Option<u64>,
    /// Tail-drop queue in front of the bottleneck, bytes.
    pub queue_bytes: u64,
    /// Probability a datagram is lost at random.
    pub loss: f64,
    /// Probability a datagram is held back by `reorder_us` extra (overtaken by later ones).
    pub reorder: f64,
    /// How long a reordered datagram is held back, µs.
    pub reorder_us: u64,
    /// Probability a datagram is delivered twice (the copy up to 1 ms later).
    pub duplicate: f64,
    /// Probability one random bit of a datagram is flipped.
    pub corrupt: f64,
    /// A busy host: every `stall_every_us` (0 = never) on average the link holds everything
    /// for `stall_us`, then lets it all go at once (a descheduled VM, router or receiver).
    pub stall_every_us: u64,
    /// How long each stall lasts, µs.
    pub stall_us: u64,
    /// How the held datagrams go after a stall: 0, all at one instant; `n`, in order at `n`
    /// times the pace they came in (a real emulator or router catching up at CPU speed, so a
    /// receiver sees a few ms of data arrive at several times the link rate).
    pub stall_release_speedup: u64,
    /// CoDel at the bottleneck queue's head (needs `rate`; `None`: plain tail drop).
    pub aqm: Option<CoDelParams>,
    /// A token-bucket policer in front of the queue: what exceeds it is dropped.
    pub policer: Option<PolicerParams>,
    /// Extra per-datagram delay after the bottleneck.
    pub jitter: Option<JitterParams>,
    /// Hold what arrives and release it every this many µs (0: never): ACK aggregation on
    /// the reverse path.
    pub aggregate_us: u64,
    /// Bursty loss after the bottleneck, on top of `loss`.
    pub burst_loss: Option<GilbertElliott>,
    /// The link's MTU: a bigger IP packet is dropped, as a router drops one with the
    /// don't-fragment bit set (`None`: any size).
    pub mtu: Option<usize>,
}

impl Default for LinkParams {
    fn default() -> Self {
        LinkParams {
            delay_us: 10_000,
            rate: None,
            queue_bytes: u64::MAX,
            loss: 0.0,
            reorder: 0.0,
            reorder_us: 2_000,
            duplicate: 0.0,
            corrupt: 0.0,
            stall_every_us: 0,
            stall_us: 0,
            stall_release_speedup: 0,
            aqm: None,
            policer: None,
            jitter: None,
            aggregate_us: 0,
            burst_loss: None,
            mtu: None,
        }
    }
}

/// A rate change of the forward link at a moment in virtual time.
#[derive(Debug, Clone)]
pub struct RateStep {
    /// When, µs of virtual time.
    pub at_us: u64,
    /// The forward link's bottleneck rate from then on, bytes/s (`None`: infinitely fast).
    pub rate: Option<u64>,
}

/// The server host's receive path when it is slower than the link (disk, CPU): datagrams
/// wait in the socket's receive buffer until the application takes them at `rate`; when the
/// buffer is full the kernel drops them and counts the drop, which the server reports to its
/// peers through [`Connection::set_receiver_state`], as the real I/O shell does.
#[derive(Debug, Clone)]
pub struct ReceiverParams {
    /// Bytes per second (whole datagrams plus IP/UDP headers) the application takes in.
    pub rate: u64,
    /// Socket receive buffer, bytes (datagrams plus IP/UDP headers).
    pub buffer_bytes: u64,
    /// The application is descheduled for `stall_us` every `stall_every_us` on average (0:
    /// never); meanwhile datagrams wait in the buffer, and it catches up at `catch_up` times
    /// the pace they came in (a receiver on a busy 2-core host: 2-4).
    pub stall_every_us: u64,
    /// How long each stall lasts, µs.
    pub stall_us: u64,
    /// After a stall the held datagrams are taken at this many times the pace they came in
    /// (0: all at once).
    pub catch_up: u64,
}

/// One more client of the same server, sharing the bottleneck with the scenario's own client.
#[derive(Debug, Clone)]
pub struct ClientSpec {
    /// When it connects, µs of virtual time.
    pub start_us: u64,
    /// Its connection's configuration.
    pub config: Config,
    /// Its key (the server's is [`Scenario::psk`]).
    pub psk: Psk,
    /// Files it uploads: (remote path, contents).
    pub uploads: Vec<(String, Vec<u8>)>,
    /// Files on the server it downloads: (path, contents).
    pub downloads: Vec<(String, Vec<u8>)>,
    /// Paths it asks for that the server does not have.
    pub missing_downloads: Vec<String>,
    /// Record what its rate controller saw and did ([`ClientResult::cc_trace`]).
    pub cc_trace: bool,
    /// Its host is descheduled for `stall_us` every `stall_every_us` on average (0: never):
    /// meanwhile it neither sends nor reads what arrives (a sender on a busy 2-core VM).
    pub stall_every_us: u64,
    /// How long each stall lasts, µs.
    pub stall_us: u64,
    /// Its host wakes it this late on average (evenly between none and twice it) each time
    /// it waited for a timer or a datagram (0: on time): a host whose cores other work keeps
    /// busy, as a build does.
    pub wake_late_us: u64,
    /// Its adaptive controller's tunables, if not the defaults.
    pub cc_params: Option<crate::cc::AdaptiveParams>,
}

/// A whole simulated run: the path both ways, the server and its clients, and what they
/// transfer. [`Scenario::new`] gives a 10 ms, lossless, unlimited path and 50 MB/s fixed
/// rates; [`run`] plays it.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Seeds every random choice (the links', the stalls', the keys and connection ids), so
    /// a run repeats exactly.
    pub seed: u64,
    /// client → server
    pub forward: LinkParams,
    /// server → client
    pub reverse: LinkParams,
    /// Changes of the forward link's rate over time, in any order.
    pub forward_steps: Vec<RateStep>,
    /// The client's connection configuration (and, by default, every extra client's).
    pub client: Config,
    /// The server endpoint's configuration.
    pub server: Config,
    /// The server's key; the client uses `client_psk` (normally the same).
    pub psk: Psk,
    /// The client's key: another than `psk` makes the handshake fail.
    pub client_psk: Psk,
    /// Files the client uploads: (remote path, contents).
    pub uploads: Vec<(String, Vec<u8>)>,
    /// Files on the server the client downloads: (path, contents).
    pub downloads: Vec<(String, Vec<u8>)>,
    /// Paths the client asks for that the server does not have.
    pub missing_downloads: Vec<String>,
    /// More clients on the same links (same queues, rates, delays, losses), each from its
    /// own address; results in [`SimResult::clients`] after the scenario's own client.
    pub extra_clients: Vec<ClientSpec>,
    /// The server's receive path, if slower than the link (`None`: it keeps up).
    pub server_receiver: Option<ReceiverParams>,
    /// The server's disk, if slower than the link (`None`: it keeps up).
    pub server_disk: Option<DiskParams>,
    /// How fast the server's disk reads each file it sends, bytes/s from the file's first
    /// read (`None`: at once). A block not read yet is [`StorageError::NotReady`], as the
    /// driver's read-ahead says it.
    pub server_read_rate: Option<u64>,
    /// Give up after this much virtual time.
    pub limit_us: u64,
    /// Clients record their rate controller's trace (for debugging a scenario).
    pub cc_trace: bool,
    /// Every client's host stalls like this (see [`ClientSpec::stall_every_us`]).
    pub client_stall_every_us: u64,
    /// How long each of those stalls lasts, µs.
    pub client_stall_us: u64,
    /// Every client's host wakes it this late (see [`ClientSpec::wake_late_us`]).
    pub client_wake_late_us: u64,
    /// TCP CUBIC bulk flows through the same forward link (cross traffic).
    pub tcp_flows: Vec<TcpSpec>,
    /// BBR-like bulk flows through the same forward link (cross traffic; `sim/bbr.rs`).
    pub bbr_flows: Vec<TcpSpec>,
    /// On/off short CUBIC flows through the same forward link (cross traffic).
    pub short_flows: Option<ShortFlows>,
    /// Every client's adaptive controller runs with these tunables (`None`: the defaults),
    /// e.g. with rules switched off ([`crate::cc::Ablation`]).
    pub client_cc_params: Option<crate::cc::AdaptiveParams>,
}

impl Scenario {
    /// A scenario with defaults: [`LinkParams::default`] both ways, fixed 50 MB/s rates, one
    /// client with nothing to transfer, the same key on both sides, a 120 s time limit.
    pub fn new(seed: u64) -> Self {
        let psk = Psk::from_bytes([7; 32]);
        Scenario {
            seed,
            forward: LinkParams::default(),
            reverse: LinkParams::default(),
            forward_steps: Vec::new(),
            client: Config {
                rate: RateConfig::Fixed(50_000_000),
                ..Config::default()
            },
            server: Config {
                rate: RateConfig::Fixed(50_000_000),
                ..Config::default()
            },
            client_psk: psk.clone(),
            psk,
            uploads: Vec::new(),
            downloads: Vec::new(),
            missing_downloads: Vec::new(),
            extra_clients: Vec::new(),
            server_receiver: None,
            server_disk: None,
            server_read_rate: None,
            limit_us: 120_000_000,
            cc_trace: false,
            client_stall_every_us: 0,
            client_stall_us: 0,
            client_wake_late_us: 0,
            tcp_flows: Vec::new(),
            bbr_flows: Vec::new(),
            short_flows: None,
            client_cc_params: None,
        }
    }

    /// Another client like the scenario's own (same config and key), starting at `start_us`
    /// with nothing to do yet: fill in its files and push it to `extra_clients`.
    pub fn another_client(&self, start_us: u64) -> ClientSpec {
        ClientSpec {
            start_us,
            config: self.client.clone(),
            psk: self.client_psk.clone(),
            uploads: Vec::new(),
            downloads: Vec::new(),
            missing_downloads: Vec::new(),
            cc_trace: self.cc_trace,
            stall_every_us: self.client_stall_every_us,
            stall_us: self.client_stall_us,
            wake_late_us: self.client_wake_late_us,
            cc_params: self.client_cc_params.clone(),
        }
    }

    fn own_client(&self) -> ClientSpec {
        ClientSpec {
            uploads: self.uploads.clone(),
            downloads: self.downloads.clone(),
            missing_downloads: self.missing_downloads.clone(),
            ..self.another_client(0)
        }
    }
}

/// What one client saw.
#[derive(Debug, Default)]
pub struct ClientResult {
    /// Its transfers all finished verified, and its session closed normally.
    pub ok: bool,
    /// What went wrong, if anything: its session closed with an error, a download failed or
    /// did not match.
    pub error: Option<String>,
    /// When it connected, µs of virtual time.
    pub start_us: u64,
    /// When its session ended (or the simulation stopped).
    pub end_us: u64,
    /// Its own connection, and the server's connection for it.
    pub stats: crate::conn::Stats,
    /// The server's connection for it (see `stats`).
    pub server: crate::conn::Stats,
    /// Transfers refused or failed on the far side: (path, reason).
    pub rejected: Vec<(String, String)>,
    /// Files it downloaded.
    pub files: HashMap<String, Vec<u8>>,
    /// Data bytes the server took in from this client per 100 ms of virtual time (uploads).
    pub server_rx_trace: Vec<u64>,
    /// Data bytes this client took in per 100 ms (downloads).
    pub rx_trace: Vec<u64>,
    /// Its pacing rate (bytes/s) and smoothed RTT (µs) at the start of each 100 ms.
    pub pace_trace: Vec<u64>,
    /// Its smoothed RTT at the start of each 100 ms, µs (see `pace_trace`).
    pub srtt_trace: Vec<u64>,
    /// Every feedback its rate controller got, with [`Scenario::cc_trace`].
    pub cc_trace: Vec<crate::conn::CcTraceRow>,
    /// What its rate controller measured of the path at the end, when worth remembering
    /// (see [`RateControl::measured`](crate::cc::RateControl::measured)).
    pub measured: Option<crate::cc::PathMeasurement>,
    /// The MTU its session agreed in the handshake.
    pub mtu: u16,
    /// When its handshake completed, µs of virtual time.
    pub connected_us: Option<u64>,
}

/// What [`run`] saw: the outcome, the files as each side holds them, every side's counters
/// and traces of rates over virtual time.
#[derive(Debug, Default)]
pub struct SimResult {
    /// Every transfer (of every client) finished verified, and every session closed normally.
    pub ok: bool,
    /// The error of the first client (in order) that had one (see [`ClientResult::error`]),
    /// else why the simulation stopped early (nothing left to do, or [`Scenario::limit_us`]
    /// reached).
    pub error: Option<String>,
    /// Until the last client was done.
    pub elapsed_us: u64,
    /// When the server last verified an upload, µs.
    pub server_verified_us: u64,
    /// How each server session ended (its `Closed` event's error; `None`: normally). The
    /// run goes on until what the clients sent last has reached the server.
    pub server_closed: Vec<Option<String>>,
    /// Downloads the server heard verified by their client.
    pub server_heard_verified: u64,
    /// Files as the server holds them after the run (uploads) and the client (downloads).
    pub server_files: HashMap<String, Vec<u8>>,
    /// Files the scenario's own client downloaded: path → contents.
    pub client_files: HashMap<String, Vec<u8>>,
    /// The scenario's own client, and the server's connection for it.
    pub client: crate::conn::Stats,
    /// The server's connection for the scenario's own client (see `client`).
    pub server: crate::conn::Stats,
    /// Every client's refused or failed transfers: (path, reason).
    pub rejected: Vec<(String, String)>,
    /// The server endpoint's counters (hellos accepted, retried and rejected; datagrams
    /// dropped).
    pub endpoint: crate::endpoint::EndpointStats,
    /// Corrupted datagrams the simulated wire delivered to a connection (both directions).
    pub corrupted: u64,
    /// Forward link: datagrams delivered / dropped by the queue / lost at random.
    pub fwd_delivered: u64,
    /// Forward link: datagrams the bottleneck's full queue dropped.
    pub fwd_queue_drops: u64,
    /// Forward link: datagrams lost at random ([`LinkParams::loss`] and
    /// [`LinkParams::burst_loss`]).
    pub fwd_random_losses: u64,
    /// Forward link: datagrams CoDel dropped ([`LinkParams::aqm`]).
    pub fwd_aqm_drops: u64,
    /// Forward link: datagrams the policer dropped ([`LinkParams::policer`]).
    pub fwd_policer_drops: u64,
    /// Reverse link (the server's datagrams: its ACKs): bytes delivered.
    pub rev_delivered_bytes: u64,
    /// Reverse link: datagrams its full queue dropped.
    pub rev_queue_drops: u64,
    /// Forward link: how long the datagrams it delivered waited in the bottleneck's queue,
    /// a histogram of 100 µs buckets (the last bucket holds all longer waits).
    pub fwd_queue_delay_hist: Vec<u64>,
    /// Datagrams the server's receive buffer dropped (with [`Scenario::server_receiver`]).
    pub server_os_drops: u64,
    /// Bytes the server received per 100 ms of virtual time (goodput trace, all clients).
    pub server_rx_trace: Vec<u64>,
    /// Every client: the scenario's own first, then `extra_clients` in order.
    pub clients: Vec<ClientResult>,
    /// Each of `tcp_flows`, then each of `bbr_flows`: data bytes delivered per 100 ms of
    /// virtual time.
    pub tcp_rx_trace: Vec<Vec<u64>>,
    /// Each of `tcp_flows`, then each of `bbr_flows`: how many loss events it had (CUBIC cut
    /// its window for each; BBR only counts them).
    pub tcp_loss_events: Vec<u64>,
    /// The short flows ([`Scenario::short_flows`]): data bytes delivered per 100 ms, all
    /// flows together.
    pub short_rx_trace: Vec<u64>,
    /// Short flows started.
    pub short_flows_started: u64,
    /// Short flows finished (all their bytes delivered and acknowledged).
    pub short_flows_finished: u64,
    /// Data bytes the short flows that started had to send.
    pub short_offered_bytes: u64,
}

impl SimResult {
    /// The median time the forward link's datagrams waited in its queue, ms.
    pub fn fwd_queue_delay_median_ms(&self) -> f64 {
        let total: u64 = self.fwd_queue_delay_hist.iter().sum();
        let mut acc = 0;
        let bucket = self
            .fwd_queue_delay_hist
            .iter()
            .position(|&n| {
                acc += n;
                acc * 2 >= total
            })
            .unwrap_or(0);
        // 100 µs buckets.
        bucket as f64 * 0.1
    }
}

/// splitmix64: deterministic, dependency-free randomness for the network model.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator whose stream is fixed by `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x5DEE_CE66_D1CE_4E5B)
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub(crate) fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
}

/// When a busy host holds everything: windows of `len` µs, their starts spaced uniformly
/// between half and one and a half `every` apart (`every` 0: never).
#[derive(Debug, Clone)]
struct Stalls {
    every: u64,
    len: u64,
    /// The current or next window, [start, end) µs.
    cur: (u64, u64),
}

impl Stalls {
    fn new(every: u64, len: u64) -> Self {
        Stalls {
            every,
            len,
            cur: (0, 0),
        }
    }

    /// The window `t` falls in, if any.
    fn stalled_in(&mut self, t: u64, rng: &mut Rng) -> Option<(u64, u64)> {
        if self.every == 0 || self.len == 0 {
            return None;
        }
        while t >= self.cur.1 {
            self.cur.0 = self.cur.1 + self.every / 2 + rng.next_u64() % self.every;
            self.cur.1 = self.cur.0 + self.len;
        }
        (t >= self.cur.0).then_some(self.cur)
    }
}

/// Buckets of [`SimResult::fwd_queue_delay_hist`]: 100 µs each, up to 2 s.
const QUEUE_DELAY_BUCKETS: usize = 20_000;

struct Link {
    p: LinkParams,
    stalls: Stalls,
    busy_until: u64,
    /// The latest arrival time handed out (a burst after a stall keeps FIFO order).
    last_at: u64,
    delivered: u64,
    delivered_bytes: u64,
    queue_drops: u64,
    random_losses: u64,
    aqm_drops: u64,
    policer_drops: u64,
    too_big_drops: u64,
    /// Queueing delay of delivered datagrams, per 100 µs.
    queue_delay_hist: Vec<u64>,
    codel: Option<codel::CoDel>,
    policer: Option<policer::Policer>,
    jitter: Option<jitter::Jitter>,
    burst_loss: Option<gilbert::Channel>,
    /// Random numbers of the models above, apart from the shared stream so that turning
    /// one on leaves every other random choice as it was.
    model_rng: Rng,
    /// Where the aggregation's release slots fall within `aggregate_us`.
    aggregate_phase: u64,
}

impl Link {
    fn new(p: &LinkParams, seed: u64) -> Self {
        let mut model_rng = Rng::new(seed ^ 0x4c49_4e4b_0000);
        let aggregate_phase = match p.aggregate_us {
            0 => 0,
            n => model_rng.next_u64() % n,
        };
        Link {
            p: p.clone(),
            stalls: Stalls::new(p.stall_every_us, p.stall_us),
            busy_until: 0,
            last_at: 0,
            delivered: 0,
            delivered_bytes: 0,
            queue_drops: 0,
            random_losses: 0,
            aqm_drops: 0,
            policer_drops: 0,
            too_big_drops: 0,
            queue_delay_hist: Vec::new(),
            codel: p.aqm.map(codel::CoDel::new),
            policer: p.policer.map(policer::Policer::new),
            jitter: p.jitter.map(jitter::Jitter::new),
            burst_loss: p.burst_loss.map(gilbert::Channel::new),
            model_rng,
            aggregate_phase,
        }
    }

    /// Arrival times for a datagram entering the link at `now` (empty = dropped).
    fn send(&mut self, now: u64, len: usize, rng: &mut Rng) -> Vec<u64> {
        if self.p.mtu.is_some_and(|m| len > m) {
            self.too_big_drops += 1;
            return vec![];
        }
        if let Some(pol) = &mut self.policer {
            if !pol.pass(now, len as u64) {
                self.policer_drops += 1;
                return vec![];
            }
        }
        if let Some(rate) = self.p.rate {
            let backlog = self.busy_until.saturating_sub(now) * rate / 1_000_000;
            if backlog + len as u64 > self.p.queue_bytes {
                self.queue_drops += 1;
                return vec![];
            }
            // When it reaches the head of the queue and starts on the wire.
            let start = self.busy_until.max(now);
            if let Some(codel) = &mut self.codel {
                if now >= self.busy_until {
                    codel.on_empty();
                }
                if codel.drop_at_dequeue(start, start - now) {
                    self.aqm_drops += 1;
                    return vec![];
                }
            }
            let bucket = ((start - now) / 100) as usize;
            let bucket = bucket.min(QUEUE_DELAY_BUCKETS - 1);
            if self.queue_delay_hist.len() <= bucket {
                self.queue_delay_hist.resize(bucket + 1, 0);
            }
            self.queue_delay_hist[bucket] += 1;
            self.busy_until = start + (len as u64 * 1_000_000).div_ceil(rate);
        } else {
            self.busy_until = now;
        }
        if rng.chance(self.p.loss) {
            self.random_losses += 1;
            return vec![];
        }
        if let Some(ch) = &mut self.burst_loss {
            if ch.lose(&mut self.model_rng) {
                self.random_losses += 1;
                return vec![];
            }
        }
        self.delivered += 1;
        self.delivered_bytes += len as u64;
        let mut at = self.busy_until + self.p.delay_us;
        if let Some(j) = &mut self.jitter {
            at = j.arrival(at, &mut self.model_rng);
        }
        if let Some((start, end)) = self.stalls.stalled_in(at, rng) {
            at = match self.p.stall_release_speedup {
                0 => end,
                n => end + (at - start) / n,
            };
        }
        if self.p.stall_release_speedup > 0 {
            at = at.max(self.last_at);
            self.last_at = at;
        }
        if rng.chance(self.p.reorder) {
            at += self.p.reorder_us;
        }
        let mut v = vec![at];
        if rng.chance(self.p.duplicate) {
            v.push(at + 1 + rng.next_u64() % 1000);
        }
        if self.p.aggregate_us > 0 {
            for at in &mut v {
                *at = jitter::aggregate(*at, self.p.aggregate_us, self.aggregate_phase);
            }
        }
        v
    }
}

/// Where a datagram on the simulated wire is going.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dest {
    /// To the server host, from client `n`.
    Server(usize),
    /// Through the server's receive buffer to its application, from client `n`; when it
    /// reached the buffer (the kernel's receive timestamp), µs.
    ServerApp(usize, u64),
    /// To client `n`; and to it once its host runs again, with when it reached the host
    /// (the kernel's receive timestamp), µs.
    Client(usize),
    ClientLate(usize, u64),
    /// TCP flow `n`'s segment `seq` to its receiver, and the acknowledgment of it back.
    TcpData(usize, u64),
    TcpAck(usize, u64),
    /// The same for short flow `n`.
    ShortData(u64, u64),
    ShortAck(u64, u64),
}

/// Both directions of the simulated wire and the datagrams on it.
struct Net {
    rng: Rng,
    /// [client → server, server → client], shared by all clients
    links: [Link; 2],
    /// The server's receive buffer (see [`ReceiverParams`]), its size and the bytes in it.
    socket: Option<Link>,
    socket_size: u64,
    socket_bytes: u64,
    /// Bytes the application has read that the buffer still counts as held. Linux releases
    /// what a UDP reader takes in batches, a quarter of the buffer at a time unless it empties
    /// (`udp_rmem_release`); the fill it reports and drops by runs ahead by up to that.
    socket_deficit: u64,
    /// (arrival µs, seq), earliest first
    wire: BinaryHeap<Reverse<(u64, u64)>>,
    /// seq → (destination, bytes, corrupted)
    inflight: HashMap<u64, (Dest, Vec<u8>, bool)>,
    seq: u64,
}

impl Net {
    /// Datagrams from clients still on their way to the server (or in its socket buffer).
    fn bound_for_server(&self) -> bool {
        self.inflight
            .values()
            .any(|(to, ..)| matches!(to, Dest::Server(_) | Dest::ServerApp(..)))
    }

    /// Put a datagram on the wire towards `to`: the link may drop, delay, duplicate or
    /// corrupt it.
    fn put(&mut self, to: Dest, now: u64, d: &[u8]) {
        let link = if matches!(to, Dest::Client(_)) { 1 } else { 0 };
        if let Dest::TcpData(..) | Dest::ShortData(..) = to {
            for at in self.links[0].send(now, tcp::WIRE_BYTES, &mut self.rng) {
                self.push(at, to, Vec::new(), false);
            }
            return;
        }
        let corrupt = self.links[link].p.corrupt;
        for at in self.links[link].send(now, d.len() + 28, &mut self.rng) {
            let mut d = d.to_vec();
            let bad = self.rng.chance(corrupt);
            if bad {
                let bit = self.rng.next_u64() as usize % (d.len() * 8);
                d[bit / 8] ^= 1 << (bit % 8);
            }
            self.push(at, to, d, bad);
        }
    }

    /// The buffer's fill as the kernel counts it.
    fn socket_fill(&self) -> u64 {
        self.socket_bytes + self.socket_deficit
    }

    /// The application took a datagram of `len` bytes (with overhead) from the buffer.
    fn dequeue_at_server(&mut self, len: u64) {
        self.socket_bytes -= len;
        self.socket_deficit += len;
        if self.socket_deficit >= self.socket_size / 4 || self.socket_bytes == 0 {
            self.socket_deficit = 0;
        }
    }

    fn push(&mut self, at: u64, to: Dest, d: Vec<u8>, bad: bool) {
        self.seq += 1;
        self.inflight.insert(self.seq, (to, d, bad));
        self.wire.push(Reverse((at, self.seq)));
    }

    /// A datagram reached the server host: into its receive buffer, to be taken by the
    /// application later (false: the buffer was full, the kernel dropped it).
    fn enqueue_at_server(&mut self, now: u64, from: usize, d: Vec<u8>, bad: bool) -> bool {
        let Some(sock) = &mut self.socket else {
            unreachable!("only with a receiver model");
        };
        let len = d.len() as u64 + 28;
        if self.socket_bytes + self.socket_deficit + len > self.socket_size {
            return false;
        }
        match sock.send(now, len as usize, &mut self.rng).first() {
            Some(&at) => {
                self.socket_bytes += len;
                self.push(at, Dest::ServerApp(from, now), d, bad);
                true
            }
            None => false,
        }
    }
}

#[derive(Default)]
struct MemFiles {
    /// xfer → contents being sent
    out: HashMap<XferId, Vec<u8>>,
    /// xfer → buffer being received
    inc: HashMap<XferId, Vec<u8>>,
    /// A disk slower than the network behind the received files, if any.
    disk: Option<Disk>,
    /// A disk that reads the files sent at this rate (bytes/s), if any: when each file's
    /// first read came, µs, the time now, and whether a read found its bytes not read yet.
    read_rate: Option<u64>,
    read_from: HashMap<XferId, u64>,
    now_us: u64,
    read_blocked: bool,
}

/// A disk behind a write queue, as the driver's write-behind: what is queued drains at the
/// disk's rate; a block that does not fit is refused (see `BlockSink::ready`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DiskParams {
    /// What the disk writes, bytes/s.
    pub rate: u64,
    /// The write queue in front of it, bytes.
    pub queue_bytes: u64,
}

struct Disk {
    p: DiskParams,
    queued: u64,
    /// Virtual time the queue was last drained to, µs.
    at_us: u64,
}

impl Disk {
    fn drain(&mut self, now_us: u64) {
        let done =
            (now_us.saturating_sub(self.at_us) as u128 * self.p.rate as u128 / 1_000_000) as u64;
        if done > 0 {
            self.queued = self.queued.saturating_sub(done);
            self.at_us = now_us;
        }
        if self.queued == 0 {
            self.at_us = now_us;
        }
    }
}

/// How often a server waiting for its disk to read looks again, µs of virtual time.
const READ_POLL_US: u64 = 500;

impl MemFiles {
    fn with_disks(p: Option<DiskParams>, read_rate: Option<u64>) -> Self {
        MemFiles {
            disk: p.map(|p| Disk {
                p,
                queued: 0,
                at_us: 0,
            }),
            read_rate,
            ..MemFiles::default()
        }
    }

    /// The disks as of `now_us`.
    fn tick(&mut self, now_us: u64) {
        if let Some(d) = &mut self.disk {
            d.drain(now_us);
        }
        self.now_us = now_us;
        self.read_blocked = false;
    }
}

/// [`StorageError::PastEnd`] for `len` bytes at `offset` of the `size` bytes of a file.
fn past_end(offset: u64, len: usize, size: usize) -> StorageError {
    StorageError::PastEnd {
        offset,
        len: len as u64,
        size: size as u64,
    }
}

impl BlockSource for MemFiles {
    fn read(&mut self, xfer: XferId, offset: u64, buf: &mut [u8]) -> Result<(), StorageError> {
        let f = self.out.get(&xfer).ok_or(StorageError::NotOpen)?;
        if let Some(rate) = self.read_rate {
            let from = *self.read_from.entry(xfer).or_insert(self.now_us);
            let read = (self.now_us - from) as u128 * rate as u128 / 1_000_000;
            if (offset + buf.len() as u64) as u128 > read {
                self.read_blocked = true;
                return Err(StorageError::NotReady);
            }
        }
        let o = offset as usize;
        let src = f
            .get(o..o + buf.len())
            .ok_or_else(|| past_end(offset, buf.len(), f.len()))?;
        buf.copy_from_slice(src);
        Ok(())
    }
}

impl BlockSink for MemFiles {
    fn write(&mut self, xfer: XferId, offset: u64, data: &[u8]) -> Result<(), StorageError> {
        let f = self.inc.get_mut(&xfer).ok_or(StorageError::NotOpen)?;
        let o = offset as usize;
        let size = f.len();
        f.get_mut(o..o + data.len())
            .ok_or_else(|| past_end(offset, data.len(), size))?
            .copy_from_slice(data);
        if let Some(d) = &mut self.disk {
            d.queued += data.len() as u64;
        }
        Ok(())
    }

    fn ready(&mut self, _xfer: XferId) -> bool {
        // As the driver's write-behind: an empty queue always takes a block.
        self.disk
            .as_ref()
            .is_none_or(|d| d.queued == 0 || d.queued < d.p.queue_bytes)
    }

    fn room(&self) -> Option<u64> {
        // As the driver's part files: a window only once the queue is half taken.
        self.disk
            .as_ref()
            .filter(|d| 2 * d.queued > d.p.queue_bytes)
            .map(|d| d.p.queue_bytes.saturating_sub(d.queued))
    }
}

/// One client of the simulation and the application around it.
struct Client {
    spec: ClientSpec,
    /// Its host's stalls, with their own random numbers (the network's stay as they were).
    stalls: Stalls,
    stall_rng: Rng,
    /// Waiting for its host to wake it (see [`ClientSpec::wake_late_us`]): until when, and
    /// how late this wake-up is.
    asleep: Option<(u64, u64)>,
    addr: SocketAddr,
    /// `None` until its start time.
    conn: Option<Connection>,
    files: MemFiles,
    /// Transfers not finished yet: xfer → path.
    pending: BTreeMap<XferId, String>,
    incoming_paths: HashMap<XferId, String>,
    bye: bool,
    /// Its session ended; it is no longer driven.
    done: bool,
    res: ClientResult,
    /// Seeds its cid, handshake random and key, so a run repeats exactly.
    key_seed: u64,
}

impl Client {
    fn start(&mut self, now: Instant) {
        let mut conn = Connection::client_with_rng(
            self.spec.config.clone(),
            &self.spec.psk,
            AddrFamily::V4,
            now,
            &mut KeyRng::seeded(self.key_seed),
        );
        if self.spec.cc_trace {
            conn.enable_cc_trace();
        }
        if let Some(p) = &self.spec.cc_params {
            conn.set_adaptive_params(p.clone());
        }
        for (path, data) in &self.spec.uploads {
            let x = conn.send_file(path, data.len() as u64, 0o644, 0);
            self.files.out.insert(x, data.clone());
            self.pending.insert(x, path.clone());
        }
        for path in self
            .spec
            .downloads
            .iter()
            .map(|(p, _)| p)
            .chain(&self.spec.missing_downloads)
        {
            let x = conn.request(path);
            self.pending.insert(x, path.clone());
        }
        self.conn = Some(conn);
    }

    /// The end of the host stall `now` falls in, or of the wait for the host to wake it,
    /// if any.
    fn stalled(&mut self, now: u64) -> Option<u64> {
        if let Some(end) = self
            .stalls
            .stalled_in(now, &mut self.stall_rng)
            .map(|(_, end)| end)
        {
            return Some(end);
        }
        match self.asleep {
            Some((end, _)) if now < end => Some(end),
            _ => {
                self.asleep = None;
                None
            }
        }
    }

    /// Its turn is over: on a host that wakes it late, it sleeps until `deadline` (its next
    /// timer, µs) or a datagram, and that much later.
    fn sleep(&mut self, deadline: Option<u64>) {
        if self.spec.wake_late_us == 0 {
            return;
        }
        let late = self.stall_rng.next_u64() % (2 * self.spec.wake_late_us + 1);
        self.asleep = Some((deadline.map_or(u64::MAX, |t| t.saturating_add(late)), late));
    }

    /// A datagram arrived at `now`: a sleeping client is woken, late.
    fn woken(&mut self, now: u64) {
        if let Some((end, late)) = &mut self.asleep {
            *end = (*end).min(now + *late);
        }
    }

    /// The connection, while it is being driven.
    fn active(&mut self) -> Option<&mut Connection> {
        if self.done {
            None
        } else {
            self.conn.as_mut()
        }
    }

    /// Application logic: accept downloads, check them, note results.
    fn on_events(&mut self, now: u64) {
        let Some(conn) = self.conn.as_mut().filter(|_| !self.done) else {
            return;
        };
        while let Some(ev) = conn.poll_event() {
            match ev {
                Event::Connected => {
                    self.res.mtu = conn.mtu();
                    self.res.connected_us.get_or_insert(now);
                }
                Event::Offered {
                    xfer, path, size, ..
                } => {
                    self.files.inc.insert(xfer, vec![0; size as usize]);
                    self.incoming_paths.insert(xfer, path);
                    conn.accept(xfer, &[]);
                }
                Event::IncomingComplete { xfer, blake3 } => {
                    let data = self.files.inc.remove(&xfer).unwrap_or_default();
                    let ok = *blake3::hash(&data).as_bytes() == blake3;
                    let path = self.incoming_paths.remove(&xfer).unwrap_or_default();
                    if ok {
                        self.res.files.insert(path, data);
                        conn.finish_incoming(xfer, Ok(blake3));
                        self.pending.remove(&xfer);
                    } else {
                        conn.finish_incoming(xfer, Err("hash mismatch".into()));
                        self.res.error = Some(format!("download {path}: hash mismatch"));
                    }
                }
                Event::OutgoingDone { xfer, result } => {
                    let path = self.pending.remove(&xfer).unwrap_or_default();
                    if let Err(e) = result {
                        self.res.rejected.push((path, e));
                    }
                }
                Event::Rejected { xfer, reason } => {
                    let path = self.pending.remove(&xfer).unwrap_or_default();
                    self.res.rejected.push((path, reason));
                }
                Event::IncomingFailed { reason, .. } => self.res.error = Some(reason),
                Event::Skipped { xfer, .. } => {
                    self.pending.remove(&xfer);
                }
                Event::GetRequested { .. }
                | Event::MetaRequested { .. }
                | Event::MetaReplied { .. }
                | Event::Placed { .. }
                | Event::TunnelRequested { .. }
                | Event::TunnelAnswered { .. }
                | Event::Bye => {}
                Event::Closed { error } => {
                    if error.is_some() {
                        self.res.error = error;
                    }
                }
            }
        }
        if self.pending.is_empty() && !self.bye && conn.is_established() {
            conn.bye();
            self.bye = true;
        }
    }

    /// Fill the pacing and RTT traces up to `now`.
    fn sample(&mut self, now: u64) {
        let Some(conn) = self.conn.as_ref().filter(|_| !self.done) else {
            return;
        };
        let bucket = (now / 100_000) as usize;
        if self.res.pace_trace.len() <= bucket {
            let s = conn.stats();
            self.res.pace_trace.resize(bucket + 1, s.pacing_rate);
            self.res.srtt_trace.resize(bucket + 1, s.srtt_us);
        }
    }

    /// Stop driving it once its session is over.
    fn check_done(&mut self, now: u64) {
        let bye = self.bye;
        if self
            .active()
            .is_some_and(|c| c.is_closed() || (c.is_draining() && bye))
        {
            self.finish(now);
        }
    }

    fn finish(&mut self, now: u64) {
        self.done = true;
        self.res.end_us = now;
        if let Some(conn) = self.conn.as_mut() {
            while let Some(ev) = conn.poll_event() {
                if let Event::Closed { error: Some(e) } = ev {
                    self.res.error.get_or_insert(e);
                }
            }
            self.res.stats = conn.stats();
            self.res.cc_trace = conn.take_cc_trace();
            self.res.measured = conn.rate_controller().measured();
        }
    }
}

/// Add `bytes` to the 100 ms bucket of `now`, growing the trace up to it.
fn trace_add(trace: &mut Vec<u64>, now: u64, bytes: u64) {
    let bucket = (now / 100_000) as usize;
    if trace.len() <= bucket {
        trace.resize(bucket + 1, 0);
    }
    trace[bucket] += bytes;
}

/// Run a scenario to completion (or its time limit).
pub fn run(sc: &Scenario) -> SimResult {
    let base = Instant::now();
    let at = |us: u64| base + Duration::from_micros(us);
    let us_of = |i: Instant| i.saturating_duration_since(base).as_micros() as u64;
    let mut net = Net {
        rng: Rng::new(sc.seed),
        links: [
            Link::new(&sc.forward, sc.seed),
            Link::new(&sc.reverse, sc.seed ^ 1),
        ],
        // The buffer's fill is `socket_bytes`: a stalled application holds datagrams the
        // link's own queue no longer counts.
        socket: sc.server_receiver.as_ref().map(|r| {
            Link::new(
                &LinkParams {
                    delay_us: 0,
                    rate: Some(r.rate),
                    queue_bytes: u64::MAX,
                    stall_every_us: r.stall_every_us,
                    stall_us: r.stall_us,
                    stall_release_speedup: r.catch_up,
                    ..LinkParams::default()
                },
                sc.seed ^ 2,
            )
        }),
        socket_size: sc.server_receiver.as_ref().map_or(0, |r| r.buffer_bytes),
        socket_bytes: 0,
        socket_deficit: 0,
        wire: BinaryHeap::new(),
        inflight: HashMap::new(),
        seq: 0,
    };
    // The cross traffic's random numbers: a stream of their own, so that adding it leaves
    // every other random choice as it was.
    let cross_rng = |n: u64| Rng::new(sc.seed ^ 0x4352_4f53_5300 ^ (n << 40));
    let mut tcps: Vec<Tcp> = sc
        .tcp_flows
        .iter()
        .cloned()
        .map(Tcp::new)
        .chain(
            sc.bbr_flows
                .iter()
                .enumerate()
                .map(|(n, s)| Tcp::bbr(s.clone(), cross_rng(n as u64 + 1))),
        )
        .collect();
    let mut onoff = sc
        .short_flows
        .clone()
        .map(|s| onoff::Generator::new(s, cross_rng(0)));
    // The short flows running, by number.
    let mut shorts: BTreeMap<u64, Tcp> = BTreeMap::new();
    let mut short_next = 0u64;
    let mut steps = sc.forward_steps.clone();
    let mut end_us = None;
    steps.sort_by_key(|s| Reverse(s.at_us));

    let mut clients: Vec<Client> = std::iter::once(sc.own_client())
        .chain(sc.extra_clients.iter().cloned())
        .enumerate()
        .map(|(n, spec)| Client {
            addr: SocketAddr::from(([10, 0, (n >> 8) as u8, n as u8 + 1], 40000)),
            res: ClientResult {
                start_us: spec.start_us,
                ..ClientResult::default()
            },
            stalls: Stalls::new(spec.stall_every_us, spec.stall_us),
            stall_rng: Rng::new(sc.seed ^ 0x5354_414c_4c00 ^ n as u64),
            asleep: None,
            spec,
            conn: None,
            files: MemFiles::default(),
            pending: BTreeMap::new(),
            incoming_paths: HashMap::new(),
            bye: false,
            done: false,
            key_seed: sc.seed ^ 0x4b45_5900 ^ ((n as u64) << 32),
        })
        .collect();
    let mut order_rng = Rng::new(sc.seed ^ 0x4f52_4445_5200);
    let by_addr: HashMap<SocketAddr, usize> = clients
        .iter()
        .enumerate()
        .map(|(n, c)| (c.addr, n))
        .collect();
    let mut server = Endpoint::with_rng(
        sc.psk.clone(),
        sc.server.clone(),
        base,
        KeyRng::seeded(sc.seed ^ 0x5345_5256),
    );
    // Per server connection: its files, and the paths of what it receives.
    let mut sfiles: HashMap<Cid, MemFiles> = HashMap::new();
    let mut server_paths: HashMap<(Cid, XferId), String> = HashMap::new();
    let mut server_store: HashMap<String, Vec<u8>> = clients
        .iter()
        .flat_map(|c| c.spec.downloads.iter().cloned())
        .collect();
    let mut res = SimResult::default();
    let mut sim_error = None;
    let mut os_drops = 0u64;
    let mut now = 0u64;
    let mut buf = vec![0u8; 65536];

    loop {
        for c in clients.iter_mut() {
            if c.conn.is_none() && c.spec.start_us <= now {
                c.start(at(now));
            }
            c.sample(now);
        }
        // Deliver everything due.
        while let Some(Reverse((t, s))) = net.wire.peek().copied() {
            if t > now {
                break;
            }
            net.wire.pop();
            let (to, mut d, bad) = net.inflight.remove(&s).expect("queued");
            match to {
                Dest::Server(from) if net.socket.is_some() => {
                    if !net.enqueue_at_server(now, from, d, bad) {
                        os_drops += 1;
                    }
                }
                Dest::Server(_) | Dest::ServerApp(..) => {
                    let (from, arrived) = match to {
                        Dest::ServerApp(from, arrived) => {
                            net.dequeue_at_server(d.len() as u64 + 28);
                            (from, arrived)
                        }
                        Dest::Server(from) => (from, now),
                        _ => unreachable!(),
                    };
                    res.corrupted += bad as u64;
                    let cl = &mut clients[from];
                    let got = match server.route(at(now), cl.addr, &d) {
                        Route::Conn(cid) => match server.conn_mut(cid) {
                            Some(c) => {
                                let before = c.stats().data_bytes_received;
                                let files = sfiles.entry(cid).or_insert_with(|| {
                                    MemFiles::with_disks(sc.server_disk, sc.server_read_rate)
                                });
                                files.tick(now);
                                let challenge = server.handle(
                                    cid,
                                    at(now),
                                    at(arrived),
                                    cl.addr,
                                    &mut d,
                                    files,
                                );
                                if let Some(ch) = challenge {
                                    net.put(Dest::Client(from), now, &ch);
                                }
                                let c = server.conn_mut(cid).expect("just handled");
                                c.stats().data_bytes_received.saturating_sub(before)
                            }
                            None => 0,
                        },
                        Route::NewConn(_, reply) | Route::Reply(reply) => {
                            net.put(Dest::Client(from), now, &reply);
                            0
                        }
                        Route::Drop => 0,
                    };
                    trace_add(&mut res.server_rx_trace, now, got);
                    trace_add(&mut cl.res.server_rx_trace, now, got);
                }
                Dest::TcpData(n, seq) => {
                    tcps[n].on_delivered(now);
                    // Acknowledged at once, over a reverse path that neither loses nor queues.
                    let at = now + net.links[1].p.delay_us;
                    net.push(at, Dest::TcpAck(n, seq), Vec::new(), false);
                }
                Dest::TcpAck(n, seq) => tcps[n].on_ack(now, seq),
                Dest::ShortData(n, seq) => {
                    if let (Some(t), Some(g)) = (shorts.get_mut(&n), onoff.as_mut()) {
                        g.on_delivered(now, t.on_delivered(now));
                    }
                    let at = now + net.links[1].p.delay_us;
                    net.push(at, Dest::ShortAck(n, seq), Vec::new(), false);
                }
                Dest::ShortAck(n, seq) => {
                    if let Some(t) = shorts.get_mut(&n) {
                        t.on_ack(now, seq);
                        if t.done() {
                            shorts.remove(&n);
                            if let Some(g) = onoff.as_mut() {
                                g.finished += 1;
                            }
                        }
                    }
                }
                Dest::Client(n) | Dest::ClientLate(n, _) => {
                    let arrived = match to {
                        Dest::ClientLate(_, a) => a,
                        _ => now,
                    };
                    let cl = &mut clients[n];
                    cl.woken(now);
                    if let Some(end) = cl.stalled(now) {
                        // Read when the host runs again, in the order it arrived, stamped
                        // with its arrival as the kernel does (the I/O shell reads that).
                        net.push(end, Dest::ClientLate(n, arrived), d, bad);
                        continue;
                    }
                    if let Some(conn) = cl.conn.as_mut().filter(|_| !cl.done) {
                        // Counted where a connection reads it (a client done reads nothing).
                        res.corrupted += bad as u64;
                        let before = conn.stats().data_bytes_received;
                        conn.handle_datagram_at(at(now), at(arrived), &mut d, &mut cl.files);
                        let got = conn.stats().data_bytes_received.saturating_sub(before);
                        trace_add(&mut cl.res.rx_trace, now, got);
                    }
                }
            }
        }
        while let Some(s) = steps.last() {
            if s.at_us > now {
                break;
            }
            net.links[0].p.rate = s.rate;
            steps.pop();
        }

        // Application logic of both ends.
        for c in clients.iter_mut() {
            c.on_events(now);
        }
        for cid in server.cids() {
            let Some(c) = server.conn_mut(cid) else {
                continue;
            };
            let files = sfiles
                .entry(cid)
                .or_insert_with(|| MemFiles::with_disks(sc.server_disk, sc.server_read_rate));
            while let Some(ev) = c.poll_event() {
                match ev {
                    Event::Offered {
                        xfer, path, size, ..
                    } => {
                        files.inc.insert(xfer, vec![0; size as usize]);
                        server_paths.insert((cid, xfer), path);
                        c.accept(xfer, &[]);
                    }
                    Event::GetRequested { xfer, path, .. } => match server_store.get(&path) {
                        Some(data) => {
                            files.out.insert(xfer, data.clone());
                            c.offer(xfer, &path, data.len() as u64, 0o644, 0);
                        }
                        None => c.reject(xfer, &format!("not found: {path}")),
                    },
                    Event::IncomingComplete { xfer, blake3 } => {
                        let data = files.inc.remove(&xfer).unwrap_or_default();
                        let path = server_paths.remove(&(cid, xfer)).unwrap_or_default();
                        if *blake3::hash(&data).as_bytes() == blake3 {
                            server_store.insert(path.clone(), data.clone());
                            res.server_files.insert(path, data);
                            res.server_verified_us = now;
                            c.finish_incoming(xfer, Ok(blake3));
                        } else {
                            c.finish_incoming(xfer, Err("hash mismatch".into()));
                        }
                    }
                    Event::Closed { error } => res.server_closed.push(error),
                    Event::OutgoingDone { result: Ok(_), .. } => res.server_heard_verified += 1,
                    _ => {}
                }
            }
        }

        // Timers, then everything each side wants to send. Clients that send at the same
        // instant take turns going first: in a fixed order the first always took the last
        // place in a full queue, and the others every drop (a 10 ms path with a 1 ms
        // buffer: the second of two flows lost 1 % of its datagrams, the first none).
        let first = order_rng.next_u64() as usize % clients.len();
        for n in (first..clients.len()).chain(0..first) {
            let cl = &mut clients[n];
            if cl.stalled(now).is_some() {
                continue;
            }
            let Some(conn) = cl.conn.as_mut().filter(|_| !cl.done) else {
                continue;
            };
            if conn.poll_timeout(at(now)).is_some_and(|t| us_of(t) <= now) {
                conn.handle_timeout(at(now));
            }
            while let Some(len) = conn.poll_transmit(at(now), &mut buf, &mut cl.files) {
                net.put(Dest::Server(n), now, &buf[..len]);
            }
            let deadline = conn.poll_timeout(at(now)).map(|t| us_of(t).max(now + 1));
            cl.sleep(deadline);
        }
        for (n, t) in tcps.iter_mut().enumerate() {
            if t.next_timer().is_some_and(|at| at <= now) {
                t.on_timer(now);
            }
            for seq in t.poll_send(now) {
                net.put(Dest::TcpData(n, seq), now, &[]);
            }
        }
        if let Some(g) = onoff.as_mut() {
            for size in g.poll_start(now) {
                shorts.insert(short_next, Tcp::short(now, size));
                short_next += 1;
            }
        }
        for (&n, t) in shorts.iter_mut() {
            if t.next_timer().is_some_and(|at| at <= now) {
                t.on_timer(now);
            }
            for seq in t.poll_send(now) {
                net.put(Dest::ShortData(n, seq), now, &[]);
            }
        }
        for cid in server.cids() {
            let to = server.conn_addr(cid).and_then(|a| by_addr.get(&a).copied());
            let Some(c) = server.conn_mut(cid) else {
                continue;
            };
            let files = sfiles
                .entry(cid)
                .or_insert_with(|| MemFiles::with_disks(sc.server_disk, sc.server_read_rate));
            files.tick(now);
            if net.socket.is_some() || files.disk.is_some() {
                c.set_receiver_state(ReceiverState {
                    buffered: net.socket_fill(),
                    buffer: net.socket_size,
                    os_drops,
                    store_room: files.room(),
                });
            }
            if c.poll_timeout(at(now)).is_some_and(|t| us_of(t) <= now) {
                c.handle_timeout(at(now));
            }
            let files = sfiles
                .entry(cid)
                .or_insert_with(|| MemFiles::with_disks(sc.server_disk, sc.server_read_rate));
            while let Some(n) = c.poll_transmit(at(now), &mut buf, files) {
                if let Some(to) = to {
                    net.put(Dest::Client(to), now, &buf[..n]);
                }
            }
            if let Some(to) = to {
                // A client whose hello was answered late may have a second, unused session
                // (its earlier hello's): report the one that carried the traffic.
                let st = c.stats();
                let kept = &mut clients[to].res.server;
                if st.packets_received >= kept.packets_received {
                    *kept = st;
                }
            }
        }
        server.reap(at(now));

        for cl in clients.iter_mut() {
            cl.check_done(now);
        }
        if clients.iter().all(|c| c.done) {
            end_us.get_or_insert(now);
            if !net.bound_for_server() {
                break;
            }
        }
        // Advance virtual time to the next thing that happens.
        let mut next = u64::MAX;
        if let Some(Reverse((t, _))) = net.wire.peek() {
            next = next.min(*t);
        }
        for cl in clients.iter_mut() {
            if cl.conn.is_none() {
                next = next.min(cl.spec.start_us);
            } else if let Some(end) = cl.stalled(now) {
                next = next.min(end);
            } else if let Some(t) = cl.active().and_then(|c| c.poll_timeout(at(now))) {
                next = next.min(us_of(t).max(now + 1));
            }
        }
        for cid in server.cids() {
            if let Some(t) = server.conn_mut(cid).and_then(|c| c.poll_timeout(at(now))) {
                next = next.min(us_of(t).max(now + 1));
            }
            // A read-ahead thread would wake the loop once the disk has read on.
            if sfiles.get(&cid).is_some_and(|f| f.read_blocked) {
                next = next.min(now + READ_POLL_US);
            }
        }
        if let Some(s) = steps.last() {
            next = next.min(s.at_us);
        }
        for t in tcps.iter().chain(shorts.values()) {
            if let Some(at) = t.next_timer() {
                next = next.min(at.max(now + 1));
            }
        }
        if let Some(at) = onoff.as_ref().and_then(onoff::Generator::next_start) {
            next = next.min(at.max(now + 1));
        }
        if next == u64::MAX {
            sim_error = Some("simulation stalled: nothing left to do".to_string());
            break;
        }
        if next > sc.limit_us {
            sim_error = Some("simulation time limit reached".to_string());
            break;
        }
        now = next.max(now);
    }
    res.endpoint = server.stats().clone();
    res.elapsed_us = end_us.unwrap_or(now);
    res.fwd_delivered = net.links[0].delivered;
    res.fwd_queue_drops = net.links[0].queue_drops;
    res.rev_delivered_bytes = net.links[1].delivered_bytes;
    res.rev_queue_drops = net.links[1].queue_drops;
    res.fwd_random_losses = net.links[0].random_losses;
    res.fwd_aqm_drops = net.links[0].aqm_drops;
    res.fwd_policer_drops = net.links[0].policer_drops;
    res.fwd_queue_delay_hist = std::mem::take(&mut net.links[0].queue_delay_hist);
    res.server_os_drops = os_drops;
    for t in tcps {
        res.tcp_loss_events.push(t.loss_events);
        res.tcp_rx_trace.push(t.rx_trace);
    }
    if let Some(g) = onoff {
        res.short_rx_trace = g.rx_trace;
        res.short_flows_started = g.started;
        res.short_flows_finished = g.finished;
        res.short_offered_bytes = g.offered;
    }
    let mut all_ok = true;
    for mut cl in clients {
        if !cl.done {
            cl.finish(now);
        }
        cl.res.ok = cl.res.error.is_none() && cl.res.rejected.is_empty() && cl.pending.is_empty();
        all_ok &= cl.res.ok;
        if res.error.is_none() {
            res.error.clone_from(&cl.res.error);
        }
        res.rejected.extend(cl.res.rejected.iter().cloned());
        res.clients.push(cl.res);
    }
    if res.error.is_none() {
        res.error = sim_error;
    }
    let own = &mut res.clients[0];
    res.client = own.stats.clone();
    res.server = own.server.clone();
    res.client_files = std::mem::take(&mut own.files);
    res.ok = res.error.is_none() && all_ok;
    res
}
