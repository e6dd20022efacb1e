//! How file bytes cross the core's boundary: the driver reads and writes them.

use crate::transfer::XferId;

/// Where outgoing file data comes from.
pub trait BlockSource {
    /// Fill `buf` with the file bytes of transfer `xfer` at `offset` (exactly `buf.len()`).
    fn read(&mut self, xfer: XferId, offset: u64, buf: &mut [u8]) -> Result<(), String>;
}

/// Where incoming file data goes.
pub trait BlockSink {
    /// Write `data`, the bytes of transfer `xfer` at `offset`. An error fails the transfer
    /// (the sender is told, and an [`Event::IncomingFailed`](super::Event::IncomingFailed)
    /// raised).
    fn write(&mut self, xfer: XferId, offset: u64, data: &[u8]) -> Result<(), String>;

    /// Whether a new block of `xfer` can be taken now without waiting (storage
    /// backpressure). A block the sink is not ready for is dropped as if the path had lost
    /// it: the loss map reports it missing, the sender sends it again, and the delivery
    /// rate the sender measures is what the sink took, so a slow disk or FIFO reader slows
    /// the sender as a slow link would, and the driver's loop never waits on storage.
    fn ready(&mut self, _xfer: XferId) -> bool {
        true
    }
}
