//! Sans-IO core of hayate: everything about the protocol, nothing about sockets, files,
//! threads or clocks. Callers feed datagrams and the current time in, and take datagrams,
//! timer deadlines and events out. See `docs/PROTOCOL.md` for the wire format.

pub mod crypto;
pub mod handshake;
pub mod wire;
