//! A fixed pool of I/O threads fed by a channel.
//!
//! Why a pool rather than scoped threads per batch: prefetches must outlive the call that issues them, and
//! a layer's misses arrive dozens of times per token, so spawning threads per batch would add tens of
//! microseconds per layer for nothing. Blocking `pread`s on several threads are what keeps several reads in
//! flight; io_uring would do the same with fewer threads, at the cost of a dependency and Linux only.

use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

type Job = Box<dyn FnOnce() + Send>;

pub(crate) struct IoPool {
    tx: Option<Sender<Job>>,
    workers: Vec<JoinHandle<()>>,
}

impl IoPool {
    pub fn new(threads: usize) -> std::io::Result<IoPool> {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let workers = (0..threads.max(1))
            .map(|i| {
                let rx = Arc::clone(&rx);
                std::thread::Builder::new()
                    .name(format!("titan-io-{i}"))
                    .spawn(move || loop {
                        // Hold the lock only while taking a job, not while running it.
                        let job = rx.lock().unwrap_or_else(PoisonError::into_inner).recv();
                        match job {
                            Ok(job) => job(),
                            Err(_) => break, // the pool was dropped
                        }
                    })
            })
            .collect::<std::io::Result<_>>()?;
        Ok(IoPool {
            tx: Some(tx),
            workers,
        })
    }

    /// Queue `job`; if no worker is left to take it, run it on the caller's thread rather than lose it.
    pub fn submit(&self, job: Job) {
        let job = match &self.tx {
            Some(tx) => match tx.send(job) {
                Ok(()) => return,
                Err(mpsc::SendError(job)) => job,
            },
            None => job,
        };
        job();
    }
}

impl Drop for IoPool {
    /// Close the channel and wait for the workers, which finish the jobs already queued.
    fn drop(&mut self) {
        drop(self.tx.take());
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}
