//! A test harness: a client and its server session with a tunnel between them, over a path
//! with a delay each way, in virtual time (the tunnel's and the timers' unit tests).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::conn::{Connection, Event, NoFiles};
use crate::crypto::Psk;
use crate::endpoint::{Endpoint, Route};
use crate::rng::Rng;
use crate::wire::{self, AddrFamily, Cid};
use crate::Config;

/// A client and its server session with a tunnel, over a path of `delay` each way, in
/// virtual time.
pub(crate) struct TunnelPair {
    pub(crate) c: Connection,
    pub(crate) ep: Endpoint,
    pub(crate) cid: Cid,
    pub(crate) now: Instant,
    pub(crate) delay: Duration,
    pub(crate) to_server: VecDeque<(Instant, Vec<u8>)>,
    pub(crate) to_client: VecDeque<(Instant, Vec<u8>)>,
    /// This many of the client's next datagrams are lost.
    pub(crate) lose_to_server: u32,
    /// The client's datagrams are sealed as a driver seals them off the protocol's thread
    /// (`poll_transmit_deferred`, then `send_key`).
    pub(crate) seal_in_driver: bool,
    /// The server's datagrams are opened as a driver opens them off the protocol's thread
    /// (`recv_key`, then `Endpoint::handle_opened`); the highest pn it opened.
    pub(crate) open_in_driver: Option<Option<u64>>,
}

impl TunnelPair {
    pub(crate) fn new(delay: Duration) -> TunnelPair {
        let t0 = Instant::now();
        let psk = Psk::from_bytes([6; 32]);
        let ep = Endpoint::with_rng(psk.clone(), Config::default(), t0, Rng::seeded(3));
        let c = Connection::client_with_rng(
            Config::default(),
            &psk,
            AddrFamily::V4,
            t0,
            &mut Rng::seeded(4),
        );
        let mut p = TunnelPair {
            c,
            ep,
            cid: Cid::default(),
            now: t0,
            delay,
            to_server: VecDeque::new(),
            to_client: VecDeque::new(),
            lose_to_server: 0,
            seal_in_driver: false,
            open_in_driver: None,
        };
        p.run(Duration::from_millis(500));
        p.c.open_tunnel("127.0.0.1", 22);
        p.run(Duration::from_millis(500));
        assert!(p.c.is_established());
        assert!(p.server().has_tunnel());
        p
    }

    fn server_receive(&mut self, id: Cid, now: Instant, addr: SocketAddr, d: &mut [u8]) {
        let Some(largest) = self.open_in_driver else {
            self.ep.handle(id, now, now, addr, d, &mut NoFiles);
            return;
        };
        let key = self.server().recv_key().expect("keys").clone();
        let bits = wire::sealed_pn_bits(d).expect("sealed");
        let pn = wire::decode_pn(bits, largest.map_or(0, |l| l + 1));
        let opened = key.open_datagram(d, pn);
        if opened.is_ok() && largest.is_none_or(|l| pn > l) {
            self.open_in_driver = Some(Some(pn));
        }
        self.ep
            .handle_opened(id, now, now, addr, d, opened, &mut NoFiles);
    }

    fn client_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<usize> {
        if !self.seal_in_driver {
            return self.c.poll_transmit(now, buf, &mut NoFiles);
        }
        let t = self.c.poll_transmit_deferred(now, buf, &mut NoFiles)?;
        if let Some(pn) = t.seal_pn {
            let key = self.c.send_key().expect("sealed only with keys");
            key.seal_datagram(&mut buf[..t.len], pn);
        }
        Some(t.len)
    }

    pub(crate) fn server(&mut self) -> &mut Connection {
        self.ep.conn_mut(self.cid).expect("server session")
    }

    /// `d` of virtual time in 1 ms steps: what arrives is handled first, then the
    /// deadlines, then what each side sends leaves for the other.
    pub(crate) fn run(&mut self, d: Duration) {
        let addr = "192.0.2.1:4000".parse().unwrap();
        let until = self.now + d;
        let mut buf = vec![0u8; 1500];
        while self.now < until {
            self.now += Duration::from_millis(1);
            let now = self.now;
            let due = now + self.delay;
            while self.to_server.front().is_some_and(|(t, _)| *t <= now) {
                let (_, mut d) = self.to_server.pop_front().unwrap();
                match self.ep.route(now, addr, &d) {
                    Route::NewConn(id, reply) => {
                        self.cid = id;
                        self.to_client.push_back((due, reply));
                    }
                    Route::Conn(id) => self.server_receive(id, now, addr, &mut d),
                    _ => {}
                }
            }
            while self.to_client.front().is_some_and(|(t, _)| *t <= now) {
                let (_, mut d) = self.to_client.pop_front().unwrap();
                self.c.handle_datagram(now, &mut d, &mut NoFiles);
            }
            if self.c.poll_timeout(now).is_some_and(|t| t <= now) {
                self.c.handle_timeout(now);
            }
            while self.c.poll_event().is_some() {}
            while let Some(n) = self.client_transmit(now, &mut buf) {
                if self.lose_to_server > 0 {
                    self.lose_to_server -= 1;
                    continue;
                }
                self.to_server.push_back((due, buf[..n].to_vec()));
            }
            let Some(s) = self.ep.conn_mut(self.cid) else {
                continue;
            };
            if s.poll_timeout(now).is_some_and(|t| t <= now) {
                s.handle_timeout(now);
            }
            while let Some(ev) = s.poll_event() {
                if let Event::TunnelRequested { .. } = ev {
                    s.answer_tunnel(Ok(()));
                }
            }
            while let Some(n) = s.poll_transmit(now, &mut buf, &mut NoFiles) {
                self.to_client.push_back((due, buf[..n].to_vec()));
            }
        }
    }
}
