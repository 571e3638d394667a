//! A heap buffer whose start address is aligned to the store alignment.
//!
//! Not a `Vec<u8>`: a Vec's allocation is only aligned to 1, and O_DIRECT reads need the destination
//! address (not just the file offset and length) aligned to the device's logical block size; a Vec must
//! also be freed with the layout it was allocated with, so it cannot adopt an over-aligned allocation.

use std::alloc::{self, Layout};
use std::ptr::NonNull;

pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    /// The layout it was allocated with (its size is at least 1), needed again to free it.
    layout: Layout,
}

// SAFETY: the buffer owns its allocation exclusively, like a Box<[u8]>.
unsafe impl Send for AlignedBuf {}
// SAFETY: `&AlignedBuf` gives out only `&[u8]`.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes starting at a multiple of `align` (a power of two).
    /// `None` if the layout is invalid or the allocation fails.
    pub fn zeroed(len: usize, align: usize) -> Option<AlignedBuf> {
        // The allocator may not be given a zero size; a one-byte allocation keeps `ptr` real.
        let layout = Layout::from_size_align(len.max(1), align).ok()?;
        // SAFETY: the layout has a non-zero size. Zeroed rather than uninitialised so the bytes are valid
        // to view as `&[u8]` before a read fills them; for large buffers the allocator maps fresh zero
        // pages from the kernel, so the zeroing costs nothing extra.
        let ptr = NonNull::new(unsafe { alloc::alloc_zeroed(layout) })?;
        Some(AlignedBuf { ptr, len, layout })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` points to at least `len` initialised (zeroed, then written) bytes that we own.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with exactly this layout, and freed only here.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "AlignedBuf({} bytes, aligned to {})",
            self.len,
            self.layout.align()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_zeroed_and_writable() {
        for (len, align) in [(0, 512), (1, 4096), (12_345, 4096), (1 << 20, 65_536)] {
            let mut b = AlignedBuf::zeroed(len, align).unwrap();
            assert_eq!(b.as_slice().as_ptr() as usize % align, 0);
            assert_eq!(b.len(), len);
            assert!(b.as_slice().iter().all(|&x| x == 0));
            b.as_mut_slice().fill(7);
            assert!(b.as_slice().iter().all(|&x| x == 7));
        }
        assert!(
            AlignedBuf::zeroed(16, 3).is_none(),
            "alignment must be a power of two"
        );
    }
}
