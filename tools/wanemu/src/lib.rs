//! hayate-wanemu: an NFQUEUE-based WAN link emulator (rate, tail-drop queue,
//! random loss, delay) for kernels without netem. See `bench/wan`.

pub mod model;
pub mod nfq;
