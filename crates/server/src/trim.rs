//! Giving freed connection memory back to the system.
//!
//! A connection's buffers, task and registry entry come from the C heap
//! (glibc malloc). When thousands of clients disconnect, their memory is
//! free but not returned: it lies between chunks still in use, so the
//! heap's top never shrinks and RSS stays at its high-water mark (10,000
//! connections opened and closed left 100+ MB behind). Redis has the same
//! problem and jemalloc's decay; here one background thread calls
//! `malloc_trim(0)`, which hands every free page of every arena back with
//! `MADV_DONTNEED`, at most once per [`TRIM_PERIOD`] and only after at
//! least [`TRIM_AFTER_CLOSES`] connections closed since the last trim, so
//! a steady server never pays for it, and once more when closes stop (the
//! last few hundred of a mass disconnect). It also trims once each time the
//! server falls quiet (commands ran during one period and none during the
//! next): the buffers and temporaries of a burst of requests are free by
//! then but sit in the worker threads' arenas, which glibc returns only
//! from the top of each heap (after `memlab server --quick`'s churn, the
//! arenas held about 1 MiB, 2 % of the live data). The store gives its own
//! memory back at the same moment (its idle-time release). The thread
//! holds only a weak reference to the server state and ends with it.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::state::Shared;

/// How often the trimmer looks at the close count.
pub const TRIM_PERIOD: Duration = Duration::from_secs(1);
/// Closes since the last trim that make the next look trim.
pub const TRIM_AFTER_CLOSES: u64 = 256;

/// Start the trimmer thread for `shared`.
pub fn start(shared: &Arc<Shared>) -> std::io::Result<()> {
    let weak: Weak<Shared> = Arc::downgrade(shared);
    std::thread::Builder::new()
        .name("nibble-trim".into())
        .spawn(move || {
            // Commands seen at the last look, and whether the period
            // before it ran any.
            let (mut seen, mut busy) = (0u64, false);
            // Closes counted at the last look.
            let mut closed_seen = 0u64;
            loop {
                std::thread::sleep(TRIM_PERIOD);
                let Some(shared) = weak.upgrade() else { return };
                if shared.stopping.load(Ordering::Acquire) {
                    return;
                }
                let commands = shared.totals().commands;
                let fell_quiet = busy && commands == seen;
                busy = commands != seen;
                seen = commands;
                // Closes that stopped: the last ones (fewer than
                // TRIM_AFTER_CLOSES after the previous trim) are freed too.
                let closed = shared.closed_since_trim.load(Ordering::Relaxed);
                let closes_fell_quiet = closed > 0 && closed == closed_seen;
                closed_seen = closed;
                if fell_quiet || closes_fell_quiet || closed >= TRIM_AFTER_CLOSES {
                    shared.closed_since_trim.store(0, Ordering::Relaxed);
                    closed_seen = 0;
                    trim_heap();
                }
            }
        })
        .map(drop)
}

/// Return the C heap's free pages to the system (glibc; elsewhere a
/// no-op).
pub fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory of the allocator's
    // own arenas; it takes their locks and touches no live allocation.
    unsafe {
        libc::malloc_trim(0);
    }
}
