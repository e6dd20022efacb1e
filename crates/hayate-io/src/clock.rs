//! Precise waiting for the pacer.
//!
//! Trade-off: kernel sleeps (nanosleep, ppoll) cost no CPU but wake up late — by the thread's
//! timer slack (50 µs by default) plus scheduler latency, which on a VM can be tens of µs
//! more. Spinning is exact but burns a core, and this machine has two. So we sleep in the
//! kernel until [`SPIN_MARGIN`] before the deadline and spin (yielding the CPU each round, so
//! another runnable thread is not starved) only for that last stretch. Setting the timer
//! slack to 1 ns ([`set_timer_slack_ns`]) shrinks the kernel's lateness so the spin phase can
//! stay short. At 8 Gbit/s with 64 KiB GSO bursts the pacer waits ~65 µs between bursts,
//! i.e. mostly spins; at lower rates it mostly sleeps.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::time::{Duration, Instant};

/// How long before a deadline we stop sleeping in the kernel and start spinning.
pub const SPIN_MARGIN: Duration = Duration::from_micros(80);

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
/// [`SPIN_MARGIN`] before, then spin-yield.
pub fn sleep_until(deadline: Instant) {
    loop {
        let now = Instant::now();
        let Some(left) = deadline
            .checked_duration_since(now)
            .filter(|d| !d.is_zero())
        else {
            return;
        };
        if left > SPIN_MARGIN {
            std::thread::sleep(left - SPIN_MARGIN);
        } else {
            std::thread::yield_now();
        }
    }
}

/// Waits until `fd` is readable or `deadline` passes, with µs precision: `ppoll` until
/// [`SPIN_MARGIN`] before the deadline, then non-blocking polls with yields. Returns true
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
        let left = deadline.saturating_duration_since(Instant::now());
        let timeout = if left > SPIN_MARGIN {
            left - SPIN_MARGIN
        } else {
            Duration::ZERO
        };
        if poll_fds(fds, Some(timeout))? {
            return Ok(true);
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
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|(fd, events)| libc::pollfd {
            fd: fd.as_raw_fd(),
            events: *events,
            revents: 0,
        })
        .collect();
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
