//! Where a run's time goes and how many weight bytes it touches, counted with relaxed atomics so the
//! forward pass (which takes `&self`) can count without locks.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Norm, q/k/v projections, RoPE, attention over the cache, output projection.
    Attention,
    /// Router logits and top-k.
    Router,
    /// Routed and shared experts, and their combination.
    Experts,
    /// Final norm and LM head (and the embedding lookup).
    Head,
    /// The token mixers' input projections (q/k/v, linear attention's, latent attention's): the dense
    /// products a cluster splits by output rows, timed apart from the rest of [`Phase::Attention`].
    Projections,
}

pub const PHASES: [Phase; 5] = [
    Phase::Attention,
    Phase::Projections,
    Phase::Router,
    Phase::Experts,
    Phase::Head,
];

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Attention => "attention",
            Phase::Router => "router",
            Phase::Experts => "experts",
            Phase::Head => "head",
            Phase::Projections => "projections",
        }
    }
}

#[derive(Default)]
pub struct Stats {
    phase_ns: [AtomicU64; 5],
    weight_bytes: AtomicU64,
    experts_run: AtomicU64,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct StatsSnapshot {
    pub phase: [Duration; 5],
    /// Weight bytes read by the forward passes (each matrix counted once per pass, each active expert once).
    pub weight_bytes: u64,
    /// Routed experts computed, each once per layer per pass however many rows chose it.
    pub experts_run: u64,
}

impl Stats {
    /// Time `f` and add it to `phase`.
    pub fn time<T>(&self, phase: Phase, f: impl FnOnce() -> T) -> T {
        let t = Instant::now();
        let r = f();
        self.phase_ns[phase as usize].fetch_add(t.elapsed().as_nanos() as u64, Relaxed);
        r
    }

    /// Time `f` as `phase`, and not as `outer`, whose timer runs around it.
    pub fn time_inside<T>(&self, phase: Phase, outer: Phase, f: impl FnOnce() -> T) -> T {
        let t = Instant::now();
        let r = f();
        let ns = t.elapsed().as_nanos() as u64;
        self.phase_ns[phase as usize].fetch_add(ns, Relaxed);
        // Wrapping: the outer timer adds its whole span when it ends, after this.
        self.phase_ns[outer as usize].fetch_sub(ns, Relaxed);
        r
    }

    pub fn add_bytes(&self, n: u64) {
        self.weight_bytes.fetch_add(n, Relaxed);
    }

    pub fn add_experts(&self, n: u64) {
        self.experts_run.fetch_add(n, Relaxed);
    }

    pub fn snapshot(&self) -> StatsSnapshot {
        let mut s = StatsSnapshot {
            weight_bytes: self.weight_bytes.load(Relaxed),
            experts_run: self.experts_run.load(Relaxed),
            ..Default::default()
        };
        for (d, ns) in s.phase.iter_mut().zip(&self.phase_ns) {
            *d = Duration::from_nanos(ns.load(Relaxed));
        }
        s
    }
}

impl StatsSnapshot {
    pub fn add(&mut self, other: &StatsSnapshot) {
        self.weight_bytes += other.weight_bytes;
        self.experts_run += other.experts_run;
        for (a, b) in self.phase.iter_mut().zip(&other.phase) {
            *a += *b;
        }
    }

    /// The counts between an earlier snapshot and this one.
    pub fn since(&self, earlier: &StatsSnapshot) -> StatsSnapshot {
        let mut s = StatsSnapshot {
            weight_bytes: self.weight_bytes - earlier.weight_bytes,
            experts_run: self.experts_run - earlier.experts_run,
            ..Default::default()
        };
        for ((d, now), then) in s.phase.iter_mut().zip(&self.phase).zip(&earlier.phase) {
            *d = *now - *then;
        }
        s
    }
}
