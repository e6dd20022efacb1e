#![warn(missing_docs)]

//! I/O shell of hayate: the parts that touch the OS. The protocol itself lives in
//! `hayate-proto`; this crate moves its datagrams through sockets and its blocks through files.

pub mod clock;
pub mod delta;
pub mod driver;
pub mod fs;
pub mod glob;
pub mod keyfile;
pub mod pagebuf;
pub mod pathcache;
pub(crate) mod readahead;
pub mod ssh;
pub(crate) mod threads;
pub mod udp;
pub mod verify;
pub mod writeback;
