//! A fixed pool of I/O threads with three queues: reads someone waits for, reads ahead of need, and the
//! background pass that fills a budget holding the whole model.
//!
//! Why a pool rather than scoped threads per batch: prefetches must outlive the call that issues them, and
//! a layer's misses arrive dozens of times per token, so spawning threads per batch would add tens of
//! microseconds per layer for nothing. Blocking `pread`s on several threads are what keeps several reads in
//! flight; io_uring would do the same with fewer threads, at the cost of a dependency and Linux only.
//!
//! Why several queues: the forward pass issues the next layer's prefetches before this layer's misses (it
//! knows both after this layer's routing), and one queue in arrival order made the misses wait behind them. A
//! worker takes a demand read whenever one is queued, a prefetch only when none is, and a background read
//! only when neither is.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

type Job = Box<dyn FnOnce() + Send>;

/// Whether a caller is blocked on the job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Urgency {
    Demand,
    Ahead,
    /// Nobody will wait for it soon: the warming pass.
    Background,
}

#[derive(Default)]
struct Queues {
    demand: VecDeque<Job>,
    ahead: VecDeque<Job>,
    background: VecDeque<Job>,
    closed: bool,
}

#[derive(Default)]
struct Shared {
    queues: Mutex<Queues>,
    work: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queues> {
        self.queues.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The next job, demand first, background last; `None` once the pool is closed and every queue is empty.
    fn next(&self) -> Option<Job> {
        let mut q = self.lock();
        loop {
            if let Some(job) = q
                .demand
                .pop_front()
                .or_else(|| q.ahead.pop_front())
                .or_else(|| q.background.pop_front())
            {
                return Some(job);
            }
            if q.closed {
                return None;
            }
            q = self.work.wait(q).unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Queue `job` behind the others of its urgency; false, dropping it, once the pool is closed.
    fn submit(&self, job: Job, urgency: Urgency) -> bool {
        let mut q = self.lock();
        if q.closed {
            return false;
        }
        match urgency {
            Urgency::Demand => q.demand.push_back(job),
            Urgency::Ahead => q.ahead.push_back(job),
            Urgency::Background => q.background.push_back(job),
        }
        drop(q);
        self.work.notify_one();
        true
    }
}

/// A handle that queues jobs on the pool without owning its threads, for a thread of its own that issues
/// reads (the warming pass): dropping the pool still stops the workers, and the handle's jobs are refused
/// from then on.
#[derive(Clone)]
pub(crate) struct Submitter(Arc<Shared>);

impl Submitter {
    /// See [`IoPool::submit`]; false once the pool is closed.
    pub fn submit(&self, job: Job, urgency: Urgency) -> bool {
        self.0.submit(job, urgency)
    }
}

pub(crate) struct IoPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl IoPool {
    pub fn new(threads: usize) -> std::io::Result<IoPool> {
        let shared = Arc::new(Shared::default());
        let mut pool = IoPool {
            shared,
            workers: Vec::new(),
        };
        for i in 0..threads.max(1) {
            let shared = Arc::clone(&pool.shared);
            let worker = std::thread::Builder::new()
                .name(format!("titan-io-{i}"))
                .spawn(move || {
                    // The lock is held only while taking a job, not while running it.
                    while let Some(job) = shared.next() {
                        job();
                    }
                });
            // On failure, `pool` is dropped here, which stops the workers already started.
            pool.workers.push(worker?);
        }
        Ok(pool)
    }

    /// Queue `job` behind the others of its urgency.
    pub fn submit(&self, job: Job, urgency: Urgency) {
        // Refused only once the pool is closed, which happens in its `drop`, after every call through `&self`.
        self.shared.submit(job, urgency);
    }

    pub fn submitter(&self) -> Submitter {
        Submitter(Arc::clone(&self.shared))
    }
}

impl Drop for IoPool {
    /// Close the queues and wait for the workers, which finish the jobs already queued.
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.work.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// With the only worker busy, a demand job queued after two prefetches and a background job runs before
    /// them, the background job last, and every queued job still runs when the pool is dropped.
    #[test]
    fn demand_jobs_overtake_queued_prefetches() {
        let pool = IoPool::new(1).unwrap();
        let (started_tx, started) = mpsc::channel();
        let (release, gate) = mpsc::channel::<()>();
        pool.submit(
            Box::new(move || {
                started_tx.send(()).unwrap();
                gate.recv().unwrap();
            }),
            Urgency::Demand,
        );
        started.recv().unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let queued = [
            ("background", Urgency::Background),
            ("ahead 1", Urgency::Ahead),
            ("ahead 2", Urgency::Ahead),
            ("demand", Urgency::Demand),
        ];
        for (name, urgency) in queued {
            let order = Arc::clone(&order);
            pool.submit(Box::new(move || order.lock().unwrap().push(name)), urgency);
        }
        let submitter = pool.submitter();
        release.send(()).unwrap();
        drop(pool);
        assert_eq!(*order.lock().unwrap(), ["demand", "ahead 1", "ahead 2", "background"]);
        // The workers are gone: a handle's job is refused, not queued for nobody.
        assert!(!submitter.submit(Box::new(|| {}), Urgency::Demand));
    }
}
