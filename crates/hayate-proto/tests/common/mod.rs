//! What the tests that drive a client and a server session by hand share: a file whose
//! bytes are their offsets, its hash, and the two ends before their handshake.

use std::time::Instant;

use hayate_proto::conn::{BlockSource, Config, Connection, StorageError};
use hayate_proto::crypto::Psk;
use hayate_proto::endpoint::Endpoint;
use hayate_proto::rng::Rng;
use hayate_proto::wire::AddrFamily;
use hayate_proto::XferId;

/// File bytes: byte i of the file is `i as u8`; counts what was read.
#[derive(Default)]
pub struct Source {
    pub read_bytes: u64,
}

impl BlockSource for Source {
    fn read(&mut self, _: XferId, offset: u64, buf: &mut [u8]) -> Result<(), StorageError> {
        for (i, b) in buf.iter_mut().enumerate() {
            *b = (offset + i as u64) as u8;
        }
        self.read_bytes += buf.len() as u64;
        Ok(())
    }
}

/// The BLAKE3 of a [`Source`] file of `size` bytes.
pub fn file_hash(size: u64) -> [u8; 32] {
    let data: Vec<u8> = (0..size).map(|i| i as u8).collect();
    *blake3::hash(&data).as_bytes()
}

/// A server endpoint and a client session for it, sharing a key, at `t0`, seeded.
pub fn endpoint_and_client(t0: Instant) -> (Endpoint, Connection) {
    let psk = Psk::from_bytes([9; 32]);
    let ep = Endpoint::with_rng(psk.clone(), Config::default(), t0, Rng::seeded(1));
    let c = Connection::client_with_rng(
        Config::default(),
        &psk,
        AddrFamily::V4,
        t0,
        &mut Rng::seeded(2),
    );
    (ep, c)
}
