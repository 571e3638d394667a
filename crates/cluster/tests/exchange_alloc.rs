//! The backbone's exchange with a node — a layer's request sent, its answer read and delivered — allocates
//! nothing once its buffers have grown, with the log on at `info` as the command line sets it: the per-exchange
//! span and events are at debug and trace, and cost nothing (no formatting, no allocation) while those
//! levels are off. Counted by this test binary's global allocator, on the calling thread only (the worker
//! serving the node runs in this process, on threads of its own).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use titan_engine::experts::{ExpertJob, Experts};
use titan_kernels::Activations;

mod common;

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// Whether this thread's allocations are counted (a const-initialised cell: reading it never allocates).
    static COUNTED: Cell<bool> = const { Cell::new(false) };
}

fn count(n: u64) {
    if COUNTED.with(Cell::get) {
        ALLOCS.fetch_add(n, Relaxed);
    }
}

// SAFETY: every method hands its arguments unchanged to `System` and returns what `System` returns, so
// `Counting` keeps `GlobalAlloc`'s contract exactly as `System` does (every block it hands out comes from
// `System`, and goes back to it); the counter is an atomic and the flag a const-initialised thread-local
// cell, which neither allocate nor unwind.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(1);
        // SAFETY: our caller guarantees `layout` has a non-zero size (`GlobalAlloc::alloc`'s contract), all
        // that `System.alloc` asks.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(1);
        // SAFETY: our caller guarantees `layout` has a non-zero size, all that `System.alloc_zeroed` asks.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(1);
        // SAFETY: our caller guarantees `ptr` is a live block of this allocator with `layout`, which makes it
        // a `System` block (every block of ours is one), and a non-zero `new_size` that does not overflow
        // `isize` when rounded to `layout.align()`: `System.realloc`'s contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: our caller guarantees `ptr` is a live block of this allocator with `layout`, so a block
        // `System` allocated with `layout`: `System.dealloc`'s contract.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

const TOKEN: &[u8] = b"exchange-test-token-0123456789";

#[test]
fn an_exchange_allocates_nothing_with_the_log_at_info() {
    // The command line's subscriber, at its default level.
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
        .with_writer(std::io::sink)
        .finish();
    let _log = tracing::subscriber::set_default(subscriber);

    let (config, cluster) = common::one_node_cluster(TOKEN, true);

    // A decode step's job: one row, two experts, at every MoE layer; the one node holds every expert.
    let x: Vec<f32> = (0..config.n_embd).map(|i| (i as f32 * 0.37).sin()).collect();
    let inputs: Vec<Activations> = (config.dense_lead..config.n_layer)
        .map(|l| {
            let mut a = Activations::new();
            a.quantize(cluster.input_type(l).unwrap(), &x, 1, config.n_embd)
                .unwrap();
            a
        })
        .collect();
    let (ids, rows, starts) = ([1u32, config.n_expert as u32 - 1], [0usize, 0], [0usize, 1, 2]);
    let mut sum = 0f32;
    let mut step = |counted: bool| {
        for (i, input) in inputs.iter().enumerate() {
            let job = ExpertJob {
                layer: config.dense_lead + i,
                input,
                ids: &ids,
                rows: &rows,
                starts: &starts,
            };
            COUNTED.with(|c| c.set(counted));
            let r = cluster.apply(&job, &mut || Ok(()), &mut |_, y| sum += y[0]);
            COUNTED.with(|c| c.set(false));
            r.unwrap();
        }
    };
    for _ in 0..3 {
        step(false);
    }
    for _ in 0..50 {
        step(true);
    }
    assert!(sum.is_finite());
    assert_eq!(ALLOCS.load(Relaxed), 0, "allocations in 50 steps of exchanges");
    assert!(
        cluster.metrics()[0].1.round_trips >= 53 * inputs.len() as u64,
        "the node did not compute every layer: {:?}",
        cluster.metrics()
    );
}
