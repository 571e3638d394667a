//! Keeping the thread pool's workers awake between parallel regions.
//!
//! A decode step enters the pool several times per layer, for regions of tens to hundreds of
//! microseconds, with a few microseconds of one-thread work (a norm, the routing) between them.
//! Left alone, an idle rayon worker goes to sleep after some thirty `sched_yield`s, and waking it
//! for the next region costs a futex call — on a virtual machine also an interrupt to a halted
//! vCPU. On a 2-core VM that was a tenth of a decode step, and the reason two threads gained less
//! over one than llama.cpp's two did: its threads poll between graph nodes instead of sleeping.
//!
//! So every parallel region first calls [`stay_warm`]. Until no region has started for
//! [`LINGER`], the pool's other workers poll for work (rayon's `yield_now`, which also steals from
//! the thread that entered the region) and give the core to any other runnable thread (an I/O
//! thread reading experts) while there is none; then they go back to rayon and sleep as before.
//! Which thread runs a task never changes its result (the determinism contract), so this moves
//! time only.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long the workers poll after the last region started: longer than the one-thread gaps of a
/// decode step, shorter than anything a user would notice as a busy core after the work is done.
const LINGER: Duration = Duration::from_millis(2);

/// Keeps the current pool's other workers polling for work for the next [`LINGER`]; call it before
/// entering a parallel region. Costs a clock read when they already are.
pub fn stay_warm() {
    static POOL: Warmth = Warmth::new(LINGER);
    if polling().load(Relaxed) {
        POOL.stay_warm();
    }
}

/// Turns polling on or off for the rest of the process (workers already polling stop within
/// [`LINGER`]). Off, idle workers sleep as rayon's do: less CPU spent for nothing (a laptop on
/// battery), slower regions. `TITAN_POLL=0` in the environment turns it off from the start.
pub fn set_polling(on: bool) {
    polling().store(on, Relaxed);
}

fn polling() -> &'static AtomicBool {
    static ON: OnceLock<AtomicBool> = OnceLock::new();
    ON.get_or_init(|| AtomicBool::new(std::env::var_os("TITAN_POLL").is_none_or(|v| v != "0")))
}

/// When the workers of a pool stop polling, and how many do.
struct Warmth {
    linger: Duration,
    /// Nanoseconds since [`epoch`] until which the workers poll.
    until: AtomicU64,
    /// Workers polling now (or about to).
    pollers: AtomicUsize,
}

impl Warmth {
    const fn new(linger: Duration) -> Self {
        Self {
            linger,
            until: AtomicU64::new(0),
            pollers: AtomicUsize::new(0),
        }
    }

    fn stay_warm(&'static self) {
        self.until.fetch_max(now() + self.linger.as_nanos() as u64, Relaxed);
        // The calling thread, when it is one of the pool's, runs its share of the region itself.
        let others = rayon::current_num_threads() - usize::from(rayon::current_thread_index().is_some());
        let mut n = self.pollers.load(Relaxed);
        while n < others {
            match self.pollers.compare_exchange_weak(n, n + 1, Relaxed, Relaxed) {
                Ok(_) => {
                    rayon::spawn(|| self.poll());
                    n += 1;
                }
                Err(seen) => n = seen,
            }
        }
    }

    /// A worker's polling: runs whatever work the pool has until the deadline passes with none.
    fn poll(&self) {
        while now() < self.until.load(Relaxed) {
            if rayon::yield_now() != Some(rayon::Yield::Executed) {
                std::thread::yield_now();
            }
        }
        self.pollers.fetch_sub(1, Relaxed);
    }
}

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn now() -> u64 {
    epoch().elapsed().as_nanos() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;

    #[test]
    fn the_other_workers_poll_while_regions_start_and_stop_after_the_linger() {
        // A linger long enough that a loaded machine's scheduling cannot outlast it.
        const LINGER: Duration = Duration::from_millis(200);
        static WARMTH: Warmth = Warmth::new(LINGER);
        let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build().unwrap();
        pool.install(|| {
            let t = Instant::now();
            let (mut regions, mut shared) = (0, 0);
            while t.elapsed() < 2 * LINGER {
                WARMTH.stay_warm();
                assert_eq!(WARMTH.pollers.load(Relaxed), 2, "the two other workers poll");
                let threads = std::sync::Mutex::new(std::collections::HashSet::new());
                (0..16).into_par_iter().for_each(|_| {
                    threads.lock().unwrap().insert(rayon::current_thread_index());
                    std::thread::sleep(Duration::from_micros(500));
                });
                regions += 1;
                shared += usize::from(threads.lock().unwrap().len() > 1);
            }
            // Most regions, not every one: on a loaded machine (or under qemu) a polling worker can be
            // descheduled for a whole region.
            assert!(2 * shared >= regions, "{shared} of {regions} regions were shared");
        });
        let t = Instant::now();
        while WARMTH.pollers.load(Relaxed) > 0 {
            assert!(
                t.elapsed() < 25 * LINGER,
                "the pollers go on polling with no region started"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(
            t.elapsed() >= LINGER / 2,
            "the pollers stopped before the linger was over"
        );
    }
}
