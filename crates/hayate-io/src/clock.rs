//! Precise waiting for the pacer.
//!
//! Trade-off: kernel sleeps (nanosleep, ppoll) cost no CPU but wake up late — by the thread's
//! timer slack (50 µs by default) plus scheduler latency, which on a VM can be tens of µs
//! more. Spinning is exact but burns a core, and this machine has two. So we sleep in the
//! kernel until a margin before the deadline and spin (yielding the CPU each round, so
//! another runnable thread is not starved) only for that last stretch. Setting the timer
//! slack to 1 ns ([`set_timer_slack_ns`]) shrinks the kernel's lateness so the spin phase can
//! stay short.
//!
//! The margin is learnt per thread: it follows the [`ON_TIME`] quantile of how late this
//! thread's kernel sleeps actually wake (a few µs on an idle VM with 1 ns slack, tens of
//! µs on a busy one), between [`SPIN_MIN`] and [`SPIN_MARGIN`]. The pacer wakes the sender
//! every eight datagrams (every 96 µs at 1 Gbit/s, less above): a fixed 80 µs margin had it
//! spinning most of the time, CPU that the receiver, sharing the same two cores on a local
//! copy, then lacked (docs/PERFORMANCE.md, "The pacer spins").

use std::cell::Cell;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::time::{Duration, Instant};

/// The most we spin before a deadline: the margin's ceiling (the kernel sleeps until this
/// long before the deadline at most early), and where it starts before anything is learnt.
pub const SPIN_MARGIN: Duration = Duration::from_micros(80);

/// The least margin kept, whatever the sleeps showed: the spin's last round trip (a
/// `ppoll`, a clock read, a yield) takes about this long.
pub const SPIN_MIN: Duration = Duration::from_micros(2);

/// Share of kernel sleeps the margin is meant to cover: the rest wake past it, and the
/// deadline with them (the pacer keeps the credit of a late wake-up, so such a burst is
/// only bigger, not lost).
pub const ON_TIME: f64 = 0.99;

/// How far one on-time wake-up lowers the margin; a late one raises it by
/// `ON_TIME / (1 - ON_TIME)` times this (so the margin settles where that share is on time).
const STEP_NS: f64 = 100.0;

/// A stochastic quantile tracker of kernel wake-up lateness: the spin margin.
#[derive(Debug, Clone, Copy)]
struct Margin {
    ns: f64,
}

impl Margin {
    const fn new() -> Self {
        Margin {
            ns: SPIN_MARGIN.as_nanos() as f64,
        }
    }

    fn get(&self) -> Duration {
        Duration::from_nanos(self.ns as u64)
    }

    /// A kernel sleep that was to end at some time ended `late` after it.
    fn learn(&mut self, late: Duration) {
        let late = late.as_nanos() as f64;
        if late > self.ns {
            self.ns += STEP_NS * ON_TIME / (1.0 - ON_TIME);
        } else {
            self.ns -= STEP_NS;
        }
        self.ns = self
            .ns
            .clamp(SPIN_MIN.as_nanos() as f64, SPIN_MARGIN.as_nanos() as f64);
    }
}

thread_local! {
    static MARGIN: Cell<Margin> = const { Cell::new(Margin::new()) };
}

/// How long before a deadline this thread stops sleeping in the kernel and starts spinning.
pub fn spin_margin() -> Duration {
    MARGIN.with(|m| m.get().get())
}

/// A kernel sleep of this thread meant to end at `target` ended at `woke`.
fn learn_wake_up(target: Instant, woke: Instant) {
    MARGIN.with(|m| {
        let mut v = m.get();
        v.learn(woke.saturating_duration_since(target));
        m.set(v);
    });
}

/// Sets the calling thread's timer slack (`PR_SET_TIMERSLACK`), the extra delay the kernel
/// may add to its sleeps to batch wake-ups. 1 ns makes `nanosleep`/`ppoll` as precise as the
/// hardware allows. Per thread: call it on the pacing thread. 0 restores the default.
pub fn set_timer_slack_ns(ns: u64) -> io::Result<()> {
    // SAFETY: PR_SET_TIMERSLACK takes one unsigned long argument.
    let r = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, ns as libc::c_ulong, 0, 0, 0) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Sleeps until `deadline`, typically within a few µs of it: kernel sleep until
/// [`spin_margin`] before, then spin-yield.
pub fn sleep_until(deadline: Instant) {
    loop {
        let now = Instant::now();
        let Some(left) = deadline
            .checked_duration_since(now)
            .filter(|d| !d.is_zero())
        else {
            return;
        };
        let margin = spin_margin();
        if left > margin {
            std::thread::sleep(left - margin);
            learn_wake_up(now + (left - margin), Instant::now());
        } else {
            std::thread::yield_now();
        }
    }
}

/// Waits until `fd` is readable or `deadline` passes, with µs precision: `ppoll` until
/// [`spin_margin`] before the deadline, then non-blocking polls with yields. Returns true
/// as soon as it is readable (errors pending on the socket also count as readable).
pub fn wait_readable_until<F: AsFd>(fd: &F, deadline: Instant) -> io::Result<bool> {
    wait_any_until(&[(fd.as_fd(), libc::POLLIN)], deadline)
}

/// [`wait_readable_until`] for several fds, each with its own poll events: true as soon as
/// any of them is ready, false when `deadline` passes.
pub fn wait_any_until(
    fds: &[(BorrowedFd<'_>, libc::c_short)],
    deadline: Instant,
) -> io::Result<bool> {
    loop {
        let now = Instant::now();
        let left = deadline.saturating_duration_since(now);
        let margin = spin_margin();
        let timeout = if left > margin {
            left - margin
        } else {
            Duration::ZERO
        };
        if poll_fds(fds, Some(timeout))? {
            return Ok(true);
        }
        if !timeout.is_zero() {
            // The kernel's timeout ran out (no fd woke us): how late it did says what the
            // spin has to cover.
            learn_wake_up(now + timeout, Instant::now());
        }
        if left.is_zero() {
            return Ok(false);
        }
        if timeout.is_zero() {
            std::thread::yield_now();
        }
    }
}

/// `ppoll` on one fd with a µs-precise timeout (`None`: forever). Returns the revents, 0 on
/// timeout. Restarts after signals with the remaining time.
pub(crate) fn poll_fd(
    fd: BorrowedFd<'_>,
    events: libc::c_short,
    timeout: Option<Duration>,
) -> io::Result<libc::c_short> {
    let mut pfd = [libc::pollfd {
        fd: fd.as_raw_fd(),
        events,
        revents: 0,
    }];
    ppoll(&mut pfd, timeout)?;
    Ok(pfd[0].revents)
}

/// True if any of `fds` is ready within `timeout`.
fn poll_fds(
    fds: &[(BorrowedFd<'_>, libc::c_short)],
    timeout: Option<Duration>,
) -> io::Result<bool> {
    let pfd = |(fd, events): &(BorrowedFd<'_>, libc::c_short)| libc::pollfd {
        fd: fd.as_raw_fd(),
        events: *events,
        revents: 0,
    };
    // The spin calls this in a loop: the usual few fds stay on the stack.
    const ON_STACK: usize = 8;
    if fds.len() <= ON_STACK {
        let mut pfds = [libc::pollfd {
            fd: -1,
            events: 0,
            revents: 0,
        }; ON_STACK];
        for (p, f) in pfds.iter_mut().zip(fds) {
            *p = pfd(f);
        }
        return Ok(ppoll(&mut pfds[..fds.len()], timeout)? > 0);
    }
    let mut pfds: Vec<libc::pollfd> = fds.iter().map(pfd).collect();
    Ok(ppoll(&mut pfds, timeout)? > 0)
}

/// `ppoll(2)` restarted after signals with the time left; returns the count of ready fds.
fn ppoll(pfds: &mut [libc::pollfd], timeout: Option<Duration>) -> io::Result<usize> {
    let deadline = timeout.map(|t| Instant::now() + t);
    loop {
        let ts = deadline.map(|d| {
            let left = d.saturating_duration_since(Instant::now());
            libc::timespec {
                tv_sec: left.as_secs().min(libc::time_t::MAX as u64) as libc::time_t,
                tv_nsec: left.subsec_nanos() as _,
            }
        });
        let ts_ptr = ts
            .as_ref()
            .map_or(std::ptr::null(), |t| t as *const libc::timespec);
        // SAFETY: `pfds` is a valid pollfd array of its length; ts_ptr is null or points
        // at a live timespec.
        let r = unsafe {
            libc::ppoll(
                pfds.as_mut_ptr(),
                pfds.len() as libc::nfds_t,
                ts_ptr,
                std::ptr::null(),
            )
        };
        if r >= 0 {
            return Ok(r as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lateness drawn from a fixed spread: the margin settles where `ON_TIME` of it is
    /// covered, and follows the spread when it grows and shrinks.
    #[test]
    fn the_margin_settles_on_the_quantile_of_lateness() {
        // 0, 1, ..., spread µs in a scrambled order, many times over: the share of
        // wake-ups the margin covered, and the margin's mean, over the second half.
        let settle = |m: &mut Margin, spread_us: u64| {
            let (n, mut on_time, mut sum) = (40_000u64, 0u64, 0.0);
            for i in 0..n {
                let late = Duration::from_micros((i * 7919) % (spread_us + 1));
                if i >= n / 2 {
                    on_time += u64::from(late <= m.get());
                    sum += m.get().as_secs_f64() * 1e6;
                }
                m.learn(late);
            }
            (on_time as f64 / (n / 2) as f64, sum / (n / 2) as f64)
        };
        let mut m = Margin::new();
        for spread in [20, 60, 4, 30] {
            let (share, mean) = settle(&mut m, spread);
            assert!(
                (ON_TIME - 0.015..=ON_TIME + 0.005).contains(&share),
                "{spread} µs spread: {share} on time"
            );
            let quantile = spread as f64 * ON_TIME;
            assert!(
                mean >= quantile * 0.8 && mean <= quantile * 1.4 + 5.0,
                "{spread} µs spread: margin {mean} µs"
            );
        }
        // Never beyond the bounds, however late or early the wake-ups.
        for _ in 0..1000 {
            m.learn(Duration::from_millis(5));
        }
        assert_eq!(m.get(), SPIN_MARGIN);
        for _ in 0..10_000 {
            m.learn(Duration::ZERO);
        }
        assert_eq!(m.get(), SPIN_MIN);
    }
}
