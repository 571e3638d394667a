//! The `proto` fuzz target's body, shared by `fuzz/fuzz_targets/proto.rs` and
//! `tests/fuzz_corpus.rs`: a frame body decoded as each data-plane message a node or the backbone
//! decodes from its peer. The first bytes (through `arbitrary`) choose the model shape the receiver
//! checks against and the message; the rest is the body.

use arbitrary::Unstructured;
use titan_cluster::proto::{decode_output, Compute, Hello, Shape, Welcome};

pub fn run(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let mut shape = || -> arbitrary::Result<Shape> {
        Ok(Shape {
            n_layer: u.int_in_range(1..=4)?,
            n_expert: u.int_in_range(1..=16)?,
            n_embd: *u.choose(&[32, 64, 256])?,
        })
    };
    let Ok(shape) = shape() else { return };
    let Ok(message) = u.int_in_range(0..=4u8) else {
        return;
    };
    let counts: Vec<usize> = match message {
        1 => (0..u.int_in_range(0..=8u8).unwrap_or(0))
            .map_while(|_| u.int_in_range(0..=4).ok())
            .collect(),
        _ => Vec::new(),
    };
    let body = u.take_rest();
    match message {
        0 => compute(body, shape),
        1 => {
            let mut out = Vec::new();
            if decode_output(body, counts.iter().copied(), shape.n_embd, &mut out).is_ok() {
                assert_eq!(out.len(), counts.iter().sum::<usize>() * shape.n_embd);
            }
        }
        // The JSON a node reads first, the backbone's answer, and a node's counters.
        2 => drop(serde_json::from_slice::<Hello>(body)),
        3 => drop(serde_json::from_slice::<Welcome>(body)),
        _ => drop(serde_json::from_slice::<serde_json::Value>(body)),
    }
}

/// A Compute request as the worker decodes it (into a request reused between frames), and what a
/// decoded request promises the expert code: every id and row in range, ids ascending.
fn compute(body: &[u8], shape: Shape) {
    let mut c = Compute::default();
    let first = c.decode(body, shape).is_ok();
    assert_eq!(
        c.decode(body, shape).is_ok(),
        first,
        "decoding into a used request changed the outcome"
    );
    if !first {
        return;
    }
    let job = c.job();
    assert!(job.layer < shape.n_layer);
    assert_eq!(job.input.cols(), shape.n_embd);
    assert_eq!(job.starts.len(), job.ids.len() + 1);
    assert!(job.ids.windows(2).all(|w| w[0] < w[1]) && job.ids.iter().all(|&id| (id as usize) < shape.n_expert));
    assert!(job.rows.iter().all(|&r| r < job.input.rows()));
    assert!(job.starts.windows(2).all(|w| w[0] <= w[1]) && job.starts.last() == Some(&job.rows.len()));
}
