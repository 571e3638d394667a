//! Decoding a token allocates nothing: the forward pass's buffers live in the `Sequence` and are reused.
//! Counted by this test binary's global allocator, whose counters see every thread (a `realloc` counts
//! as an allocation).

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use common::*;
use titan_engine::sampler::argmax;
use titan_engine::{Model, Outputs};

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

// SAFETY: every method hands its arguments unchanged to `System` and returns what `System` returns, so
// `Counting` keeps `GlobalAlloc`'s contract exactly as `System` does (every block it hands out comes from
// `System`, and goes back to it); the counters are atomics, which neither allocate nor unwind.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Relaxed);
        BYTES.fetch_add(layout.size() as u64, Relaxed);
        // SAFETY: our caller guarantees `layout` has a non-zero size (`GlobalAlloc::alloc`'s contract), all
        // that `System.alloc` asks.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Relaxed);
        BYTES.fetch_add(layout.size() as u64, Relaxed);
        // SAFETY: our caller guarantees `layout` has a non-zero size, all that `System.alloc_zeroed` asks.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Relaxed);
        BYTES.fetch_add(new_size as u64, Relaxed);
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

fn counts() -> (u64, u64) {
    (ALLOCS.load(Relaxed), BYTES.load(Relaxed))
}

/// One model per architecture (qwen2moe has a shared expert), and both SIMD-kernel formats.
const FILES: &[&str] = &[
    "qwen3moe/q8_0.gguf",
    "qwen3moe/q4_0.gguf",
    "olmoe/q8_0.gguf",
    "qwen2moe/q8_0.gguf",
    "mixtral/q4_0.gguf",
    "qwen35moe/q8_0.gguf",
    "deepseek3/q8_0.gguf",
    "gpt-oss/q8_0.gguf",
    "glm4moe/q8_0.gguf",
    "minimax-m2/q4_0.gguf",
    "llama4/q8_0.gguf",
    "deepseek4/mxfp4_moe.gguf",
];

/// (allocations, bytes) of each of `steps` greedily decoded tokens after `prompt`.
fn decode(model: &Model, prompt: &[u32], steps: usize) -> Vec<(u64, u64)> {
    let mut seq = model.new_sequence(prompt.len() + steps);
    let mut next = argmax(model.forward(prompt, 0, &mut seq, Outputs::Last).unwrap());
    let mut per_token = Vec::with_capacity(steps);
    for pos in prompt.len()..prompt.len() + steps {
        let (a0, b0) = counts();
        next = argmax(model.forward(&[next], pos, &mut seq, Outputs::Last).unwrap());
        let (a1, b1) = counts();
        per_token.push((a1 - a0, b1 - b0));
    }
    per_token
}

#[test]
fn decoding_a_token_allocates_nothing() {
    // Decode on a worker of a pool, as a server's decode loop would run: a parallel region entered from
    // outside the pool goes through rayon's injector queue, which allocates a block every 63 regions
    // (rayon's allocation, not the engine's; printed below for the record).
    let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
    // The counters are global, and a pool's thread allocates its queues as it starts: wait until every
    // thread of both pools has (a broadcast runs on each of them).
    pool.broadcast(|_| ());
    rayon::broadcast(|_| ());
    // Idle workers poll between parallel regions, and after 2 ms without one they stop; the next region
    // restarts them, boxing a rayon job each (the pool's allocation, not the engine's). A loaded machine
    // can stall a token that long, so the count is taken with them off.
    titan_kernels::set_polling(false);
    for f in FILES {
        let model = Model::load(fixtures().join(f)).unwrap();
        let prompt = model
            .tokenizer
            .encode("The quick brown fox jumps over the lazy dog", true, false);
        let inside = pool.install(|| decode(&model, &prompt, 8));
        let outside = decode(&model, &prompt, 8);
        println!("{f}: (allocations, bytes) per decoded token: on a pool worker {inside:?}; from outside the pool {outside:?}");
        // The prompt sized every buffer (a batch of one needs no more than a batch of several).
        assert!(
            inside.iter().all(|&(n, _)| n == 0),
            "{f}: decoding allocates: {inside:?}"
        );
    }
}
