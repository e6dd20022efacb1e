//! Delta transfers and verified resume on the control stream: a receiver that holds a
//! basis for an offered file (the file already at the destination, or the temp file an
//! interrupted copy left) asks for the sender's leaf hashes instead of accepting at once,
//! compares them with its basis's, and accepts with the blocks that match as `have`. The
//! hashing and comparing are the driver's (on worker threads); the connection carries the
//! messages. See `docs/PROTOCOL.md`, "Delta transfers".

use super::{Connection, Ctrl};
use crate::control::{BlockSpan, LeafHash, LEAF_LEN, SUMS_PER_MESSAGE};
use crate::transfer::XferId;

impl Connection {
    /// Receiver: instead of accepting the `Offered` file `xfer` now, ask for the sender's
    /// leaf hashes, to be compared with a basis of kind `basis`
    /// ([`crate::control::basis`]). They arrive through [`take_sums`](Self::take_sums);
    /// accept (with what matched as `have`) or reject when they are all in.
    pub fn want_sums(&mut self, xfer: XferId, basis: u8) {
        if let Some(inc) = self.xfers.incoming.get_mut(&xfer) {
            if !inc.accepted && !inc.sums_asked {
                inc.sums_asked = true;
                // The sender holds its data back until it hears this: twice, as `Ready`.
                self.say_twice(&Ctrl::WantSums { xfer, basis });
            }
        }
    }

    /// Receiver, while it compares `xfer`'s leaves (after [`want_sums`](Self::want_sums),
    /// before accepting it): those of the blocks below `upto` are compared. Of the blocks
    /// from the previous call's `upto` (or 0) to this one, the basis holds `have` and
    /// `spans` (as for [`accept_with`](Self::accept_with)); the sender sends the rest of them
    /// now, and they are written as they come. `accept_with` then names what the basis holds
    /// of the blocks from the last `upto` on.
    pub fn accept_compared(
        &mut self,
        xfer: XferId,
        upto: u64,
        have: &[(u64, u64)],
        spans: &[BlockSpan],
    ) {
        let Some(inc) = self.xfers.incoming.get_mut(&xfer) else {
            return;
        };
        let upto = upto.min(inc.layout.blocks());
        if inc.accepted || !inc.sums_asked || upto <= inc.horizon {
            return;
        }
        let (have, parts) = inc.mark_held(have, spans, upto);
        inc.horizon = upto;
        // Blocks sent with the offer that are now compared are written.
        self.xfers.stash_pending |= inc.stash.keys().next().is_some_and(|&b| b < upto);
        self.ctrl.tx.push(&Ctrl::Compared {
            xfer,
            upto,
            have,
            parts,
        });
    }

    /// Receiver: the pieces of leaf hashes of `xfer` that arrived since the last call, in
    /// order, as `(first leaf, hashes)`.
    pub fn take_sums(&mut self, xfer: XferId) -> Vec<(u64, Vec<LeafHash>)> {
        self.xfers
            .incoming
            .get_mut(&xfer)
            .map(|i| std::mem::take(&mut i.sums))
            .unwrap_or_default()
    }

    /// Sender: the transfers whose receivers asked for leaf hashes since the last call
    /// (see [`send_sums`](Self::send_sums)).
    pub fn sums_wanted(&mut self) -> Vec<XferId> {
        self.xfers
            .outgoing
            .values_mut()
            .filter_map(|o| std::mem::take(&mut o.sums_wanted).then_some(o.id))
            .collect()
    }

    /// Sender: leaf hashes `first..` of `xfer`, in order from 0, split into messages.
    pub fn send_sums(&mut self, xfer: XferId, first: u64, leaves: &[LeafHash]) {
        if !self.xfers.outgoing.contains_key(&xfer) {
            return;
        }
        for (i, part) in leaves.chunks(SUMS_PER_MESSAGE).enumerate() {
            self.ctrl.tx.push(&Ctrl::Sums {
                xfer,
                first: first + (i * SUMS_PER_MESSAGE) as u64,
                leaves: part.to_vec(),
            });
        }
    }

    /// Control stream bytes queued and not sent yet (new, or declared lost): a driver
    /// sending many leaf hashes keeps this small, so that a message queued behind them
    /// (another file's `Ready`, a `Verified`) does not wait long. How many are in flight is
    /// the stream's window's business (4 MiB beyond what the peer has in order), and they
    /// go out as acknowledgements make room.
    pub fn ctrl_backlog(&self) -> u64 {
        self.ctrl.tx.unsent()
    }

    /// Sender: what the receiver compared `xfer`'s leaves with, if it asked for them
    /// ([`crate::control::basis`]): what it then had counts as resumed or as reused.
    pub fn outgoing_basis(&self, xfer: XferId) -> Option<u8> {
        self.xfers.outgoing.get(&xfer).and_then(|o| o.basis)
    }

    pub(super) fn on_want_sums(&mut self, xfer: XferId, basis: u8) {
        match self.xfers.outgoing.get_mut(&xfer) {
            Some(o) if !o.ready && o.basis.is_none() => {
                o.basis = Some(basis);
                o.sums_wanted = true;
                // The receiver holds a basis: blocks sent before its `Ready` are likely
                // ones it has (up to `EAGER_BYTES` of them went otherwise).
                o.eager = false;
            }
            Some(_) => {}
            None => self.stats.dropped_unexpected += 1,
        }
    }

    pub(super) fn on_compared(
        &mut self,
        xfer: XferId,
        upto: u64,
        have: &[(u64, u64)],
        parts: &[BlockSpan],
    ) {
        // A transfer given up meanwhile is no more.
        if let Some(o) = self.xfers.outgoing.get_mut(&xfer) {
            self.xfers.retired_in_flight += o.on_compared(upto, have, parts);
        }
    }

    pub(super) fn on_sums(&mut self, xfer: XferId, first: u64, leaves: Vec<LeafHash>) {
        let Some(inc) = self.xfers.incoming.get_mut(&xfer) else {
            // A transfer given up meanwhile.
            return;
        };
        let total = inc.layout.size.div_ceil(LEAF_LEN);
        let n = leaves.len() as u64;
        if !inc.sums_asked || inc.accepted || first != inc.sums_received || first + n > total {
            self.stats.dropped_unexpected += 1;
            return;
        }
        inc.sums_received += n;
        inc.sums.push((first, leaves));
    }
}
