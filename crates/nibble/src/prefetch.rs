//! Software prefetch: start loading a cache line the thread will soon use.
//!
//! A prefetch is only a hint. It never faults (an address outside any
//! mapping is simply dropped by the CPU), so it is safe to issue for any
//! address, including one computed from racy metadata.

/// Bring the cache line holding `p` towards the L1 cache.
#[inline(always)]
pub fn line(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 is part of SSE, which every x86-64 CPU has; it
    // does not access memory architecturally and cannot fault, whatever
    // the address.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p as *const i8);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
