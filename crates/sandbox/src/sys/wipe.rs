//! The allocator of every process running airlock's code: the system's, which also wipes each
//! block it frees once a process asks it to ([`wipe_freed_memory`]). A zygote does: its
//! children are copies of its memory, and what it decoded, copied and freed of other
//! executions' requests (policies, arguments, environments) would otherwise still be there,
//! in freed blocks, for a child to read. Off (the default), it is the system's allocator and
//! one relaxed load per free.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, Ordering};

static WIPING: AtomicBool = AtomicBool::new(false);

/// The system's allocator, wiping what is freed while [`WIPING`] is set.
#[derive(Debug)]
pub struct WipingAllocator;

#[global_allocator]
static ALLOCATOR: WipingAllocator = WipingAllocator;

/// From now on (in this process, and in its forks until they say otherwise) every block freed
/// is zeroed first.
pub fn wipe_freed_memory(on: bool) {
    WIPING.store(on, Ordering::Relaxed);
}

/// Blocks of `bytes` or more are mapped on their own, and unmapped when freed
/// (`mallopt(3)`'s `M_MMAP_THRESHOLD`, fixed). Left to itself glibc raises that threshold to
/// the largest block freed (up to 32 MiB), after which such blocks come from the arena of the
/// thread that asked, and a freed one stays there, resident, for that thread's next: a server
/// whose threads each took in one large request holds as much for none (30 answers of 10 MB
/// left 117 MiB behind, and under 3 MiB with it; BENCHMARKS.md). Whether it was set.
pub fn map_large_blocks(bytes: usize) -> bool {
    let Ok(bytes) = libc::c_int::try_from(bytes) else {
        return false;
    };
    // SAFETY: mallopt takes no pointers; it sets the allocator's parameters under its lock.
    unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, bytes) == 1 }
}

/// Zeroes `len` bytes at `ptr` in a way the compiler keeps, though the block is freed next.
///
/// # Safety
/// `ptr` is valid for writes of `len` bytes.
unsafe fn wipe(ptr: *mut u8, len: usize) {
    // SAFETY: the caller's promise; explicit_bzero writes `len` bytes and is never elided.
    unsafe { libc::explicit_bzero(ptr.cast(), len) }
}

// SAFETY: every method hands the layout it got to the system's allocator, which upholds
// GlobalAlloc's contract; wiping writes only within a block the caller still owns.
unsafe impl GlobalAlloc for WipingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's layout, as GlobalAlloc::alloc requires (non-zero size).
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if WIPING.load(Ordering::Relaxed) {
            // SAFETY: `ptr` is a live block of `layout.size()` bytes of ours until freed below.
            unsafe { wipe(ptr, layout.size()) };
        }
        // SAFETY: `ptr` was allocated by the system's allocator with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if !WIPING.load(Ordering::Relaxed) {
            // SAFETY: the caller's block and sizes, as GlobalAlloc::realloc requires.
            return unsafe { System.realloc(ptr, layout, new_size) };
        }
        // The system's realloc frees a moved block as it is: move it ourselves, and wipe the
        // old one as it is freed.
        // SAFETY: `layout.align()` is a valid alignment and `new_size`, rounded up to it, does
        // not overflow (GlobalAlloc::realloc's contract).
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        // SAFETY: a non-zero size (the contract again).
        let new = unsafe { System.alloc(new_layout) };
        if !new.is_null() {
            // SAFETY: both blocks are live and distinct, each at least this long.
            unsafe { std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size)) };
            // SAFETY: the old block is ours, allocated with `layout`, and no longer used.
            unsafe { self.dealloc(ptr, layout) };
        }
        new
    }
}
