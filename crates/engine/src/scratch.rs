//! Keeping the forward pass's working buffers from one call to the next, so that decoding a token
//! allocates nothing once a batch of its size has run.
//!
//! Buffers of plain values are fields of a scratch struct that lives with the sequence and are resized
//! for each batch (shrinking keeps the capacity). Lists of borrowed items (matmul jobs, expert views)
//! cannot outlive their borrows, so they are kept empty and [`recycle`]d.

/// `v`, emptied, as a `Vec` of another element type, keeping its allocation when the two types have
/// the same layout: a list of `MatmulJob<'a>` becomes an empty list of `MatmulJob<'static>` to keep,
/// and back again for the next call's borrows. (The standard library collects a `Vec`'s own iterator in
/// place; `tests/alloc.rs` notices if it ever stops doing so.)
pub fn recycle<T, U>(mut v: Vec<T>) -> Vec<U> {
    v.clear();
    v.into_iter().map(|_| unreachable!("the vector was emptied")).collect()
}

/// The first `n` elements of `v`, default-constructing any it does not have yet (one buffer per expert
/// of a batch, say: the buffers of the largest batch so far are kept).
pub(crate) fn slots<T: Default>(v: &mut Vec<T>, n: usize) -> &mut [T] {
    if v.len() < n {
        v.resize_with(n, T::default);
    }
    &mut v[..n]
}
