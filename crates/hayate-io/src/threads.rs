//! A fixed set of named worker threads, each fed by its own channel: the writers
//! (`writeback`) and the readers (`readahead`). A file's jobs all go to one thread (chosen
//! when the file starts: round robin, or the least loaded), so they run in the order they
//! were queued.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::Mutex;

pub(crate) struct Pool<J> {
    threads: Vec<Mutex<Sender<J>>>,
    next: AtomicUsize,
    /// Work queued on each thread and not done yet, in the caller's unit (see
    /// [`least_loaded`](Self::least_loaded)).
    load: Vec<AtomicUsize>,
}

impl<J: Send + 'static> Pool<J> {
    /// Starts `n` threads named `{name}-{i}`, each running `run` on its jobs in order (fewer
    /// if the system refuses some; then [`send`](Self::send) gives jobs back).
    pub fn start(n: usize, name: &str, run: fn(J)) -> Self {
        let threads: Vec<Mutex<Sender<J>>> = (0..n)
            .filter_map(|i| {
                let (tx, rx) = channel::<J>();
                std::thread::Builder::new()
                    .name(format!("{name}-{i}"))
                    .spawn(move || {
                        while let Ok(job) = rx.recv() {
                            run(job);
                        }
                    })
                    .ok()
                    .map(|_| Mutex::new(tx))
            })
            .collect();
        let load = (0..threads.len()).map(|_| AtomicUsize::new(0)).collect();
        Pool {
            threads,
            next: AtomicUsize::new(0),
            load,
        }
    }

    /// The thread a new file's jobs go to: the one with the least work queued (counted with
    /// [`add_load`](Self::add_load)), round robin among equals. A file that arrives while
    /// another's writes are behind a slow disk does not queue behind them when a thread is
    /// free.
    pub fn least_loaded(&self) -> usize {
        let n = self.threads.len().max(1);
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        (0..n)
            .map(|k| (start + k) % n)
            .min_by_key(|&i| self.load.get(i).map_or(0, |l| l.load(Ordering::Relaxed)))
            .unwrap_or(0)
    }

    /// `n` more (or, negative, less) work queued on thread `i`.
    pub fn add_load(&self, i: usize, n: isize) {
        if let Some(l) = self.load.get(i) {
            if n >= 0 {
                l.fetch_add(n as usize, Ordering::Relaxed);
            } else {
                l.fetch_sub(n.unsigned_abs(), Ordering::Relaxed);
            }
        }
    }

    /// How many threads there are.
    pub fn len(&self) -> usize {
        self.threads.len()
    }

    /// The thread a new file's jobs go to (round robin).
    pub fn next(&self) -> usize {
        self.next.fetch_add(1, Ordering::Relaxed) % self.threads.len().max(1)
    }

    /// Queues `job` on thread `i`; gives it back if that thread is not there (never
    /// started, or gone).
    pub fn send(&self, i: usize, job: J) -> Result<(), J> {
        match self.threads.get(i) {
            Some(t) => t
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .send(job)
                .map_err(|e| e.0),
            None => Err(job),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new file goes to a thread with nothing queued while another thread is behind (a
    /// file on a slow disk): round robin put every other one behind it.
    #[test]
    fn a_new_file_goes_to_the_least_loaded_thread() {
        let pool: Pool<()> = Pool::start(2, "test-pool", |_| {});
        pool.add_load(0, 16 << 20);
        for _ in 0..4 {
            assert_eq!(pool.least_loaded(), 1);
        }
        pool.add_load(1, 1 << 20);
        assert_eq!(pool.least_loaded(), 1);
        pool.add_load(0, -(16 << 20));
        pool.add_load(1, -(1 << 20));
        let picks: Vec<usize> = (0..4).map(|_| pool.least_loaded()).collect();
        assert!(picks.contains(&0) && picks.contains(&1), "{picks:?}");
    }
}
