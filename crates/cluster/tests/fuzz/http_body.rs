//! The `http_body` fuzz target's body, shared by `fuzz/fuzz_targets/http_body.rs` and
//! `tests/fuzz_corpus.rs`: what the slice endpoint reads from a request — a join's JSON body (then
//! the plan made from the budgets it declares), a slice query string, a `Range` header — and the
//! join's answer a node reads back. The first bytes (through `arbitrary`) choose which, and the
//! other nodes' side of the plan; the rest is the untrusted text.

use arbitrary::Unstructured;
use axum::extract::Query;
use axum::http::{header, HeaderMap, HeaderValue, Uri};
use titan_cluster::slice_http::{byte_range, Assignment, Join, SliceQuery};
use titan_cluster::{Placement, Plan};

pub fn run(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let mut prefix = || -> arbitrary::Result<(u8, usize, usize, u64, Placement, usize, u64)> {
        Ok((
            u.int_in_range(0..=3)?,
            u.int_in_range(1..=8)?,
            u.int_in_range(1..=16)?,
            u.arbitrary()?,
            *u.choose(&[Placement::Contiguous, Placement::Interleaved])?,
            u.int_in_range(1..=2)?,
            u.arbitrary()?,
        ))
    };
    let Ok((what, n_layer, n_expert, other_budget, placement, replicas, len)) = prefix() else {
        return;
    };
    let text = u.take_rest();
    match what {
        0 => {
            // The handler plans once every node has joined: this node and one other.
            let Ok(j) = Join::parse(text) else { return };
            let budgets = [j.budget, other_budget];
            let Ok(plan) = Plan::new(n_layer, 0, n_expert, &budgets, placement, replicas) else {
                return;
            };
            for (l, e) in (0..n_layer).flat_map(|l| (0..n_expert).map(move |e| (l, e))) {
                let owners = plan.owners(l, e);
                assert_eq!(owners.len(), replicas);
                assert!(owners.iter().all(|&n| n < budgets.len()));
            }
        }
        1 => {
            let Ok(uri) = format!("/v1/slice?{}", String::from_utf8_lossy(text)).parse::<Uri>() else {
                return;
            };
            let Ok(Query(q)) = Query::<SliceQuery>::try_from_uri(&uri) else {
                return;
            };
            if let Some(spec) = q.spec() {
                assert!(spec.layers.start() <= spec.layers.end() && spec.experts.start() <= spec.experts.end());
            }
        }
        2 => {
            let Ok(value) = HeaderValue::from_bytes(text) else {
                return;
            };
            let mut headers = HeaderMap::new();
            headers.insert(header::RANGE, value);
            if let Ok(Some((start, end))) = byte_range(&headers, len) {
                assert!(start < end && end <= len, "range {start}..{end} of {len} bytes");
            }
        }
        // What a node reads back from the backbone (`fetch`): UTF-8 text, then JSON.
        _ => {
            if let Ok(s) = std::str::from_utf8(text) {
                if let Ok(a) = serde_json::from_str::<Assignment>(s) {
                    drop(a.checked());
                }
            }
        }
    }
}
