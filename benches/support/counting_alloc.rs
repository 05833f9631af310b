//! A global allocator that counts live heap bytes, for the benchmarks that print
//! memory figures. A bench installs it with
//! `#[global_allocator] static ALLOCATOR: counting_alloc::Counting = counting_alloc::Counting;`
//! and reads [`live_bytes`] before and after building what it measures.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

pub struct Counting;
static LIVE: AtomicIsize = AtomicIsize::new(0);

/// Heap bytes allocated and not yet freed.
pub fn live_bytes() -> isize {
    LIVE.load(Ordering::Relaxed)
}

// SAFETY: forwards to the system allocator; only counts bytes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
