//! The two futex operations the locks need, shared (no
//! `FUTEX_PRIVATE_FLAG`) so a wake in one process reaches a waiter in
//! another that maps the same page.
//!
//! Without the private flag the kernel keys a futex on a `MAP_SHARED`
//! page by (backing object, offset), the same in every process mapping it;
//! on private memory it keys by (mm, address), which still works within
//! one process. The cost over a private futex is a page lookup in the
//! kernel, paid only on the slow path (a waiter sleeping or a wake).

use core::sync::atomic::AtomicU32;

/// Sleeps while `*word == expected`. Returns on a wake, on a signal, when
/// the word no longer holds `expected` (`EAGAIN`), or spuriously: callers
/// re-check the word in a loop and never read meaning into the return.
#[cfg(target_os = "linux")]
pub fn wait(word: &AtomicU32, expected: u32) {
    wait_until(word, expected, core::ptr::null());
}

/// [`wait`], returning after at most `timeout` as well.
#[cfg(target_os = "linux")]
pub fn wait_timeout(word: &AtomicU32, expected: u32, timeout: std::time::Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    wait_until(word, expected, &ts);
}

#[cfg(target_os = "linux")]
fn wait_until(word: &AtomicU32, expected: u32, timeout: *const libc::timespec) {
    // SAFETY: FUTEX_WAIT reads the aligned u32 behind `word`, which the
    // shared reference keeps alive for the call; `timeout` is null (no
    // timeout) or points to a timespec on the caller's stack that outlives
    // the call; the two trailing arguments are unused by FUTEX_WAIT. Any
    // error (EAGAIN, EINTR, ETIMEDOUT) is fine to ignore because the
    // caller re-checks.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            timeout,
            core::ptr::null::<u32>(),
            0u32,
        );
    }
}

/// Wakes up to `count` waiters sleeping on `word` in any process.
#[cfg(target_os = "linux")]
pub fn wake(word: &AtomicU32, count: i32) {
    // SAFETY: FUTEX_WAKE only uses the address of `word` as a key (it does
    // not dereference it beyond the kernel's own key lookup, which needs
    // the page mapped; the reference guarantees that); the remaining
    // arguments are unused by FUTEX_WAKE.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            count,
            core::ptr::null::<libc::timespec>(),
            core::ptr::null::<u32>(),
            0u32,
        );
    }
}

/// Elsewhere there is no futex: waiting degrades to yielding, which the
/// callers' re-check loops turn into a (slower) spin lock, and waking is a
/// no-op. Correct, but only Linux shares locks across processes.
#[cfg(not(target_os = "linux"))]
pub fn wait(_word: &AtomicU32, _expected: u32) {
    std::thread::yield_now();
}

/// See [`wait`].
#[cfg(not(target_os = "linux"))]
pub fn wait_timeout(_word: &AtomicU32, _expected: u32, _timeout: std::time::Duration) {
    std::thread::yield_now();
}

/// See [`wait`]: nothing sleeps, so nothing needs waking.
#[cfg(not(target_os = "linux"))]
pub fn wake(_word: &AtomicU32, _count: i32) {}

/// Wake "all" for [`wake`].
pub const WAKE_ALL_WAITERS: i32 = i32::MAX;
