//! `hayate bench mem`: fill and copy bandwidth of this host's memory, one thread and all.

use serde::Serialize;
use std::hint::black_box;
use std::sync::Barrier;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Serialize)]
pub struct MemResult {
    pub op: &'static str,
    pub threads: usize,
    /// Bytes written per second (copy: bytes copied; it also reads as many).
    pub gb_per_s: f64,
}

/// Best of `iters` runs of `op` over `size` bytes split among `threads` threads.
fn measure(
    op: &'static str,
    src: &[u8],
    dst: &mut [u8],
    threads: usize,
    iters: usize,
) -> MemResult {
    let size = dst.len();
    let chunk = size.div_ceil(threads);
    let mut best = Duration::MAX;
    for it in 0..iters {
        let barrier = Barrier::new(size.div_ceil(chunk) + 1);
        let elapsed = std::thread::scope(|sc| {
            for (d, s) in dst.chunks_mut(chunk).zip(src.chunks(chunk)) {
                let b = &barrier;
                sc.spawn(move || {
                    b.wait();
                    match op {
                        "fill" => d.fill(it as u8 ^ 0xa5),
                        _ => d.copy_from_slice(s),
                    }
                    black_box(&d[d.len() - 1]);
                    b.wait();
                });
            }
            // Measured from the common start to the last thread's end.
            barrier.wait();
            let t = Instant::now();
            barrier.wait();
            t.elapsed()
        });
        best = best.min(elapsed);
    }
    black_box(&dst[size / 2]);
    MemResult {
        op,
        threads,
        gb_per_s: size as f64 / best.as_secs_f64().max(1e-9) / 1e9,
    }
}

pub fn run(size: usize, threads: usize, iters: usize) -> Vec<MemResult> {
    let size = size.max(4096);
    let threads = threads.clamp(1, 1024);
    // Touch every page first so page faults are not measured.
    let src: Vec<u8> = (0..size).map(|i| i as u8).collect();
    let mut dst = vec![1u8; size];
    let mut out = Vec::new();
    let mut counts = vec![1];
    if threads > 1 {
        counts.push(threads);
    }
    for &t in &counts {
        out.push(measure("fill", &src, &mut dst, t, iters));
        out.push(measure("copy", &src, &mut dst, t, iters));
    }
    out
}
