//! Bulk expiry: segments whose objects have all expired are freed whole
//! (Segcache, Yang et al., NSDI'21 §4.2 "proactive expiration"; the log
//! and its epochs are the dissertation's §4.4).
//!
//! ```text
//!  every worker step, when a candidate's earliest expiry is due (and at least every EXPIRY_RESCAN_MS):
//!    worker 0 of a node: close TTL heads whose latest expiry has passed (module `log`)
//!    closed candidate, epoch past its closing stamp:
//!      latest expiry passed  ─ sweep it (the compaction sweep: per object, under its bucket
//!                              lock, unlink the entry only if it still names this location)
//!                              ─ retire(now) ─ blocks freed once the epoch passes
//!      earliest passed only  ─ a TTL head's segment within its bucket width: wait for the latest
//!                            ─ else a mixed segment: unlink its expired objects in place (dead
//!                              mark), earliest expiry moved past the next one and at least the
//!                              segment's wait ahead (MIXED_RESCAN_MS, doubling up to
//!                              MIXED_RESCAN_MAX_MS while reads find under an eighth expired)
//! ```
//!
//! Every segment records the earliest and latest expiry of the objects
//! written into it (`SegInfo::min_expiry_ms`, `max_expiry_ms`, raised at
//! every append, relocation, in-place overwrite and expiry change, under
//! the head's or the bucket's lock; an object without an expiry makes the
//! latest `u64::MAX`). With TTL placement (module `log`), writes with an
//! expiry go to TTL-bucket heads, so most segments holding them expire
//! whole: the pass reads only such a segment (its headers and keys) to
//! unlink its entries from the index, and gives it back with the same
//! epoch-deferred release compaction uses, so a reader copying one of its
//! objects never sees the bytes reused. An entry is unlinked only if the
//! index still points at exactly this object, so a newer version written
//! elsewhere is never removed; an object whose expiry was moved later
//! after the segment was judged (EXPIRE, or a Nibble-2 overwrite) is
//! relocated instead, as compaction would.
//!
//! Objects with an expiry can also sit in segments with unexpired ones
//! (placement off, expiry set by EXPIRE or kept by SET KEEPTTL, survivors
//! of compaction): once such a segment's earliest expiry passes, the pass
//! unlinks the expired objects it holds (marking them dead, like a
//! delete) so that the index stops counting them (`Store::len`) within
//! about a second, as Redis's active expiry does, and compaction sees
//! their bytes as dead. That reads the segment, which placement avoids:
//! `expiry_bytes_read` counts both, and `memlab expire` compares them. A
//! segment whose reads find little expired (persistent keys with a few
//! EXPIREd ones) is read less and less often (its wait doubles up to a
//! minute); such keys still never show: reads, SCAN and the server's
//! DBSIZE skip expired items. A TTL head's segment is never read early:
//! its objects expire within one bucket width of each other, so the pass
//! waits for its latest expiry and reads it once.

use std::sync::atomic::Ordering;

use epoch::EpochScheme;

use crate::memory::{loc_of, Memory, SegId, SegState, BLOCK_BYTES};
use crate::store::Inner;

use super::{sweep, Candidate, Rule, WorkerState};

/// A worker looks over its candidates for expired segments at least this
/// often (ms), and whenever the earliest expiry it knows of is due.
pub(super) const EXPIRY_RESCAN_MS: u64 = 100;
/// A mixed segment's expired objects are unlinked at most this often
/// (ms): its earliest expiry is moved at least this far ahead.
const MIXED_RESCAN_MS: u64 = 500;
/// While reads of a mixed segment find less than `1 / MIXED_YIELD_DIVISOR`
/// of it expired, its wait doubles, up to this (ms): a segment of
/// persistent keys with a few expiring ones (SET then EXPIRE) is not read
/// twice a second for each of them.
const MIXED_RESCAN_MAX_MS: u64 = 60_000;
/// See `MIXED_RESCAN_MAX_MS`.
const MIXED_YIELD_DIVISOR: u64 = 8;
/// Bytes of mixed segments one pass reads at most; the rest wait for the
/// next step (a few milliseconds later).
const MIXED_PASS_MAX_BYTES: u64 = 16 << 20;

/// A candidate due for the pass.
struct Due {
    seg: SegId,
    /// Its latest expiry has passed: free it whole.
    whole: bool,
    /// Its earliest expiry when judged.
    min_expiry_ms: u64,
    /// Its wait before the next mixed read (`SegMeta::mixed_backoff_ms`).
    backoff_ms: u64,
    used: u64,
    cap_blocks: usize,
}

/// One expiry pass over a worker's candidates `st` at `now_ms`: free
/// expired segments, unlink expired objects of mixed segments (the
/// caller closed the expired TTL heads). Sets `st.next_expiry_ms`.
/// Returns whether a segment was retired.
pub(super) fn expire_once(inner: &Inner, st: &mut WorkerState, now_ms: u64) -> bool {
    let mem = &inner.mem;
    st.last_expiry_scan_ms = now_ms;
    let mut next = u64::MAX;
    let mut due = Vec::new();
    for &seg in st.cands.iter() {
        let info = mem.seg(seg);
        let min = info.min_expiry_ms.load(Ordering::Acquire);
        if min > now_ms {
            next = next.min(min);
            continue;
        }
        let max = info.max_expiry_ms.load(Ordering::Acquire);
        let m = info.meta.lock();
        if m.state != SegState::Closed {
            continue;
        }
        if !inner.epochs.safe_to_reclaim(m.closed_at) {
            // Appends into it may still be publishing: look again at the
            // next step.
            next = now_ms;
            continue;
        }
        let whole = max <= now_ms;
        if !whole && max <= m.ttl_span_end_ms {
            // A TTL head's segment: it expires whole within a bucket
            // width of its first object; reading it earlier would only
            // read it twice.
            next = next.min(max);
            continue;
        }
        due.push(Due {
            seg,
            whole,
            min_expiry_ms: min,
            backoff_ms: m.mixed_backoff_ms.max(MIXED_RESCAN_MS),
            used: m.used as u64,
            cap_blocks: m.blocks.len(),
        });
    }
    let mut retired_any = false;
    let mut mixed_read = 0u64;
    for d in due {
        if d.whole {
            let c = Candidate {
                seg: d.seg,
                expiring: true,
                cap_blocks: d.cap_blocks,
                used: d.used,
                live: mem.live().get(d.seg),
                score: 0.0,
            };
            let (retired, relocated) = sweep(
                inner,
                &mut st.cands,
                &mut st.dest,
                &mut st.retired,
                &c,
                &mut Rule::Compact,
            );
            inner
                .stats
                .expiry_bytes_read
                .fetch_add(d.used, Ordering::Relaxed);
            if retired && relocated == 0 {
                inner.stats.expired_segments.fetch_add(1, Ordering::Relaxed);
            }
            retired_any |= retired;
            if !retired {
                // Kept (no room for a relocated survivor): try again.
                next = now_ms;
            }
        } else if mixed_read >= MIXED_PASS_MAX_BYTES {
            next = now_ms;
        } else {
            mixed_read += d.used;
            let (earliest, unlinked_bytes) = unlink_expired(inner, d.seg, now_ms);
            let backoff_ms = if unlinked_bytes * MIXED_YIELD_DIVISOR < d.used {
                (d.backoff_ms * 2).min(MIXED_RESCAN_MAX_MS)
            } else {
                MIXED_RESCAN_MS
            };
            mem.seg(d.seg).meta.lock().mixed_backoff_ms = backoff_ms;
            if unlinked_bytes > 0 {
                // New dead bytes: idle defragmentation may find work again.
                st.defrag_done = false;
            }
            // A hint only (the latest expiry is what frees segments): if a
            // writer lowered it meanwhile, its value stands.
            let moved = earliest.max(now_ms + d.backoff_ms);
            let _ = mem.seg(d.seg).min_expiry_ms.compare_exchange(
                d.min_expiry_ms,
                moved,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
            next = next.min(moved);
        }
    }
    st.next_expiry_ms = next;
    retired_any
}

/// Unlink the expired objects of the closed candidate `seg` (one of this
/// worker's, so nobody else retires it meanwhile) at `now_ms`, marking
/// them dead; returns the earliest expiry among its remaining objects
/// (`u64::MAX` if none has one) and the bytes unlinked.
fn unlink_expired(inner: &Inner, seg: SegId, now_ms: u64) -> (u64, u64) {
    let mem = &inner.mem;
    let (blocks, used) = {
        let m = mem.seg(seg).meta.lock();
        (m.blocks.clone(), m.used)
    };
    let mut earliest = u64::MAX;
    let mut key = Vec::new();
    let (mut unlinked, mut unfetched, mut at) = (0u64, 0u64, 0usize);
    let mut unlinked_bytes = 0u64;
    while at < used.min(blocks.len() * BLOCK_BYTES) {
        let off = Memory::seg_offset(&blocks, at);
        // Sizes never change in place, so the scan stays on object
        // boundaries even while writers rewrite headers.
        let Some(h) = mem.header(off) else { break };
        at += h.object_bytes();
        if h.is_dead() || h.expiry_ms == 0 {
            continue;
        }
        if !h.expired_at(now_ms) {
            earliest = earliest.min(h.expiry_ms);
            continue;
        }
        key.resize(h.key_len as usize, 0);
        if !mem.read_part(off, h.header_bytes(), &mut key) {
            break;
        }
        let mut g = inner.index.lock(crate::store::hash_key(&key));
        let Some(slot) = g.find(|l| l == loc_of(off)) else {
            continue;
        };
        // Under the lock: an EXPIRE may have moved it since.
        let h = mem.header(off).unwrap_or(h);
        if !h.expired_at(now_ms) {
            earliest = earliest.min(if h.expiry_ms == 0 {
                u64::MAX
            } else {
                h.expiry_ms
            });
            continue;
        }
        g.remove(slot);
        // SAFETY: the bucket is locked and the object just unlinked, so
        // this thread is its only writer; its segment is a closed
        // candidate of this worker, which only this worker (holding its
        // state lock) retires, so the bytes stay allocated.
        unsafe { mem.mark_dead(off) };
        drop(g);
        mem.live().add(seg, -(h.object_bytes() as i64));
        unlinked += 1;
        unlinked_bytes += h.object_bytes() as u64;
        if mem.tracks_access() && !mem.accessed(off) {
            unfetched += 1;
        }
    }
    let c = &inner.stats;
    c.expiry_bytes_read
        .fetch_add(used as u64, Ordering::Relaxed);
    c.expiry_mixed_scans.fetch_add(1, Ordering::Relaxed);
    if unlinked > 0 {
        c.expired_reclaimed.fetch_add(unlinked, Ordering::Relaxed);
        c.expired_unfetched.fetch_add(unfetched, Ordering::Relaxed);
        inner.note_reclaimable();
    }
    (earliest, unlinked_bytes)
}
