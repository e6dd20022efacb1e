//! A simulated network for whole sessions in virtual time: loss, reordering, duplication,
//! bit corruption, delay, a bottleneck rate with a tail-drop queue. Both ends run the real
//! [`Connection`]/[`Endpoint`] code with real crypto; only time and the wire are simulated,
//! so a 30 %-loss transfer over a 200 ms path finishes in milliseconds of real time.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::cc::RateConfig;
use crate::conn::{BlockSink, BlockSource, Config, Connection, Event};
use crate::crypto::Psk;
use crate::endpoint::{Endpoint, Route};
use crate::transfer::XferId;
use crate::wire::AddrFamily;

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
    pub reorder_us: u64,
    pub duplicate: f64,
    /// Probability one random bit of a datagram is flipped.
    pub corrupt: f64,
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
        }
    }
}

/// A rate change of the forward link at a moment in virtual time.
#[derive(Debug, Clone)]
pub struct RateStep {
    pub at_us: u64,
    pub rate: Option<u64>,
}

#[derive(Debug, Clone)]
pub struct Scenario {
    pub seed: u64,
    /// client → server
    pub forward: LinkParams,
    /// server → client
    pub reverse: LinkParams,
    pub forward_steps: Vec<RateStep>,
    pub client: Config,
    pub server: Config,
    /// The server's key; the client uses `client_psk` (normally the same).
    pub psk: Psk,
    pub client_psk: Psk,
    /// Files the client uploads: (remote path, contents).
    pub uploads: Vec<(String, Vec<u8>)>,
    /// Files on the server the client downloads: (path, contents).
    pub downloads: Vec<(String, Vec<u8>)>,
    /// Paths the client asks for that the server does not have.
    pub missing_downloads: Vec<String>,
    /// Give up after this much virtual time.
    pub limit_us: u64,
}

impl Scenario {
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
            limit_us: 120_000_000,
        }
    }
}

#[derive(Debug, Default)]
pub struct SimResult {
    /// Every transfer finished verified, and the session closed normally.
    pub ok: bool,
    pub error: Option<String>,
    pub elapsed_us: u64,
    /// Files as the server holds them after the run (uploads) and the client (downloads).
    pub server_files: HashMap<String, Vec<u8>>,
    pub client_files: HashMap<String, Vec<u8>>,
    pub client: crate::conn::Stats,
    pub server: crate::conn::Stats,
    pub rejected: Vec<(String, String)>,
    pub endpoint: crate::endpoint::EndpointStats,
    /// Corrupted datagrams the simulated wire delivered (both directions).
    pub corrupted: u64,
    /// Forward link: datagrams delivered / dropped by the queue / lost at random.
    pub fwd_delivered: u64,
    pub fwd_queue_drops: u64,
    pub fwd_random_losses: u64,
    /// Bytes the server received per 100 ms of virtual time (goodput trace).
    pub server_rx_trace: Vec<u64>,
}

/// splitmix64: deterministic, dependency-free randomness for the network model.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x5DEE_CE66_D1CE_4E5B)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
}

struct Link {
    p: LinkParams,
    busy_until: u64,
    delivered: u64,
    queue_drops: u64,
    random_losses: u64,
}

impl Link {
    /// Arrival times for a datagram entering the link at `now` (empty = dropped).
    fn send(&mut self, now: u64, len: usize, rng: &mut Rng) -> Vec<u64> {
        if let Some(rate) = self.p.rate {
            let backlog = self.busy_until.saturating_sub(now) * rate / 1_000_000;
            if backlog + len as u64 > self.p.queue_bytes {
                self.queue_drops += 1;
                return vec![];
            }
            self.busy_until = self.busy_until.max(now) + (len as u64 * 1_000_000).div_ceil(rate);
        } else {
            self.busy_until = now;
        }
        if rng.chance(self.p.loss) {
            self.random_losses += 1;
            return vec![];
        }
        self.delivered += 1;
        let mut at = self.busy_until + self.p.delay_us;
        if rng.chance(self.p.reorder) {
            at += self.p.reorder_us;
        }
        let mut v = vec![at];
        if rng.chance(self.p.duplicate) {
            v.push(at + 1 + rng.next_u64() % 1000);
        }
        v
    }
}

/// Both directions of the simulated wire and the datagrams on it.
struct Net {
    rng: Rng,
    /// [client → server, server → client]
    links: [Link; 2],
    /// (arrival µs, seq), earliest first
    wire: BinaryHeap<Reverse<(u64, u64)>>,
    /// seq → (destination, bytes, corrupted)
    inflight: HashMap<u64, (usize, Vec<u8>, bool)>,
    seq: u64,
}

impl Net {
    /// Put a datagram on the wire towards `to` (SERVER or CLIENT): the link may drop,
    /// delay, duplicate or corrupt it.
    fn put(&mut self, to: usize, now: u64, d: &[u8]) {
        let link = &mut self.links[if to == SERVER { 0 } else { 1 }];
        for at in link.send(now, d.len() + 28, &mut self.rng) {
            let mut d = d.to_vec();
            let bad = self.rng.chance(link.p.corrupt);
            if bad {
                let bit = self.rng.next_u64() as usize % (d.len() * 8);
                d[bit / 8] ^= 1 << (bit % 8);
            }
            self.seq += 1;
            self.inflight.insert(self.seq, (to, d, bad));
            self.wire.push(Reverse((at, self.seq)));
        }
    }
}

#[derive(Default)]
struct MemFiles {
    /// xfer → contents being sent
    out: HashMap<XferId, Vec<u8>>,
    /// xfer → buffer being received
    inc: HashMap<XferId, Vec<u8>>,
}

impl BlockSource for MemFiles {
    fn read(&mut self, xfer: XferId, offset: u64, buf: &mut [u8]) -> Result<(), String> {
        let f = self.out.get(&xfer).ok_or("no such transfer")?;
        let o = offset as usize;
        buf.copy_from_slice(f.get(o..o + buf.len()).ok_or("read beyond end")?);
        Ok(())
    }
}

impl BlockSink for MemFiles {
    fn write(&mut self, xfer: XferId, offset: u64, data: &[u8]) -> Result<(), String> {
        let f = self.inc.get_mut(&xfer).ok_or("no such transfer")?;
        let o = offset as usize;
        f.get_mut(o..o + data.len())
            .ok_or("write beyond end")?
            .copy_from_slice(data);
        Ok(())
    }
}

const CLIENT: usize = 0;
const SERVER: usize = 1;

/// Run a scenario to completion (or its time limit).
pub fn run(sc: &Scenario) -> SimResult {
    let base = Instant::now();
    let at = |us: u64| base + Duration::from_micros(us);
    let us_of = |i: Instant| i.saturating_duration_since(base).as_micros() as u64;
    let caddr: SocketAddr = "10.0.0.1:40000".parse().expect("addr");
    let link = |p: &LinkParams| Link {
        p: p.clone(),
        busy_until: 0,
        delivered: 0,
        queue_drops: 0,
        random_losses: 0,
    };
    let mut net = Net {
        rng: Rng::new(sc.seed),
        links: [link(&sc.forward), link(&sc.reverse)],
        wire: BinaryHeap::new(),
        inflight: HashMap::new(),
        seq: 0,
    };
    let mut steps = sc.forward_steps.clone();
    steps.sort_by_key(|s| Reverse(s.at_us));

    let mut client = Connection::client(sc.client.clone(), &sc.client_psk, AddrFamily::V4, base);
    let mut server = Endpoint::new(sc.psk.clone(), sc.server.clone(), base);
    let mut cfiles = MemFiles::default();
    let mut sfiles = MemFiles::default();
    let mut server_store: HashMap<String, Vec<u8>> =
        sc.downloads.iter().cloned().collect::<HashMap<_, _>>();
    let mut incoming_paths: HashMap<(usize, XferId), String> = HashMap::new();
    let mut client_files = HashMap::new();
    let mut res = SimResult::default();

    let mut pending: BTreeMap<XferId, String> = BTreeMap::new();
    for (path, data) in &sc.uploads {
        let x = client.send_file(path, data.len() as u64, 0o644, 0);
        cfiles.out.insert(x, data.clone());
        pending.insert(x, path.clone());
    }
    for path in sc
        .downloads
        .iter()
        .map(|(p, _)| p)
        .chain(&sc.missing_downloads)
    {
        let x = client.request(path);
        pending.insert(x, path.clone());
    }
    let mut bye = false;
    let mut now = 0u64;
    let mut buf = vec![0u8; 65536];
    let mut trace_bucket = 0u64;

    loop {
        // Deliver everything due.
        while let Some(Reverse((t, s))) = net.wire.peek().copied() {
            if t > now {
                break;
            }
            net.wire.pop();
            let (to, mut d, bad) = net.inflight.remove(&s).expect("queued");
            res.corrupted += bad as u64;
            if to == SERVER {
                let before = server_rx(&mut server);
                match server.route(at(now), caddr, &d) {
                    Route::Conn(cid) => {
                        if let Some(c) = server.conn_mut(cid) {
                            c.handle_datagram(at(now), &mut d, &mut sfiles);
                        }
                    }
                    Route::NewConn(_, reply) | Route::Reply(reply) => {
                        net.put(CLIENT, now, &reply);
                    }
                    Route::Drop => {}
                }
                let after = server_rx(&mut server);
                let bucket = now / 100_000;
                while res.server_rx_trace.len() <= bucket as usize {
                    res.server_rx_trace.push(0);
                }
                res.server_rx_trace[bucket as usize] += after.saturating_sub(before);
                trace_bucket = trace_bucket.max(bucket);
            } else {
                client.handle_datagram(at(now), &mut d, &mut cfiles);
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
        while let Some(ev) = client.poll_event() {
            match ev {
                Event::Connected => {}
                Event::Offered {
                    xfer, path, size, ..
                } => {
                    cfiles.inc.insert(xfer, vec![0; size as usize]);
                    incoming_paths.insert((CLIENT, xfer), path);
                    client.accept(xfer, &[]);
                }
                Event::IncomingComplete { xfer, blake3 } => {
                    let data = cfiles.inc.remove(&xfer).unwrap_or_default();
                    let ok = *blake3::hash(&data).as_bytes() == blake3;
                    let path = incoming_paths.remove(&(CLIENT, xfer)).unwrap_or_default();
                    if ok {
                        client_files.insert(path, data);
                        client.finish_incoming(xfer, Ok(blake3));
                        pending.remove(&xfer);
                    } else {
                        client.finish_incoming(xfer, Err("hash mismatch".into()));
                        res.error = Some(format!("download {path}: hash mismatch"));
                    }
                }
                Event::OutgoingDone { xfer, result } => {
                    let path = pending.remove(&xfer).unwrap_or_default();
                    if let Err(e) = result {
                        res.rejected.push((path, e));
                    }
                }
                Event::Rejected { xfer, reason } => {
                    let path = pending.remove(&xfer).unwrap_or_default();
                    res.rejected.push((path, reason));
                }
                Event::IncomingFailed { reason, .. } => res.error = Some(reason),
                Event::GetRequested { .. }
                | Event::Bye
                | Event::Skipped { .. }
                | Event::MetaRequested { .. }
                | Event::MetaReplied { .. } => {}
                Event::Closed { error } => {
                    if error.is_some() {
                        res.error = error;
                    }
                }
            }
        }
        if pending.is_empty() && !bye && client.is_established() {
            client.bye();
            bye = true;
        }
        for cid in server.cids() {
            let Some(c) = server.conn_mut(cid) else {
                continue;
            };
            while let Some(ev) = c.poll_event() {
                match ev {
                    Event::Offered {
                        xfer, path, size, ..
                    } => {
                        sfiles.inc.insert(xfer, vec![0; size as usize]);
                        incoming_paths.insert((SERVER, xfer), path);
                        c.accept(xfer, &[]);
                    }
                    Event::GetRequested { xfer, path, .. } => match server_store.get(&path) {
                        Some(data) => {
                            sfiles.out.insert(xfer, data.clone());
                            c.offer(xfer, &path, data.len() as u64, 0o644, 0);
                        }
                        None => c.reject(xfer, &format!("not found: {path}")),
                    },
                    Event::IncomingComplete { xfer, blake3 } => {
                        let data = sfiles.inc.remove(&xfer).unwrap_or_default();
                        let path = incoming_paths.remove(&(SERVER, xfer)).unwrap_or_default();
                        if *blake3::hash(&data).as_bytes() == blake3 {
                            server_store.insert(path.clone(), data.clone());
                            res.server_files.insert(path, data);
                            c.finish_incoming(xfer, Ok(blake3));
                        } else {
                            c.finish_incoming(xfer, Err("hash mismatch".into()));
                        }
                    }
                    _ => {}
                }
            }
        }

        // Timers, then everything each side wants to send.
        if client
            .poll_timeout(at(now))
            .is_some_and(|t| us_of(t) <= now)
        {
            client.handle_timeout(at(now));
        }
        while let Some(n) = client.poll_transmit(at(now), &mut buf, &mut cfiles) {
            net.put(SERVER, now, &buf[..n]);
        }
        for cid in server.cids() {
            let Some(c) = server.conn_mut(cid) else {
                continue;
            };
            if c.poll_timeout(at(now)).is_some_and(|t| us_of(t) <= now) {
                c.handle_timeout(at(now));
            }
            while let Some(n) = c.poll_transmit(at(now), &mut buf, &mut sfiles) {
                net.put(CLIENT, now, &buf[..n]);
            }
        }
        for cid in server.cids() {
            if let Some(c) = server.conn_mut(cid) {
                res.server = c.stats();
            }
        }
        server.reap(at(now));

        if client.is_closed() || (client.is_draining() && bye) {
            break;
        }
        // Advance virtual time to the next thing that happens.
        let mut next = u64::MAX;
        if let Some(Reverse((t, _))) = net.wire.peek() {
            next = next.min(*t);
        }
        if let Some(t) = client.poll_timeout(at(now)) {
            next = next.min(us_of(t).max(now + 1));
        }
        for cid in server.cids() {
            if let Some(t) = server.conn_mut(cid).and_then(|c| c.poll_timeout(at(now))) {
                next = next.min(us_of(t).max(now + 1));
            }
        }
        if let Some(s) = steps.last() {
            next = next.min(s.at_us);
        }
        if next == u64::MAX {
            res.error
                .get_or_insert_with(|| "simulation stalled: nothing left to do".into());
            break;
        }
        if next > sc.limit_us {
            res.error
                .get_or_insert_with(|| "simulation time limit reached".into());
            break;
        }
        now = next.max(now);
    }
    while let Some(ev) = client.poll_event() {
        if let Event::Closed { error: Some(e) } = ev {
            res.error.get_or_insert(e);
        }
    }
    res.endpoint = server.stats().clone();
    res.elapsed_us = now;
    res.client = client.stats();
    res.client_files = client_files;
    res.fwd_delivered = net.links[0].delivered;
    res.fwd_queue_drops = net.links[0].queue_drops;
    res.fwd_random_losses = net.links[0].random_losses;
    res.ok = res.error.is_none() && res.rejected.is_empty() && pending.is_empty();
    res
}

fn server_rx(ep: &mut Endpoint) -> u64 {
    ep.cids()
        .iter()
        .filter_map(|c| ep.conn_mut(*c).map(|c| c.stats().data_bytes_received))
        .sum()
}
