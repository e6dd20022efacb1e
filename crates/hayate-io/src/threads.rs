//! A fixed set of named worker threads, each fed by its own channel: the writers
//! (`writeback`) and the readers (`readahead`). A file's jobs all go to one thread (chosen
//! round robin when the file starts), so they run in the order they were queued.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::Mutex;

pub(crate) struct Pool<J> {
    threads: Vec<Mutex<Sender<J>>>,
    next: AtomicUsize,
}

impl<J: Send + 'static> Pool<J> {
    /// Starts `n` threads named `{name}-{i}`, each running `run` on its jobs in order (fewer
    /// if the system refuses some; then [`send`](Self::send) gives jobs back).
    pub fn start(n: usize, name: &str, run: fn(J)) -> Self {
        let threads = (0..n)
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
        Pool {
            threads,
            next: AtomicUsize::new(0),
        }
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
