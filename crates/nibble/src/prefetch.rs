//! Software prefetch: start loading a cache line the thread will soon use.
//!
//! A prefetch is only a hint. It never faults (an address outside any
//! mapping is simply dropped by the CPU), so it is safe to issue for any
//! address, including one computed from racy metadata.

#[cfg(target_arch = "x86_64")]
use core::arch::x86_64::_MM_HINT_T0;
// The intrinsic's value, so that the hint name exists everywhere.
#[cfg(not(target_arch = "x86_64"))]
const _MM_HINT_T0: i32 = 3;

/// An SSE prefetch of the line holding `p` with locality hint `HINT`.
#[inline(always)]
fn sse_prefetch<const HINT: i32>(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHh is part of SSE, which every x86-64 CPU has; it
    // does not access memory architecturally and cannot fault, whatever
    // the address.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<HINT>(p as *const i8);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Bring the cache line holding `p` towards the L1 cache.
#[inline(always)]
pub fn line(p: *const u8) {
    sse_prefetch::<_MM_HINT_T0>(p);
}

/// Bring the cache line holding `p` towards the L1 cache in the exclusive
/// state, ready to be written (`PREFETCHW`): a store into it then need not
/// wait for the line's read-for-ownership. CPUs without the instruction
/// decode it as a no-op.
#[inline(always)]
pub fn line_for_write(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHW does not access memory architecturally and cannot
    // fault, whatever the address; it reads no registers but `p` and
    // changes no flags.
    unsafe {
        core::arch::asm!("prefetchw [{0}]", in(reg) p, options(nostack, preserves_flags, readonly));
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
