//! TLB shootdown as an inter-thread handshake (RadixVM §3.3-3.4, §5.3).
//!
//! On hardware, a CPU that removes a translation sends an inter-processor
//! interrupt to every CPU that may cache it and waits until each has
//! flushed its TLB and acknowledged. Here each CPU (an attached thread)
//! has a [`Mailbox`]; the initiator posts a flush request with a sequence
//! number and waits until the target's acknowledged sequence reaches it.
//!
//! Whoever holds a CPU's TLB lock processes its mailbox: the target itself
//! at its next memory access (it checks `posted != acked`, one load of its
//! own line), or, if the target does not get there within
//! [`PROXY_AFTER_SPINS`] polls, the initiator on its behalf. The second
//! case is a hardware IPI taken by a CPU that is inside the kernel
//! (blocked on a lock, waiting for its own shootdown, or idle): its
//! interrupt handler flushes while the interrupted code stays where it
//! is. Without it, a target blocked on the very range lock the initiator
//! holds would never answer. Both are counted (`shootdown_acks_self`,
//! `shootdown_acks_proxy`).
//!
//! ```text
//!  initiator (CPU 0, holds the range lock)      target (CPU 1)
//!  clear PTEs for the range
//!  post {seq 7, range} to mailbox 1
//!  spin: acked(1) >= 7 ?                         access(): lock own TLB
//!    poll own mailbox meanwhile                    posted 7 != acked 6 → drain,
//!                                                  flush range, acked = 7
//!  sees 7 → continues; frees frames
//!  (or, after PROXY_AFTER_SPINS polls: lock TLB 1, drain, flush, acked = 7)
//! ```
//!
//! Frames are freed only after every target has acknowledged, so no TLB
//! can reach a freed frame.
//!
//! The request queue's lock is `xsync`'s because on the per-core backend
//! initiator and targets may be different processes sharing it.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

use xsync::Mutex;

/// Polls of a target's acknowledgement before the initiator flushes on
/// the target's behalf.
pub const PROXY_AFTER_SPINS: u32 = 256;

/// A flush request: a range of virtual page numbers.
pub type FlushRequest = Range<u64>;

/// One CPU's shootdown mailbox.
#[derive(Debug, Default)]
pub struct Mailbox {
    posted: AtomicU64,
    acked: AtomicU64,
    requests: Mutex<Vec<FlushRequest>>,
}

impl Mailbox {
    /// Posts a request; returns its sequence number.
    pub fn post(&self, vpns: FlushRequest) -> u64 {
        let mut requests = self.requests.lock();
        requests.push(vpns);
        // Under the lock, so sequence numbers follow queue order.
        self.posted.fetch_add(1, Ordering::Release) + 1
    }

    /// Whether requests wait.
    pub fn pending(&self) -> bool {
        self.posted.load(Ordering::Acquire) != self.acked.load(Ordering::Relaxed)
    }

    /// Whether request `seq` was processed.
    pub fn acked(&self, seq: u64) -> bool {
        self.acked.load(Ordering::Acquire) >= seq
    }

    /// Takes every waiting request and calls `flush` on each, then
    /// acknowledges them. The caller holds the CPU's TLB lock.
    pub fn drain(&self, mut flush: impl FnMut(&FlushRequest)) {
        let (requests, seq) = {
            let mut queue = self.requests.lock();
            (
                std::mem::take(&mut *queue),
                self.posted.load(Ordering::Acquire),
            )
        };
        for request in &requests {
            flush(request);
        }
        // Release: the flush happens before the initiator sees the ack.
        self.acked.fetch_max(seq, Ordering::Release);
    }
}

/// Iterates the CPU ids in a set.
pub fn cpus_in(mut set: u64) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        if set == 0 {
            None
        } else {
            let cpu = set.trailing_zeros() as usize;
            set &= set - 1;
            Some(cpu)
        }
    })
}
