//! Memory hints for the tables packets index. A table of a million flows is looked up at
//! random, so its arrays are worth huge pages: one TLB entry covers 2 MiB instead of 4 KiB.
//! The advice must come before the pages are first written, or they fault in small. And the
//! lookups in them are prefetched ([`prefetch_bytes`]), so that a batch's misses overlap.

/// Bytes from which an array is worth huge pages (one 2 MiB page).
pub const HUGE_PAGE: usize = 2 << 20;

/// An empty vector with room for `n` elements, advised as huge pages before anything is
/// written into it.
pub fn huge_with_capacity<T>(n: usize) -> Vec<T> {
    let v = Vec::with_capacity(n);
    advise_huge_pages(&v);
    v
}

/// `n` copies of `value`, written after the advice (so that they fault in as huge pages).
pub fn huge_vec<T: Clone>(value: T, n: usize) -> Vec<T> {
    let mut v = huge_with_capacity(n);
    v.resize(n, value);
    v
}

/// Advises the kernel to back `v`'s allocation with transparent huge pages, if it is at least
/// [`HUGE_PAGE`] long (a hint: nothing changes if the kernel does not follow it).
pub fn advise_huge_pages<T>(v: &Vec<T>) {
    let bytes = v.capacity().saturating_mul(std::mem::size_of::<T>());
    if bytes < HUGE_PAGE {
        return;
    }
    #[cfg(target_os = "linux")]
    {
        extern "C" {
            fn madvise(
                addr: *mut std::ffi::c_void,
                len: usize,
                advice: std::ffi::c_int,
            ) -> std::ffi::c_int;
        }
        const MADV_HUGEPAGE: std::ffi::c_int = 14;
        const PAGE: usize = 4096;
        let start = (v.as_ptr() as usize).next_multiple_of(PAGE);
        let end = (v.as_ptr() as usize + bytes) & !(PAGE - 1);
        if end > start {
            // SAFETY: `[start, end)` lies within `v`'s live allocation, and MADV_HUGEPAGE only
            // changes how the kernel backs those pages, never their contents; an error (old
            // kernel, THP disabled) is ignored, as the advice is optional.
            unsafe {
                madvise(start as *mut std::ffi::c_void, end - start, MADV_HUGEPAGE);
            }
        }
    }
}

/// Asks the CPU to start loading every cache line of the `len` bytes at `at` (a hint; no-op
/// off x86_64).
#[inline(always)]
pub fn prefetch_bytes<T>(at: &T, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let first = (at as *const T).cast::<i8>();
        // The first and the last byte: `len` is at most a few cache lines' worth, and an
        // entry larger than 64 bytes straddles two lines at most once per 64 bytes.
        let last = first.wrapping_add(len.max(1) - 1);
        // SAFETY: prefetching is a hint that never faults nor changes memory, whatever the
        // address; both addresses are in the live allocation `at` points into anyway. SSE
        // (which has `prefetcht0`) is part of the x86_64 baseline.
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(first);
            _mm_prefetch::<_MM_HINT_T0>(last);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (at, len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advised_vectors_hold_what_plain_ones_do() {
        let big = huge_vec(7u64, HUGE_PAGE);
        assert_eq!(big.len(), HUGE_PAGE);
        assert!(big.iter().all(|&x| x == 7));
        let small = huge_vec(1u8, 3);
        assert_eq!(small, vec![1, 1, 1]);
        let room: Vec<u32> = huge_with_capacity(HUGE_PAGE);
        assert!(room.is_empty() && room.capacity() >= HUGE_PAGE);
    }
}
