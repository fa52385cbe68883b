//! Generating packets does not allocate: after `Synthetic::new`, `recv` only writes into the
//! batch's buffers.

use flowstate_io::synth::{Profile, SynthConfig, Synthetic};
use flowstate_io::{PacketBatch, Source};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// Counts allocations made by the current thread while `COUNTING` is set.
struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCS.with(|a| a.set(a.get() + 1));
        }
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCS.with(|a| a.set(a.get() + 1));
        }
        // SAFETY: as for `alloc` and `dealloc`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations made while receiving the whole trace of `cfg`.
fn allocations(cfg: SynthConfig) -> u64 {
    let mut synth = Synthetic::new(cfg).unwrap();
    let mut batch = PacketBatch::new(32, 2048);
    ALLOCS.with(|a| a.set(0));
    COUNTING.with(|c| c.set(true));
    while synth.recv(&mut batch).unwrap() > 0 {}
    COUNTING.with(|c| c.set(false));
    ALLOCS.with(Cell::get)
}

#[test]
fn receiving_does_not_allocate() {
    for profile in Profile::ALL {
        let cfg = SynthConfig {
            flows: 2_000,
            packets: 100_000,
            seed: 1,
            ipv6_share: 0.3,
            ..SynthConfig::new(profile)
        };
        assert_eq!(allocations(cfg), 0, "{profile}");
    }
    // Far more flows than are active at once: slots are reused.
    for profile in [Profile::Short, Profile::Mixed] {
        let cfg = SynthConfig {
            flows: 10_000,
            packets: 300_000,
            concurrency: 300,
            ..SynthConfig::new(profile)
        };
        assert_eq!(allocations(cfg), 0, "{profile}, concurrency 300");
    }
    let mut zipf = SynthConfig::new(Profile::Uniform);
    zipf.zipf_s = 1.2;
    assert_eq!(allocations(zipf), 0, "uniform with Zipf skew");
}
