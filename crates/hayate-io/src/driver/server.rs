//! `hayate serve`: many sessions on one UDP socket, files confined beneath `--root`.

use std::collections::HashMap;
use std::fs::File;
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use hayate_proto::crypto::Psk;
use hayate_proto::{BlockSink, BlockSource, Config, Endpoint, Event, Route, XferId};

use super::{SendBatch, StopFlag};
use crate::fs::{read_at, PartFile, Root};
use crate::udp::{RecvBufs, UdpSocket};

pub struct ServerOptions {
    pub listen: SocketAddr,
    pub root: PathBuf,
    pub psk: Psk,
    pub proto: Config,
}

/// One line per notable thing, for the operator's log.
pub type Log<'a> = &'a mut dyn FnMut(&str);

struct Incoming {
    part: PartFile,
    path: String,
    mode: u32,
}

/// The files one session is reading and writing.
#[derive(Default)]
struct SessionFiles {
    out: HashMap<XferId, File>,
    inc: HashMap<XferId, Incoming>,
}

impl BlockSource for SessionFiles {
    fn read(&mut self, xfer: XferId, offset: u64, buf: &mut [u8]) -> Result<(), String> {
        let f = self.out.get(&xfer).ok_or("transfer not open")?;
        match read_at(f, offset, buf) {
            Ok(n) if n == buf.len() => Ok(()),
            Ok(_) => Err("file shrank while being sent".into()),
            Err(e) => Err(e.to_string()),
        }
    }
}

impl BlockSink for SessionFiles {
    fn write(&mut self, xfer: XferId, offset: u64, data: &[u8]) -> Result<(), String> {
        let f = self.inc.get(&xfer).ok_or("transfer not open")?;
        f.part.write_at(offset, data).map_err(|e| e.to_string())
    }
}

/// Runs until `stop` is set. Partial uploads stay under their `.hayate-part` names.
pub fn serve(opts: ServerOptions, stop: StopFlag, log: Log<'_>) -> anyhow::Result<()> {
    let root = Root::open(&opts.root).map_err(|e| anyhow::anyhow!("--root: {e}"))?;
    let sock = UdpSocket::bind(opts.listen)
        .with_context(|| format!("cannot listen on {}", opts.listen))?;
    let _ = crate::clock::set_timer_slack_ns(1);
    log(&format!(
        "listening on {} (root {}, receive buffer {} KiB)",
        sock.local_addr()?,
        opts.root.display(),
        sock.recv_buffer_size() / 1024
    ));
    let mut ep = Endpoint::new(opts.psk.clone(), opts.proto.clone(), Instant::now());
    let mut files: HashMap<u64, SessionFiles> = HashMap::new();
    let mut rbufs = RecvBufs::new(32);
    let max_dgram = 65536;
    let mut batch = SendBatch::new(max_dgram, 64);

    while !stop.is_stopped() {
        let now = Instant::now();
        sock.recv_batch(&mut rbufs)?;
        for (from, d) in rbufs.datagrams() {
            match ep.route(now, from, d) {
                Route::Conn(cid) => {
                    let f = files.entry(cid).or_default();
                    if let Some(c) = ep.conn_mut(cid) {
                        c.handle_datagram(now, d, f);
                    }
                }
                Route::NewConn(cid, reply) => {
                    files.insert(cid, SessionFiles::default());
                    let _ = sock.send_to(from, &reply);
                }
                Route::Reply(reply) => {
                    let _ = sock.send_to(from, &reply);
                }
                Route::Drop => {}
            }
        }

        let mut next = now + Duration::from_millis(200);
        for cid in ep.cids() {
            let addr = ep.conn_addr(cid).expect("listed");
            let f = files.entry(cid).or_default();
            let c = ep.conn_mut(cid).expect("listed");
            c.set_receiver_state(0, sock.kernel_drops());
            if c.poll_timeout(now).is_some_and(|t| t <= now) {
                c.handle_timeout(now);
            }
            while let Some(ev) = c.poll_event() {
                on_event(&root, c, f, ev, addr, log);
            }
            while let Some(n) = c.poll_transmit(now, batch.slot(), f) {
                batch.commit(&sock, addr, n);
            }
            batch.flush(&sock);
            // Events raised while transmitting (a read error) are handled next round.
            if let Some(t) = c.poll_timeout(now) {
                next = next.min(t);
            }
        }
        for cid in ep.reap(now) {
            if let Some(f) = files.remove(&cid) {
                abandon(f, log);
            }
        }
        if next > Instant::now() {
            crate::clock::wait_readable_until(&sock, next)?;
        }
    }
    log("stopping: closing sessions");
    let now = Instant::now();
    for cid in ep.cids() {
        let addr = ep.conn_addr(cid).expect("listed");
        if let Some(c) = ep.conn_mut(cid) {
            c.close(now, 1, "server shutting down");
            let f = files.entry(cid).or_default();
            while let Some(n) = c.poll_transmit(now, batch.slot(), f) {
                batch.commit(&sock, addr, n);
            }
            batch.flush(&sock);
        }
    }
    for (_, f) in files.drain() {
        abandon(f, log);
    }
    Ok(())
}

fn abandon(f: SessionFiles, log: Log<'_>) {
    for (_, inc) in f.inc {
        log(&format!(
            "incomplete upload kept as {}",
            inc.part.part_name()
        ));
        inc.part.abandon();
    }
}

fn on_event(
    root: &Root,
    c: &mut hayate_proto::Connection,
    f: &mut SessionFiles,
    ev: Event,
    addr: SocketAddr,
    log: Log<'_>,
) {
    match ev {
        Event::Connected => log(&format!("{addr}: session {:016x} established", c.my_cid())),
        Event::Offered {
            xfer,
            path,
            size,
            mode,
            ..
        } => match root.create_part(&path, size) {
            Ok(part) => {
                f.inc.insert(xfer, Incoming { part, path, mode });
                c.accept(xfer, &[]);
            }
            Err(e) => {
                log(&format!("{addr}: refused upload: {e}"));
                c.reject(xfer, &e.to_string());
            }
        },
        Event::GetRequested { xfer, path } => match root.open_read(&path) {
            Ok((file, meta)) => {
                c.offer(xfer, &path, meta.len(), meta.mode(), meta.mtime());
                f.out.insert(xfer, file);
            }
            Err(e) => {
                log(&format!("{addr}: refused download: {e}"));
                c.reject(xfer, &e.to_string());
            }
        },
        Event::IncomingComplete { xfer, blake3 } => {
            let Some(inc) = f.inc.remove(&xfer) else {
                return;
            };
            let result = match inc.part.hash() {
                Ok(h) if *h.as_bytes() == blake3 => {
                    match inc.part.commit(Some(inc.mode & 0o777), None) {
                        Ok(()) => {
                            log(&format!("{addr}: received {} (verified)", inc.path));
                            Ok(blake3)
                        }
                        Err(e) => Err(format!("cannot rename into place: {e}")),
                    }
                }
                Ok(_) => {
                    inc.part.abandon();
                    Err("BLAKE3 mismatch: the data written differs from the source".into())
                }
                Err(e) => Err(format!("cannot read back for verification: {e}")),
            };
            if let Err(e) = &result {
                log(&format!("{addr}: upload {} failed: {e}", inc.path));
            }
            c.finish_incoming(xfer, result);
        }
        Event::IncomingFailed { xfer, reason } => {
            if let Some(inc) = f.inc.remove(&xfer) {
                log(&format!("{addr}: upload {} failed: {reason}", inc.path));
                inc.part.abandon();
            }
        }
        Event::OutgoingDone { xfer, result } => {
            f.out.remove(&xfer);
            if let Err(e) = result {
                log(&format!("{addr}: download failed: {e}"));
            }
        }
        Event::Rejected { xfer, reason } => {
            f.out.remove(&xfer);
            if let Some(inc) = f.inc.remove(&xfer) {
                inc.part.abandon();
            }
            log(&format!("{addr}: client aborted a transfer: {reason}"));
        }
        Event::Bye => {}
        Event::Closed { error } => {
            let s = c.stats();
            match error {
                None => log(&format!(
                    "{addr}: session closed ({} packets in, {} out, {} retransmitted)",
                    s.packets_received, s.packets_sent, s.data_packets_retransmitted
                )),
                Some(e) => log(&format!("{addr}: session ended: {e}")),
            }
            for (_, inc) in f.inc.drain() {
                inc.part.abandon();
            }
            f.out.clear();
        }
    }
}
