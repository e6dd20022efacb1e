//! How file bytes cross the core's boundary: the driver reads and writes them.

use crate::transfer::XferId;

/// Where outgoing file data comes from.
pub trait BlockSource {
    /// Fill `buf` with the file bytes of transfer `xfer` at `offset` (exactly `buf.len()`).
    /// An error fails the transfer: the receiver is told "cannot read PATH: ERROR" and an
    /// [`Event::OutgoingDone`](super::Event::OutgoingDone) with that error is raised;
    /// except [`StorageError::NotReady`], after which the same block is asked for again
    /// later. A driver whose storage can take long (a disk) reads ahead on another thread
    /// and says `NotReady` rather than keep the protocol loop waiting.
    fn read(&mut self, xfer: XferId, offset: u64, buf: &mut [u8]) -> Result<(), StorageError>;
}

/// Where incoming file data goes.
pub trait BlockSink {
    /// Write `data`, the bytes of transfer `xfer` at `offset`. An error fails the transfer
    /// (the sender is told "cannot write PATH: ERROR", and an
    /// [`Event::IncomingFailed`](super::Event::IncomingFailed) raised).
    fn write(&mut self, xfer: XferId, offset: u64, data: &[u8]) -> Result<(), StorageError>;

    /// Whether a new block of `xfer` can be taken now without waiting (storage
    /// backpressure). A block the sink is not ready for is dropped as if the path had lost
    /// it: the loss map reports it missing and the sender sends it again, and the driver's
    /// loop never waits on storage. [`room`](Self::room) keeps the sender from sending
    /// what would be refused.
    fn ready(&mut self, _xfer: XferId) -> bool {
        true
    }

    /// File bytes it takes now, whatever the transfer, before [`ready`](Self::ready) says
    /// no, when that is the limit (`None`: it keeps up, no limit; the driver's part files
    /// say so until their writer is half a queue behind). The driver reports it with the
    /// receive path's state
    /// ([`ReceiverState::store_room`](super::ReceiverState::store_room)); ACKs advertise it,
    /// and the sender keeps no more than that in flight, so that blocks are not sent only
    /// to be refused (a receive window, as TCP's).
    fn room(&self) -> Option<u64> {
        None
    }
}

/// Storage for a session that moves no files (a tunnel's): every block is
/// [`StorageError::NotOpen`].
#[derive(Debug, Default, Clone, Copy)]
pub struct NoFiles;

impl BlockSource for NoFiles {
    fn read(&mut self, _: XferId, _: u64, _: &mut [u8]) -> Result<(), StorageError> {
        Err(StorageError::NotOpen)
    }
}

impl BlockSink for NoFiles {
    fn write(&mut self, _: XferId, _: u64, _: &[u8]) -> Result<(), StorageError> {
        Err(StorageError::NotOpen)
    }
}

/// Why a [`BlockSource`] or [`BlockSink`] could not move a block. The core only shows it,
/// in the reason the transfer fails with; a driver's own error goes in
/// [`StorageError::Other`], where `downcast_ref` finds it.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The driver holds no open file for the transfer (it never opened it, or closed it).
    #[error("transfer not open")]
    NotOpen,
    /// The block lies past the end of the file as offered (`offset + len > size`, bytes).
    #[error("bytes {offset}..{} past the end of the file ({size} bytes)", offset + len)]
    PastEnd {
        /// Where the block starts.
        offset: u64,
        /// Its length.
        len: u64,
        /// The file's size.
        size: u64,
    },
    /// The bytes are not at hand yet (a read-ahead thread is still reading them from a
    /// slow disk): not a failure. The core passes that transfer over for the others until
    /// its next [`poll_transmit`](super::Connection::poll_transmit) call; when no transfer
    /// can send, it does not ask to be woken for data
    /// ([`poll_timeout`](super::Connection::poll_timeout)): the driver calls again once its
    /// read is done. Only [`BlockSource::read`] returns it.
    #[error("not read yet")]
    NotReady,
    /// The driver's storage failed (a system call, a file that changed while being sent,
    /// ...): its own error, shown as it is.
    #[error(transparent)]
    Other(Box<dyn std::error::Error + Send + Sync>),
}

impl From<std::io::Error> for StorageError {
    fn from(e: std::io::Error) -> Self {
        StorageError::Other(Box::new(e))
    }
}
