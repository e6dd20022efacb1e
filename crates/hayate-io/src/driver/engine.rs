//! The event loop, written once. `hayate cp` (the client), `hayate serve` (daemon and
//! `--stdio`) and `hayate perf --hayate` (both sides) all run [`run`]; what differs between
//! them is a [`Policy`]: what to do with a session's events, what to start, when to stop.
//!
//! One turn of the loop:
//! 1. [`Policy::begin`]: stop flags, deadlines, a switch to another link.
//! 2. Receive every waiting datagram ([`Links::recv`]) and feed it to its session: the one
//!    connection of a client, or an [`Endpoint`]'s (hellos, routing by connection id, path
//!    validation; a new session is offered to [`Policy::accept`]).
//! 3. For each session: the receiver state, due timeouts, then every event to
//!    [`Policy::on_event`]; [`Policy::turn`] (start queued work, settle what the workers
//!    finished); transmit what the pacer lets out (the clock read afresh for each datagram:
//!    an ACK says how long data waited here, a send time when it really left);
//!    [`Policy::settle`] (work that must follow a transmit pass).
//! 4. [`Policy::end`] (bookkeeping across sessions, progress, whether to stop), reaping of
//!    closed sessions, then a wait until the earliest deadline or the next datagram.
//!
//! The protocol core never waits on storage: hashing and writing run on worker threads
//! (`verify`, `writeback`), whose results a policy collects in `turn`. Those threads do not
//! wake the loop, so a policy with work outstanding says so and the loop looks again after
//! [`WORKER_POLL`]. Reading runs ahead on reader threads (`readahead`): a block not read yet
//! is `StorageError::NotReady` to the core, and the reader that finishes it wakes the loop
//! (its `LoopWaker`).

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use hayate_proto::wire::Cid;
use hayate_proto::{BlockSink, BlockSource, Connection, Endpoint, Event, ReceiverState, Route};

use super::link::Links;
use super::CcTrace;
use crate::readahead::LoopWaker;

/// How often a loop with work on the worker threads looks for its results.
pub(crate) const WORKER_POLL: Duration = Duration::from_millis(2);
/// While a link's send queue is full, the wait for it to take bytes lasts at least this
/// long (the pacer's deadline would wake the loop at once and find it still full).
const PUSHED_BACK_WAIT: Duration = Duration::from_millis(5);
/// How often `HAYATE_CC_TRACE` lines are written out.
const TRACE_EVERY: Duration = Duration::from_millis(100);

/// The sessions a loop runs.
pub(crate) enum Conns {
    /// A client: one session with one peer; datagrams from anywhere else are ignored.
    One {
        conn: Box<Connection>,
        peer: SocketAddr,
    },
    /// A server: an endpoint's sessions on one socket.
    Many(Box<Endpoint>),
}

/// The loop's state apart from the policy: links, sessions and each session's storage.
pub(crate) struct Net<F> {
    pub links: Links,
    pub conns: Conns,
    /// Each session's storage (its `BlockSource`/`BlockSink`), by connection id.
    pub files: HashMap<Cid, F>,
    traces: HashMap<Cid, CcTrace>,
}

/// One session, as a policy sees it.
pub(crate) struct Session<'a, F> {
    pub cid: Cid,
    pub addr: SocketAddr,
    pub conn: &'a mut Connection,
    pub files: &'a mut F,
}

/// Whether the loop goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flow {
    Go,
    Stop,
}

/// What a client, a server or a probe does with the loop's sessions.
pub(crate) trait Policy {
    /// A session's storage.
    type Files: BlockSource + BlockSink + Default;

    /// The latest the loop wakes up, whatever the sessions' deadlines.
    fn wake_by(&self, now: Instant) -> Instant {
        now + Duration::from_millis(200)
    }
    /// Start of a turn, before receiving.
    fn begin(&mut self, _now: Instant, _net: &mut Net<Self::Files>) -> Flow {
        Flow::Go
    }
    /// Whether datagrams from `from` are looked at at all (a server's endpoint).
    fn admits(&self, _from: SocketAddr) -> bool {
        true
    }
    /// The endpoint accepted a new session; false removes it again, unanswered.
    fn accept(&mut self, _cid: Cid, _conn: &mut Connection, _from: SocketAddr) -> bool {
        true
    }
    /// One event of one session.
    fn on_event(&mut self, s: &mut Session<'_, Self::Files>, ev: Event, now: Instant);
    /// After a session's events, before it transmits. True while the worker threads hold
    /// work of this session that the loop must collect (it looks again after
    /// [`WORKER_POLL`]).
    fn turn(&mut self, _s: &mut Session<'_, Self::Files>, _now: Instant) -> bool {
        false
    }
    /// After the session's transmit pass; true as for [`Policy::turn`].
    fn settle(&mut self, _s: &mut Session<'_, Self::Files>, _now: Instant) -> bool {
        false
    }
    /// End of a turn, after every session transmitted.
    fn end(&mut self, _now: Instant, _net: &mut Net<Self::Files>) -> Flow {
        Flow::Go
    }
    /// A closed session left the endpoint.
    fn reaped(&mut self, _cid: Cid, _files: Self::Files) {}
    /// More fds the loop's wait wakes on, with their poll events (a tunnel's standard input
    /// and output, or its TCP connection): the bytes they move are the sessions' work too.
    fn wait_fds(&self) -> Vec<(BorrowedFd<'_>, libc::c_short)> {
        Vec::new()
    }
}

impl<F: BlockSource + BlockSink + Default> Net<F> {
    /// A client's loop: one session with `peer`.
    pub(crate) fn one(links: Links, mut conn: Connection, peer: SocketAddr) -> Self {
        let mut traces = HashMap::new();
        if let Some(t) = CcTrace::from_env(&mut conn) {
            traces.insert(conn.my_cid(), t);
        }
        Net {
            links,
            conns: Conns::One {
                conn: Box::new(conn),
                peer,
            },
            files: HashMap::new(),
            traces,
        }
    }

    /// A server's loop: an endpoint's sessions.
    pub(crate) fn many(links: Links, ep: Endpoint) -> Self {
        Net {
            links,
            conns: Conns::Many(Box::new(ep)),
            files: HashMap::new(),
            traces: HashMap::new(),
        }
    }

    /// A client's session begins again on other links (UDP gave no answer: the ssh
    /// channel). Its storage carries over.
    pub(crate) fn replace_one(
        &mut self,
        links: Option<Links>,
        mut conn: Connection,
        peer: SocketAddr,
    ) {
        if let Some(l) = links {
            self.links = l;
        }
        let files = std::mem::take(&mut self.files)
            .into_values()
            .next()
            .unwrap_or_default();
        self.traces.clear();
        if let Some(t) = CcTrace::from_env(&mut conn) {
            self.traces.insert(conn.my_cid(), t);
        }
        self.files.insert(conn.my_cid(), files);
        self.conns = Conns::One {
            conn: Box::new(conn),
            peer,
        };
    }

    /// The client's session and its storage.
    pub(crate) fn the_one(&mut self) -> Option<(&mut Connection, &mut F)> {
        match &mut self.conns {
            Conns::One { conn, .. } => {
                let f = self.files.entry(conn.my_cid()).or_default();
                Some((conn, f))
            }
            Conns::Many(_) => None,
        }
    }

    /// The sessions' ids, in a stable order.
    pub(crate) fn cids(&self) -> Vec<Cid> {
        match &self.conns {
            Conns::One { conn, .. } => vec![conn.my_cid()],
            Conns::Many(ep) => ep.cids(),
        }
    }

    /// Session `cid`, if it is (still) there.
    pub(crate) fn session(&mut self, cid: Cid) -> Option<Session<'_, F>> {
        let (conn, addr) = match &mut self.conns {
            Conns::One { conn, peer } => (conn.as_mut(), *peer),
            Conns::Many(ep) => {
                let addr = ep.conn_addr(cid)?;
                (ep.conn_mut(cid)?, addr)
            }
        };
        if conn.my_cid() != cid {
            return None;
        }
        let files = self.files.entry(cid).or_default();
        Some(Session {
            cid,
            addr,
            conn,
            files,
        })
    }

    /// Sends what session `cid` has due, unpaced by the loop; true if the link pushed back.
    pub(crate) fn transmit(&mut self, cid: Cid) -> bool {
        let (conn, addr) = match &mut self.conns {
            Conns::One { conn, peer } => (conn.as_mut(), *peer),
            Conns::Many(ep) => {
                let Some(addr) = ep.conn_addr(cid) else {
                    return false;
                };
                let Some(c) = ep.conn_mut(cid) else {
                    return false;
                };
                (c, addr)
            }
        };
        let files = self.files.entry(cid).or_default();
        let pushed_back = transmit(&mut self.links, conn, addr, files);
        self.links.flush();
        pushed_back
    }

    /// Every waiting datagram, to its session.
    fn receive<P: Policy<Files = F>>(&mut self, p: &mut P, now: Instant) -> io::Result<()> {
        let mut replies: Vec<(SocketAddr, Vec<u8>)> = Vec::new();
        let Net {
            links,
            conns,
            files,
            traces,
        } = self;
        match conns {
            Conns::One { conn, peer } => {
                let f = files.entry(conn.my_cid()).or_default();
                links.recv(&mut |from, at, d, opened| {
                    if from == *peer {
                        match opened {
                            None => conn.handle_datagram_at(now, at, d, f),
                            Some(o) => conn.handle_opened_at(now, at, d, o, f),
                        };
                    }
                })?;
            }
            Conns::Many(ep) => {
                links.recv(&mut |from, at, d, opened| {
                    if !p.admits(from) {
                        return;
                    }
                    match ep.route(now, from, d) {
                        Route::Conn(cid) => {
                            let f = files.entry(cid).or_default();
                            let challenge = match opened {
                                None => ep.handle(cid, now, at, from, d, f),
                                Some(o) => ep.handle_opened(cid, now, at, from, d, o, f),
                            };
                            if let Some(challenge) = challenge {
                                replies.push((from, challenge));
                            }
                        }
                        Route::NewConn(cid, reply) => {
                            let Some(c) = ep.conn_mut(cid) else { return };
                            if !p.accept(cid, c, from) {
                                ep.remove(cid);
                                return;
                            }
                            files.insert(cid, F::default());
                            if let Some(t) = CcTrace::from_env_session(c) {
                                traces.insert(cid, t);
                            }
                            replies.push((from, reply));
                        }
                        Route::Reply(reply) => replies.push((from, reply)),
                        Route::Drop => {}
                    }
                })?;
            }
        }
        for (to, r) in replies {
            self.links.send_one(to, &r);
        }
        Ok(())
    }

    /// Closed sessions leave the endpoint; their storage goes to the policy.
    fn reap<P: Policy<Files = F>>(&mut self, p: &mut P, now: Instant) {
        if let Conns::Many(ep) = &mut self.conns {
            for cid in ep.reap(now) {
                self.traces.remove(&cid);
                self.links.forget_key(cid);
                if let Some(f) = self.files.remove(&cid) {
                    p.reaped(cid, f);
                }
            }
        }
    }
}

/// Lets `conn` send everything the pacer allows now, into `links`' batch. True if the link
/// pushed back (a full stream queue) before the core was done.
fn transmit<F: BlockSource>(
    links: &mut Links,
    conn: &mut Connection,
    addr: SocketAddr,
    files: &mut F,
) -> bool {
    loop {
        if !links.has_room(addr) {
            return true;
        }
        // The clock now, not the turn's: a turn that took in a backlog ran for ms since
        // then, and an ACK built with that time tells the sender its data waited here less
        // than it did (the rest reads as a queue on the path: 10 ms at 1 Gbit/s).
        let Some(t) = conn.poll_transmit_deferred(Instant::now(), links.slot(), files) else {
            return false;
        };
        let seal = match (t.seal_pn, conn.send_key()) {
            (None, _) => None,
            (Some(pn), Some(key)) => Some((key, pn)),
            // Never: the core seals only with keys. Plaintext must not leave.
            (Some(_), None) => continue,
        };
        links.commit(addr, t.len, seal);
    }
}

/// Runs the loop until the policy stops it or a link fails.
pub(crate) fn run<P: Policy>(p: &mut P, net: &mut Net<P::Files>) -> io::Result<()> {
    let _ = crate::clock::set_timer_slack_ns(1);
    // Files opened on this thread have their chunks read ahead on reader threads, which
    // wake the loop through this.
    let waker = LoopWaker::install();
    let r = turns(p, net, &waker);
    net.links.finish();
    net.flush_traces();
    r
}

fn turns<P: Policy>(p: &mut P, net: &mut Net<P::Files>, waker: &LoopWaker) -> io::Result<()> {
    let mut last_trace = Instant::now();
    loop {
        waker.drain();
        let now = Instant::now();
        if p.begin(now, net) == Flow::Stop {
            return Ok(());
        }
        net.receive(p, now)
            .map_err(|e| io::Error::new(e.kind(), format!("receive failed: {e}")))?;
        let rx = net.links.receiver_state();
        let flush_traces = now.duration_since(last_trace) >= TRACE_EVERY;
        if flush_traces {
            last_trace = now;
        }
        let mut next = p.wake_by(now);
        for cid in net.cids() {
            let Net {
                links,
                conns,
                files,
                traces,
                ..
            } = &mut *net;
            let (conn, addr) = match conns {
                Conns::One { conn, peer } => (conn.as_mut(), *peer),
                Conns::Many(ep) => {
                    let addr = ep.conn_addr(cid).expect("listed");
                    (ep.conn_mut(cid).expect("listed"), addr)
                }
            };
            let mut s = Session {
                cid,
                addr,
                conn,
                files: files.entry(cid).or_default(),
            };
            if let Some(key) = s.conn.recv_key() {
                links.learn_key(cid, key);
            }
            s.conn.set_receiver_state(ReceiverState {
                store_room: BlockSink::room(&*s.files),
                ..rx
            });
            if s.conn.poll_timeout(now).is_some_and(|t| t <= now) {
                s.conn.handle_timeout(now);
            }
            while let Some(ev) = s.conn.poll_event() {
                p.on_event(&mut s, ev, now);
            }
            let mut busy = p.turn(&mut s, now);
            // A closing session is reaped soon: its last lines go out now.
            if let Some(t) = traces
                .get_mut(&cid)
                .filter(|_| flush_traces || s.conn.is_draining())
            {
                t.flush(s.conn);
            }
            let pushed_back = transmit(links, s.conn, addr, s.files);
            links.flush();
            busy |= p.settle(&mut s, now);
            if busy {
                next = next.min(now + WORKER_POLL);
            }
            if let Some(t) = s.conn.poll_timeout(now) {
                next = next.min(if pushed_back {
                    t.max(now + PUSHED_BACK_WAIT)
                } else {
                    t
                });
            }
        }
        if p.end(now, net) == Flow::Stop {
            return Ok(());
        }
        net.reap(p, now);
        if next > Instant::now() {
            let mut fds = p.wait_fds();
            fds.extend(waker.fd().map(|fd| (fd, libc::POLLIN)));
            net.links
                .wait_until(next, &fds)
                .map_err(|e| io::Error::new(e.kind(), format!("socket wait failed: {e}")))?;
        }
    }
}

impl<F> Net<F> {
    /// Writes out every session's pending `HAYATE_CC_TRACE` lines.
    pub(crate) fn flush_traces(&mut self) {
        for (cid, t) in self.traces.iter_mut() {
            let conn = match &mut self.conns {
                Conns::One { conn, .. } => Some(conn.as_mut()),
                Conns::Many(ep) => ep.conn_mut(*cid),
            };
            if let Some(c) = conn {
                t.flush(c);
            }
        }
    }
}
