//! Recovery on attach (the crate essay's crash guarantees; dissertation
//! §12.1.3 on restartable stores).
//!
//! Every attach reclaims the epoch slots of dead processes (resolving the
//! bucket updates they had in flight and releasing their head locks). When
//! the attaching process is alone and the store was not shut down cleanly
//! (the last process died, or the machine rebooted with the store on a
//! disk directory), or when asked, it also:
//!
//! 1. repairs segment states: a segment being compacted goes back to
//!    CLOSED; a compaction destination or a head segment no head links is
//!    closed; retired segments are freed (nobody is pinned); a dead lease
//!    holder is cleared;
//! 2. verifies the index against the log in one walk of the log (split
//!    over threads by segment): every committed, not-dead object inside
//!    its segment's `used` bytes must be named by an entry (with its hash
//!    tag) in its key's two buckets, and the index must have no other
//!    entries (entries = objects named). The log is read front to back and
//!    the random accesses go to the index, which is much smaller than the
//!    log (checking each entry's object instead would make the random
//!    accesses go to the log);
//! 3. if the index fails verification (or a rebuild was asked for),
//!    rebuilds it from the log: every segment is scanned header by header
//!    and each committed, not-dead object is indexed, the newest version
//!    winning if a key appears twice (it cannot after the intents are
//!    resolved; the check is a second line of defence);
//! 4. sets the live-byte counters and each segment's earliest expiry
//!    (from the walk, over the indexed objects; after a rebuild, from the
//!    index entries) and the item counter.
//!
//! Every pass over the log runs in parallel: one thread per CPU (at most
//! 16, `Options::recovery_threads`) takes segments
//! from a shared cursor and walks each front to back. The parallel
//! rebuild inserts under lock stripes covering the key's two buckets; of
//! two copies of a key the newest version wins, then the lowest log
//! location, which is exactly what the serial walk in log order keeps (it
//! replaces only on a strictly newer version), so the result does not
//! depend on the threads' interleaving. The rebuild is bound by the
//! index's cache misses (two random buckets per object), so it keeps a
//! few objects in flight with their buckets prefetched; and after a power
//! cut it does not checksum again a segment the re-derive walk found
//! intact with no resync (nothing changed its bytes since). With one
//! thread the rebuild is the serial walk, the reference the parallel one
//! is tested against (`tests/recovery_parallel.rs`).
//!
//! After a power cut the page cache is empty, so the first pass reads the
//! whole log from disk, and on the 2-vCPU VM's virtio disk that read is
//! most of the time (4 GiB store, 2.4 GB of objects: see
//! docs/BENCHMARKS.md). With more than one thread the re-derive walk and
//! the rebuild are then one pass: each segment is indexed by the thread
//! that re-derived it, right after (its bytes are in the page cache
//! then), so the index inserts overlap the reads of later segments
//! instead of following all of them, and the log is walked from memory
//! once, not twice. An index not in the page cache is emptied by punching
//! its pages out of the file (`MADV_REMOVE`), not read in only to be
//! zeroed. The walkers fault the log in (two walkers, two streams with the
//! kernel's readahead); reading it ahead of them from eight threads
//! (`MADV_WILLNEED` + `MADV_POPULATE_READ` in 8 MiB chunks) measured no
//! clear gain on this disk, whose rate swung 2x from minute to minute
//! with the other jobs on it, so it is not in the tree.
//!
//! Reading less after a power cut: the pass must read every byte it
//! trusts, since each object's checksum covers all of it. With fuzzy index
//! checkpoints on (`store/checkpoint.rs`; the server takes one a minute)
//! recovery starts from the last checkpoint instead (`recovery/ckpt.rs`):
//! it loads the checkpoint's index and segment table, reads each
//! segment's stamp (the epoch it was opened in), walks with checksums only
//! the segments written since the checkpoint began, and merges: newest
//! version wins, a walked copy wins a tie, then tombstones (which deletes
//! append while checkpoints are on) remove what they deleted. The objects
//! of segments not walked are trusted unverified, as every read verifies
//! an object's checksum before returning a byte of it. Without a usable
//! checkpoint the full pass above runs; it applies tombstones too.
//!
//! Damage (see `store/integrity.rs`): every walk verifies each object's
//! checksum and skips a damaged one (resynchronizing on the next intact
//! object when its length cannot be trusted), so a damaged object is never
//! indexed and the intact ones around it survive; the damaged ones that
//! were live are counted in the report. A clean attach whose shutdown seal
//! fails runs this recovery too: a bad index seal forces the rebuild; a bad
//! meta seal also distrusts the segment table and heads, so every segment
//! is walked to its end (stopping at a zero word) and its state and used
//! bytes are re-derived: CLOSED up to its last parsed object if it holds a
//! live object, FREE otherwise (a segment's stale bytes past its end hold
//! only DEAD or uncommitted objects: compaction kills what it moves).
//!
//! Objects keep their whole nibble header (version, flags, expiry) in the
//! log, so a rebuilt index serves the same items with the same metadata;
//! expired objects stay invisible and compaction reclaims them.
//!
//! The log is the truth the rebuild relies on because every transition an
//! object goes through is one atomic word in the object itself (COMMITTED,
//! DEAD), ordered with the index update under the bucket lock, and a dead
//! holder's in-flight update is resolved from its intent before the scan.

use std::cmp::Reverse;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use crate::error::{Error, Result};
use crate::layout::*;
use crate::proc_id;
use crate::store::{Inner, Marker, Obj, SealCheck, SegWalk};

mod ckpt;

/// Most threads recovery's log walk uses.
const MAX_RECOVERY_THREADS: usize = 16;
/// A recovery thread gets at least this many segments.
const MIN_SEGMENTS_PER_RECOVERY_THREAD: usize = 16;
/// Segments a recovery thread takes from the shared cursor at a time
/// (segments fill unevenly: handing them out in small batches keeps the
/// threads busy to the end).
const SEGMENTS_PER_GRAB: usize = 4;
/// Lock stripes of the parallel rebuild (a power of two): an insert holds
/// the stripes of its key's two buckets, so inserts into different
/// buckets run in parallel and two copies of one key are compared under
/// the same stripes.
const REBUILD_LOCK_STRIPES: usize = 4096;
/// Index buckets a thread takes at a time when the live bytes are summed
/// from the index after a rebuild.
const BUCKETS_PER_GRAB: usize = 1 << 12;
/// Buckets whose objects' headers are prefetched together when summing
/// live bytes from the index (divides [`BUCKETS_PER_GRAB`]).
const ACCOUNT_PREFETCH_BUCKETS: usize = 8;

/// Bytes of a page, the unit `MADV_REMOVE` punches out.
const PAGE_BYTES: u64 = 4096;

/// Objects the parallel rebuild keeps in flight: their keys' buckets are
/// prefetched when an object is walked and the object is inserted this
/// many objects later, so the index's cache misses (the rebuild's main
/// cost: two random buckets per object) overlap instead of following one
/// another.
const REBUILD_PREFETCH_DEPTH: usize = 12;

/// An object walked by the rebuild, its buckets being prefetched.
struct Pending {
    loc: u64,
    obj: Obj,
    hash: u64,
    b0: usize,
    b1: usize,
    tag: u64,
}

/// What one thread of the rebuild counted.
#[derive(Default)]
struct RebuildTally {
    /// The objects in flight (reused across segments: no allocation per
    /// object).
    queue: std::collections::VecDeque<Pending>,
    indexed: u64,
    duplicates: u64,
    /// Largest version walked.
    max_version: u64,
    /// Locations of the committed tombstones walked (see
    /// `store/checkpoint.rs`), applied after the inserts.
    tombstones: Vec<u64>,
    damaged_segments: u64,
    damaged_objects: u64,
    err: Option<Error>,
}

/// What one thread of the re-derive walk counted (and, fused with it,
/// of the rebuild).
#[derive(Default)]
struct RederiveTally {
    /// Segments whose table entry changed.
    changed: u64,
    /// Largest version of an intact object (live or not).
    max_version: u64,
    rebuild: RebuildTally,
}

/// What [`Inner::rederive_segments`] returns: the segments whose entry
/// changed, which segments walked intact with no resync, and the rebuild
/// threads' tallies when it rebuilt the index in the same pass.
type Rederived = (u64, Vec<AtomicBool>, Option<Vec<RebuildTally>>);

/// What a verification walk counted.
#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    /// Committed, not-dead objects in the log.
    live: u64,
    /// Of those, the ones the index names.
    indexed: u64,
    /// Segments with damage.
    damaged: u64,
    /// Damaged objects (that were live) and unparseable regions.
    damaged_objects: u64,
}

/// What recovery found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Recovery ran (unclean shutdown or a requested rebuild).
    pub ran: bool,
    /// The previous run did not shut down cleanly.
    pub unclean: bool,
    /// Segments whose state was repaired.
    pub segments_repaired: u64,
    /// Index entries that failed verification.
    pub bad_entries: u64,
    /// The index was rebuilt from the log.
    pub rebuilt: bool,
    /// Objects indexed by the rebuild.
    pub objects_indexed: u64,
    /// Committed, live objects in the log that the index does not name
    /// (before any rebuild).
    pub unindexed_objects: u64,
    /// Duplicate live copies of a key resolved by version in the rebuild.
    pub duplicates: u64,
    /// Segments in which the walk found damage (objects failing their
    /// checksum, unparseable regions); the walk goes on past it.
    pub damaged_segments: u64,
    /// Damaged live objects (and unparseable regions) skipped: their keys
    /// are lost (not indexed), every intact object is kept.
    pub damaged_objects: u64,
    /// The attach found a clean shutdown but the index failed its seal
    /// checksum: the index was rebuilt from the log.
    pub index_seal_bad: bool,
    /// The attach found a clean shutdown but the meta segment failed its
    /// seal checksum: segment states were re-derived from the log.
    pub meta_seal_bad: bool,
    /// An unclean shutdown of a store that may have lost power (on a disk
    /// directory, or flushed for durability): the meta segment on disk
    /// may be older than the log, so segment states were re-derived from
    /// the log (see `store/durability.rs`).
    pub meta_rederived: bool,
    /// The epoch of the checkpoint this power-cut recovery started from
    /// (0: none; see `store/checkpoint.rs`).
    pub checkpoint_epoch: u64,
    /// Keys loaded from the checkpoint (those in segments not walked).
    pub checkpoint_keys: u64,
    /// Segments walked (a checkpoint recovery walks only those written
    /// since the checkpoint began).
    pub segments_walked: u64,
    /// Keys removed by tombstones found in the walked segments.
    pub tombstones_applied: u64,
    /// Why a checkpoint present was not used (the full pass ran).
    pub checkpoint_fallback: Option<String>,
}

impl Inner {
    /// Run recovery; the caller holds the attach lock and no other live
    /// process is attached.
    /// `power_cut`: the store may have lost power (the meta segment is
    /// distrusted); a valid checkpoint then bounds the walk
    /// (`recovery/ckpt.rs`).
    pub(crate) fn recover(
        &self,
        unclean: bool,
        force_rebuild: bool,
        seal: SealCheck,
        power_cut: bool,
    ) -> Result<RecoveryReport> {
        let mut r = RecoveryReport {
            ran: true,
            unclean,
            index_seal_bad: !seal.index_ok,
            meta_seal_bad: !seal.meta_ok,
            ..RecoveryReport::default()
        };
        if unclean || !seal.index_ok || !seal.meta_ok {
            self.hdr().recoveries.fetch_add(1, Ordering::Relaxed);
        }
        if power_cut && !seal.meta_ok && !self.opts.rebuild {
            match self.try_checkpoint_recovery(&mut r) {
                ckpt::Outcome::Done => return Ok(r),
                ckpt::Outcome::NoCheckpoint => {}
                ckpt::Outcome::Fallback(why) => {
                    r = RecoveryReport {
                        ran: true,
                        unclean,
                        index_seal_bad: !seal.index_ok,
                        meta_seal_bad: !seal.meta_ok,
                        checkpoint_fallback: Some(why),
                        ..RecoveryReport::default()
                    };
                }
            }
        }
        // After a power cut (segment table distrusted, index rebuilt) on
        // more than one thread, each segment is indexed right after it is
        // re-derived, in the same pass over the log: the reads of the log
        // overlap the index inserts.
        let fuse = !seal.meta_ok && force_rebuild && self.recovery_threads() > 1;
        let (verified, fused) = if seal.meta_ok {
            (Vec::new(), None)
        } else {
            let (changed, verified, fused) = self.rederive_segments(fuse)?;
            r.segments_repaired += changed;
            (verified, fused)
        };
        // 1. Locks and segment states.
        for b in 0..self.geo.index_buckets as usize {
            let w = &self.bucket(b).word;
            let v = w.load(Ordering::Acquire);
            if lock_holder(v).is_some() {
                // Every holder is dead and its slot reclaimed: a lock word
                // still held has no intent left to resolve.
                w.store(unlock_word(v), Ordering::Release);
            }
        }
        for h in 0..self.geo.heads as usize {
            let l = &self.head(h).lock;
            let v = l.load(Ordering::Acquire);
            if lock_holder(v).is_some() {
                l.store(unlock_word(v), Ordering::Release);
            }
            self.repair_head(h);
        }
        for h in self.geo.heads as usize..MAX_HEADS {
            self.head(h).seg.store(0, Ordering::Relaxed);
        }
        let lease = &self.meta().lease;
        let lo = lease.owner.load(Ordering::Acquire);
        if lo != 0 && !proc_id::alive(lo) {
            lease.owner.store(0, Ordering::Release);
            lease.dest.store(0, Ordering::Release);
        }
        for s in 0..self.geo.log_segments as usize {
            let e = self.seg(s);
            let st = e.state.load(Ordering::Acquire);
            let linked = (0..self.geo.heads as usize)
                .any(|h| self.head(h).seg.load(Ordering::Acquire) == s as u64 + 1);
            let fixed = match st & 0xFF {
                SEG_COMPACTING => Some(SEG_CLOSED),
                SEG_OPEN if !linked => Some(SEG_CLOSED),
                SEG_RETIRED => Some(SEG_FREE),
                SEG_FREE | SEG_OPEN | SEG_CLOSED => None,
                _ => Some(SEG_CLOSED),
            };
            if let Some(ns) = fixed {
                e.state.store(ns, Ordering::Release);
                r.segments_repaired += 1;
            }
            if e.used.load(Ordering::Relaxed) > self.geo.seg_bytes {
                e.used.store(self.geo.seg_bytes, Ordering::Relaxed);
                r.segments_repaired += 1;
            }
        }
        // 2. Verify: one walk of the log (in parallel over segments)
        //    checks that the index names every committed, live object, and
        //    a scan of the index that it names nothing else.
        //    With a distrusted meta segment (a power cut, a bad seal) the
        //    index is rebuilt whatever the walk finds, so the walk is left
        //    out: its damage figures come from the walk after the rebuild.
        let t = if seal.meta_ok {
            self.verify_walk()
        } else {
            Tally::default()
        };
        let entries = if seal.meta_ok {
            self.count_entries()
        } else {
            0
        };
        r.damaged_segments = t.damaged;
        r.damaged_objects = t.damaged_objects;
        r.unindexed_objects = t.live - t.indexed;
        r.bad_entries = entries.saturating_sub(t.indexed);
        // 3. Rebuild if needed (the walk's per-segment figures are redone).
        let items = if r.bad_entries > 0 || r.unindexed_objects > 0 || force_rebuild {
            r.damaged_segments = 0;
            let mut tombstones = Vec::new();
            let damaged_objects = match fused {
                Some(parts) => {
                    r.rebuilt = true;
                    Self::fold_rebuild(&mut r, parts, &mut tombstones)?
                }
                None => self.rebuild_index(&mut r, &verified, &mut tombstones)?,
            };
            // Deletes whose kill is still pending in the log (with
            // checkpoints on a delete's kill waits for a flush, as a
            // put's does): their tombstones remove the copies.
            r.tombstones_applied = self.apply_tombstones(&tombstones, None);
            self.hdr().rebuilds.fetch_add(1, Ordering::Relaxed);
            // No entry names a damaged region now: quarantined segments
            // may be compacted again.
            for s in 0..self.geo.log_segments as usize {
                let e = self.seg(s);
                if e.state.load(Ordering::Acquire) == seg_state(SEG_CLOSED, TAG_QUARANTINED) {
                    e.state.store(SEG_CLOSED, Ordering::Release);
                }
            }
            if !seal.meta_ok {
                r.damaged_objects = damaged_objects;
            }
            // Every entry now names an intact object the rebuild chose:
            // the segments' live bytes and earliest expiries come from the
            // entries (one header read each), not from another log walk.
            self.account_from_index(None)
        } else {
            entries
        };
        if r.damaged_objects > 0 {
            self.hdr()
                .damaged_objects
                .fetch_add(r.damaged_objects, Ordering::Relaxed);
            log::error!(
                "nibblejmp store {}: recovery skipped {} damaged objects or regions in {} segments (checksum mismatch); their keys are not indexed",
                self.dir.display(),
                r.damaged_objects,
                r.damaged_segments
            );
        }
        // 4. The item counter (live bytes and earliest expiries were set by
        //    the walk).
        for (i, c) in self.meta().counts.iter().enumerate() {
            c.items
                .store(if i == 0 { items } else { 0 }, Ordering::Relaxed);
        }
        Ok(r)
    }

    /// Threads a pass over the log uses: `opts.recovery_threads` or one
    /// per available CPU, at most [`MAX_RECOVERY_THREADS`], each with at
    /// least [`MIN_SEGMENTS_PER_RECOVERY_THREAD`] segments.
    fn recovery_threads(&self) -> usize {
        let n = self.geo.log_segments as usize;
        self.opts
            .recovery_threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |p| p.get()))
            .clamp(1, MAX_RECOVERY_THREADS)
            .min(n.div_ceil(MIN_SEGMENTS_PER_RECOVERY_THREAD))
            .max(1)
    }

    /// Run `f(segment, acc)` for every segment of the log over
    /// [`recovery_threads`](Self::recovery_threads) threads, which take
    /// [`SEGMENTS_PER_GRAB`] segments at a time from a shared cursor (one
    /// thread walks them in log order), each folding into its own
    /// accumulator; returns the accumulators, `None` if a thread panicked
    /// (a bug).
    fn par_segments<T: Default + Send>(&self, f: impl Fn(usize, &mut T) + Sync) -> Option<Vec<T>> {
        let n = self.geo.log_segments as usize;
        let threads = self.recovery_threads();
        let next = AtomicUsize::new(0);
        let work = || {
            let mut acc = T::default();
            loop {
                let first = next.fetch_add(SEGMENTS_PER_GRAB, Ordering::Relaxed);
                if first >= n {
                    return acc;
                }
                for s in first..(first + SEGMENTS_PER_GRAB).min(n) {
                    f(s, &mut acc);
                }
            }
        };
        if threads == 1 {
            return Some(vec![work()]);
        }
        std::thread::scope(|sc| {
            let hs: Vec<_> = (0..threads).map(|_| sc.spawn(work)).collect();
            hs.into_iter().map(|h| h.join().ok()).collect()
        })
    }

    /// Walk every segment in use over
    /// [`recovery_threads`](Self::recovery_threads) threads (each segment
    /// is walked front to back by one thread): count committed, live
    /// objects and those the index names, and set each segment's live
    /// bytes and earliest expiry from the indexed ones. Objects are walked
    /// in log order and looked up in the (smaller) index, rather than the
    /// other way round: the random accesses go to the index, the log is
    /// read front to back.
    fn verify_walk(&self) -> Tally {
        // A walker that panicked (a bug) leaves segments unverified: count
        // one unindexed object so the index is rebuilt rather than trusted.
        let parts = self
            .par_segments(|s, t: &mut Tally| self.verify_segment(s, t))
            .unwrap_or_else(|| {
                vec![Tally {
                    live: 1,
                    ..Tally::default()
                }]
            });
        parts.into_iter().fold(Tally::default(), |a, b| Tally {
            live: a.live + b.live,
            indexed: a.indexed + b.indexed,
            damaged: a.damaged + b.damaged,
            damaged_objects: a.damaged_objects + b.damaged_objects,
        })
    }

    fn verify_segment(&self, s: usize, t: &mut Tally) {
        {
            let e = self.seg(s);
            let (mut live_bytes, mut min_expiry) = (0u64, 0u64);
            let w = self.walk_segment(s, |loc, h| {
                t.live += 1;
                let key = self.obj_key(h);
                let (b0, b1, tag) = self.buckets_of(nibble::hash_key(key));
                let entry = (tag << LOC_BITS) | loc;
                let named = [b0, b1].iter().any(|&b| {
                    self.bucket(b)
                        .entries
                        .iter()
                        .any(|x| x.load(Ordering::Relaxed) == entry)
                });
                if named {
                    t.indexed += 1;
                    live_bytes += object_bytes(h.key_len as usize, h.value_cap as usize);
                    if h.expiry_ms != 0 && (min_expiry == 0 || h.expiry_ms < min_expiry) {
                        min_expiry = h.expiry_ms;
                    }
                }
            });
            t.damaged += u64::from(w.damaged > 0);
            t.damaged_objects += w.damaged;
            e.live.store(live_bytes, Ordering::Relaxed);
            e.min_expiry_ms.store(min_expiry, Ordering::Relaxed);
        }
    }

    /// After a rebuild: set every segment's live bytes and earliest expiry
    /// from the objects the index names (in parallel over runs of
    /// buckets); returns the entries in use.
    /// With `only`, just the segments it marks (the others keep their
    /// figures; entries naming them are counted, their objects not read).
    fn account_from_index(&self, only: Option<&[bool]>) -> u64 {
        let counted = |s: usize| only.is_none_or(|o| o.get(s).copied().unwrap_or(false));
        for s in 0..self.geo.log_segments as usize {
            if !counted(s) {
                continue;
            }
            let e = self.seg(s);
            e.live.store(0, Ordering::Relaxed);
            e.min_expiry_ms.store(0, Ordering::Relaxed);
        }
        let n = self.geo.index_buckets as usize;
        let next = AtomicUsize::new(0);
        let work = || {
            let mut entries = 0u64;
            loop {
                let first = next.fetch_add(BUCKETS_PER_GRAB, Ordering::Relaxed);
                if first >= n {
                    return entries;
                }
                let end = (first + BUCKETS_PER_GRAB).min(n);
                for b in first..end {
                    // Prefetch the headers named by the next buckets, so
                    // their cache misses overlap.
                    if b % ACCOUNT_PREFETCH_BUCKETS == 0 {
                        for pb in b..(b + ACCOUNT_PREFETCH_BUCKETS).min(end) {
                            for x in &self.bucket(pb).entries {
                                if let Some(l) = self
                                    .valid_loc(x.load(Ordering::Relaxed) & LOC_MASK)
                                    .filter(|l| counted(self.seg_of(l.get())))
                                {
                                    let p = self.obj_state(l) as *const AtomicU64 as *const u8;
                                    nibble::prefetch::line(p);
                                }
                            }
                        }
                    }
                    for x in &self.bucket(b).entries {
                        let loc = x.load(Ordering::Relaxed) & LOC_MASK;
                        if loc == 0 {
                            continue;
                        }
                        entries += 1;
                        if !counted(self.seg_of(loc)) {
                            continue;
                        }
                        let Some(h) = self.obj_header(loc) else {
                            continue;
                        };
                        let e = self.seg(self.seg_of(loc));
                        e.live.fetch_add(
                            object_bytes(h.key_len as usize, h.value_cap as usize),
                            Ordering::Relaxed,
                        );
                        if h.expiry_ms != 0 {
                            let _ = e.min_expiry_ms.fetch_update(
                                Ordering::Relaxed,
                                Ordering::Relaxed,
                                |m| (m == 0 || h.expiry_ms < m).then_some(h.expiry_ms),
                            );
                        }
                    }
                }
            }
        };
        let threads = self.recovery_threads();
        if threads == 1 {
            return work();
        }
        std::thread::scope(|sc| {
            let hs: Vec<_> = (0..threads).map(|_| sc.spawn(work)).collect();
            // A thread that panicked (a bug) counted nothing: fall back to
            // counting the entries alone.
            let counts: Option<Vec<u64>> = hs.into_iter().map(|h| h.join().ok()).collect();
            counts.map_or_else(|| self.count_entries(), |c| c.iter().sum())
        })
    }

    /// Index entries in use.
    fn count_entries(&self) -> u64 {
        (0..self.geo.index_buckets as usize)
            .map(|b| {
                self.bucket(b)
                    .entries
                    .iter()
                    .filter(|e| e.load(Ordering::Relaxed) != 0)
                    .count() as u64
            })
            .sum()
    }

    /// Walk segment `s` if in use (OPEN or CLOSED) up to its used bytes:
    /// calls `f(loc, header)` for each intact, committed, not-dead object
    /// (damaged ones are skipped and counted, see
    /// [`Inner::walk_intact`]).
    fn walk_segment(&self, s: usize, f: impl FnMut(u64, &Obj)) -> SegWalk {
        self.walk_segment_with(s, true, false, f)
    }

    /// [`walk_segment`](Self::walk_segment), checksums left unchecked
    /// when `check` is false (see [`Inner::walk_intact_with`]), and
    /// intact, committed, DEAD objects passed to `f` too when `with_dead`
    /// (stamps and tombstones among them: the caller tells them apart by
    /// the state word).
    fn walk_segment_with(
        &self,
        s: usize,
        check: bool,
        with_dead: bool,
        mut f: impl FnMut(u64, &Obj),
    ) -> SegWalk {
        let e = self.seg(s);
        let st = e.state.load(Ordering::Acquire) & 0xFF;
        if st != SEG_OPEN && st != SEG_CLOSED {
            return SegWalk::default();
        }
        let used = e.used.load(Ordering::Acquire).min(self.geo.seg_bytes);
        self.walk_intact_with(s, used, false, check, |h, _, intact| {
            let os = self.obj_state(h.loc()).load(Ordering::Acquire);
            if intact && os & OBJ_COMMITTED != 0 && (with_dead || os & OBJ_DEAD == 0) {
                f(h.loc().get(), h);
            }
            true
        })
    }

    /// Apply walked tombstones (`store/checkpoint.rs`): a key whose
    /// indexed copy's version is at or below a tombstone's is removed
    /// (and a copy in the log marked DEAD; with `view`, a copy only the
    /// checkpoint names is matched by hash and left alone). Returns the
    /// keys removed.
    pub(crate) fn apply_tombstones(
        &self,
        tombstones: &[u64],
        view: Option<&ckpt::View<'_>>,
    ) -> u64 {
        let mut n = 0;
        for &t in tombstones {
            let Some(h) = self.obj_header(t) else {
                continue;
            };
            let key = self.obj_key(&h);
            let hash = nibble::hash_key(key);
            let (b0, b1, tag) = self.buckets_of(hash);
            let found = match view {
                Some(v) => self.find_merged(v, key, hash, b0, b1, tag),
                None => self.find(key, b0, b1, tag).map(|(b, i, o)| (b, i, o, None)),
            };
            if let Some((b, i, other, cv)) = found {
                let version = match cv {
                    Some(v) => v,
                    None => self.obj_header(other).map_or(0, |o| o.version),
                };
                if version <= h.version {
                    self.bucket(b).entries[i].store(0, Ordering::Release);
                    if cv.is_none() {
                        self.mark(other, OBJ_DEAD);
                    }
                    n += 1;
                }
            }
        }
        n
    }

    /// With an untrusted meta segment: clear heads and lease, and re-derive
    /// every segment's state and used bytes from the log (see the module
    /// essay). Returns the segments whose entry changed, and for each
    /// segment whether its walk found every object up to its new end
    /// intact with no resync (the rebuild then need not checksum it
    /// again). With `fuse` the index is cleared first and each segment is
    /// indexed right after it is re-derived, by the same thread (its
    /// bytes are then in the page cache): the rebuild's tallies come back
    /// too. A segment's rebuild needs only its own re-derived entry, and
    /// the rebuild marks DEAD only copies it walked itself or that an
    /// index entry names (so whose segment was re-derived already), so
    /// the result is that of re-deriving every segment and then
    /// rebuilding.
    fn rederive_segments(&self, fuse: bool) -> Result<Rederived> {
        let verified: Vec<AtomicBool> = (0..self.geo.log_segments)
            .map(|_| AtomicBool::new(false))
            .collect();
        self.clear_heads_and_lease();
        let stripes: Vec<Mutex<()>> = if fuse {
            self.clear_index();
            (0..REBUILD_LOCK_STRIPES).map(|_| Mutex::new(())).collect()
        } else {
            Vec::new()
        };
        // Each segment is re-derived on its own, so the segments are
        // shared among the recovery threads.
        let parts = self
            .par_segments(|s, acc: &mut RederiveTally| {
                let mut live = false;
                // The segment ends after its last live object (or
                // tombstone): past it lie only DEAD objects and, in a
                // reused segment, the stale bytes of its earlier life,
                // which need not line up with the new objects.
                // A committed tombstone keeps its segment walked by the
                // rebuild too (`store/checkpoint.rs`), unless the walk
                // resynchronized before it (then it may be a stale one).
                let (mut end, mut next, mut contiguous) = (0, 0, true);
                let w = self.walk_intact(s, self.geo.seg_bytes, true, |h, size, intact| {
                    let os = self.obj_state(h.loc()).load(Ordering::Acquire);
                    let off = (h.loc().get() - 1) % self.geo.seg_bytes;
                    contiguous &= intact && off == next;
                    next = off + size;
                    let keep = intact
                        && os & OBJ_COMMITTED != 0
                        && (os & OBJ_DEAD == 0
                            || (contiguous
                                && matches!(self.marker(h), Some((Marker::Tombstone, _)))));
                    if keep {
                        live = true;
                        end = off + size;
                    }
                    if intact {
                        acc.max_version = acc.max_version.max(h.version);
                    }
                    true
                });
                let (state, used) = if live {
                    (SEG_CLOSED, end.min(w.end))
                } else {
                    (SEG_FREE, 0)
                };
                verified[s].store(w.resyncs == 0, Ordering::Relaxed);
                let e = self.seg(s);
                if e.state.load(Ordering::Relaxed) != state
                    || e.used.load(Ordering::Relaxed) != used
                {
                    acc.changed += 1;
                }
                e.state.store(state, Ordering::Relaxed);
                e.used.store(used, Ordering::Relaxed);
                e.live.store(0, Ordering::Relaxed);
                e.stamp.store(0, Ordering::Relaxed);
                e.min_expiry_ms.store(0, Ordering::Relaxed);
                if fuse {
                    self.rebuild_segment(s, w.resyncs != 0, &stripes, &mut acc.rebuild, None);
                }
            })
            .ok_or_else(|| {
                Error::Corrupt("recovery: a segment re-derive thread panicked".into())
            })?;
        self.hdr().alloc_hint.store(0, Ordering::Relaxed);
        let changed = parts.iter().map(|p| p.changed).sum();
        // Versions keep growing after a reboot (`store/checkpoint.rs`).
        self.raise_version_floor(parts.iter().map(|p| p.max_version).max().unwrap_or(0));
        let rebuilt = fuse.then(|| parts.into_iter().map(|p| p.rebuild).collect());
        Ok((changed, verified, rebuilt))
    }

    /// Unlink every head and clear the compaction lease (an untrusted meta
    /// segment; no process is attached).
    fn clear_heads_and_lease(&self) {
        for h in 0..MAX_HEADS {
            let hd = self.head(h);
            hd.lock.store(0, Ordering::Relaxed);
            hd.seg.store(0, Ordering::Relaxed);
            hd.off.store(0, Ordering::Relaxed);
        }
        let lease = &self.meta().lease;
        lease.owner.store(0, Ordering::Relaxed);
        lease.dest.store(0, Ordering::Relaxed);
    }

    /// Empty every bucket of the index (entries and lock holders; no
    /// process is attached). When most of the bucket array is not in the
    /// page cache (after a power cut), its whole pages are punched out of
    /// the index file instead (`MADV_REMOVE`: they read back as zeros), so
    /// a cold index is not read from disk only to be overwritten; a
    /// bucket word's sequence then restarts at 0, which no reader can
    /// notice as none is attached. A resident index is cleared by stores
    /// (punching it would free its pages only for the rebuild to fault in
    /// fresh ones), as are the partial pages at either end and every page
    /// where `MADV_REMOVE` fails.
    fn clear_index(&self) {
        let n = self.geo.index_buckets as usize;
        let bucket_bytes = core::mem::size_of::<Bucket>();
        let start = self.index_addr();
        let end = start + n * bucket_bytes;
        let page = PAGE_BYTES as usize;
        let (lo, hi) = (start.next_multiple_of(page), end / page * page);
        let punched = hi > lo && !self.mostly_resident(lo, hi - lo) && {
            // SAFETY: `[lo, hi)` is whole pages inside the mapped bucket
            // array (`index_buckets` buckets from the index's base); no
            // process is attached and no reference into it is held across
            // the call; zero bytes are a valid, empty bucket.
            unsafe { libc::madvise(lo as *mut libc::c_void, hi - lo, libc::MADV_REMOVE) == 0 }
        };
        for b in 0..n {
            let at = start + b * bucket_bytes;
            if punched && at >= lo && at + bucket_bytes <= hi {
                continue;
            }
            let bk = self.bucket(b);
            for e in &bk.entries {
                e.store(0, Ordering::Relaxed);
            }
            let w = bk.word.load(Ordering::Relaxed);
            bk.word.store(unlock_word(w & !0xFF), Ordering::Release);
        }
    }

    /// Whether at least half the pages of the mapped range `[addr, addr +
    /// len)` (page-aligned) are in the page cache (`mincore`); `true` when
    /// that cannot be told.
    fn mostly_resident(&self, addr: usize, len: usize) -> bool {
        let pages = len.div_ceil(PAGE_BYTES as usize);
        let mut vec = vec![0u8; pages];
        // SAFETY: `[addr, addr + len)` is mapped (the caller passes whole
        // pages of the store's index mapping) and `vec` has one byte per
        // page.
        let rc = unsafe { libc::mincore(addr as *mut libc::c_void, len, vec.as_mut_ptr()) };
        rc != 0 || vec.iter().filter(|&&v| v & 1 != 0).count() * 2 >= pages
    }

    /// Walk every segment in use (see [`walk_segment`](Self::walk_segment));
    /// stops at the first error of `f`. Returns the number of segments
    /// in which the walk found damage and the damaged objects.
    fn walk_log(&self, mut f: impl FnMut(u64, &Obj) -> Result<()>) -> Result<(u64, u64)> {
        let (mut damaged, mut objects) = (0, 0);
        let mut res = Ok(());
        for s in 0..self.geo.log_segments as usize {
            let w = self.walk_segment(s, |loc, h| {
                if res.is_ok() {
                    res = f(loc, h);
                }
            });
            damaged += u64::from(w.damaged > 0);
            objects += w.damaged;
            if res.is_err() {
                break;
            }
        }
        res.map(|()| (damaged, objects))
    }

    /// Rebuild the index from the log; returns the damaged objects the
    /// walk skipped. The parallel walk leaves unchecked the checksums of
    /// the segments marked in `verified` (by this recovery's re-derive
    /// walk); the serial one checks every object.
    fn rebuild_index(
        &self,
        r: &mut RecoveryReport,
        verified: &[AtomicBool],
        tombstones: &mut Vec<u64>,
    ) -> Result<u64> {
        r.rebuilt = true;
        self.clear_index();
        if self.recovery_threads() == 1 {
            for s in 0..self.geo.log_segments as usize {
                self.walk_segment_with(s, true, true, |loc, h| {
                    if matches!(self.marker(h), Some((Marker::Tombstone, _))) {
                        tombstones.push(loc);
                    }
                });
            }
            let (segs, objects) = self.walk_log(|loc, h| {
                let mut rr = RecoveryReport::default();
                self.rebuild_insert(loc, h, &mut rr)?;
                r.objects_indexed += rr.objects_indexed;
                r.duplicates += rr.duplicates;
                Ok(())
            })?;
            r.damaged_segments += segs;
            return Ok(objects);
        }
        let stripes: Vec<Mutex<()>> = (0..REBUILD_LOCK_STRIPES).map(|_| Mutex::new(())).collect();
        let parts = self
            .par_segments(|s, acc: &mut RebuildTally| {
                let check = !verified.get(s).is_some_and(|v| v.load(Ordering::Relaxed));
                self.rebuild_segment(s, check, &stripes, acc, None);
            })
            .ok_or_else(|| Error::Corrupt("recovery: an index rebuild thread panicked".into()))?;
        Self::fold_rebuild(r, parts, tombstones)
    }

    /// Add the rebuild threads' tallies to `r`; returns the damaged
    /// objects they skipped, or the first thread's error.
    fn fold_rebuild(
        r: &mut RecoveryReport,
        parts: Vec<RebuildTally>,
        tombstones: &mut Vec<u64>,
    ) -> Result<u64> {
        let mut objects = 0;
        for mut p in parts {
            if let Some(e) = p.err {
                return Err(e);
            }
            tombstones.append(&mut p.tombstones);
            r.objects_indexed += p.indexed;
            r.duplicates += p.duplicates;
            r.damaged_segments += p.damaged_segments;
            objects += p.damaged_objects;
        }
        Ok(objects)
    }

    /// Index every intact, committed, not-dead object of segment `s`
    /// (parallel rebuild; the index was cleared), checksums unchecked
    /// unless `check` (see [`Inner::walk_intact_with`]).
    fn rebuild_segment(
        &self,
        s: usize,
        check: bool,
        stripes: &[Mutex<()>],
        acc: &mut RebuildTally,
        ck: Option<&ckpt::View<'_>>,
    ) {
        if acc.err.is_some() {
            return;
        }
        let mut queue = std::mem::take(&mut acc.queue);
        let mut tombstones = std::mem::take(&mut acc.tombstones);
        let w = self.walk_segment_with(s, check, true, |loc, h| {
            if self.obj_state(h.loc()).load(Ordering::Acquire) & OBJ_DEAD != 0 {
                if matches!(self.marker(h), Some((Marker::Tombstone, _))) {
                    tombstones.push(loc);
                }
                return;
            }
            let hash = nibble::hash_key(self.obj_key(h));
            let (b0, b1, tag) = self.buckets_of(hash);
            for b in [b0, b1] {
                let p = self.bucket(b) as *const Bucket as *const u8;
                nibble::prefetch::line(p);
                nibble::prefetch::line(p.wrapping_add(64));
            }
            queue.push_back(Pending {
                loc,
                obj: *h,
                hash,
                b0,
                b1,
                tag,
            });
            if queue.len() > REBUILD_PREFETCH_DEPTH {
                if let Some(p) = queue.pop_front() {
                    self.rebuild_insert_striped(&p, stripes, acc, ck);
                }
            }
        });
        while let Some(p) = queue.pop_front() {
            self.rebuild_insert_striped(&p, stripes, acc, ck);
        }
        acc.queue = queue;
        acc.tombstones = tombstones;
        acc.damaged_segments += u64::from(w.damaged > 0);
        acc.damaged_objects += w.damaged;
    }

    /// [`rebuild_insert`](Self::rebuild_insert) for the parallel rebuild:
    /// under the lock stripes of the key's two buckets (taken in stripe
    /// order). The outcome does not depend on the order the threads meet
    /// the copies of a key in: the newest version wins and, of equal
    /// versions, the lowest log location, which is the copy the serial
    /// walk in log order keeps (it replaces only on a strictly newer
    /// version); every other copy is marked DEAD, as in the serial walk.
    /// A failure is kept in `acc.err` (later inserts of the thread are
    /// skipped).
    fn rebuild_insert_striped(
        &self,
        p: &Pending,
        stripes: &[Mutex<()>],
        acc: &mut RebuildTally,
        ck: Option<&ckpt::View<'_>>,
    ) {
        if acc.err.is_some() {
            return;
        }
        let (loc, h, b0, b1, tag) = (p.loc, &p.obj, p.b0, p.b1, p.tag);
        acc.max_version = acc.max_version.max(h.version);
        let key = self.obj_key(h);
        let (s0, s1) = (b0 % stripes.len(), b1 % stripes.len());
        let (lo, hi) = (s0.min(s1), s0.max(s1));
        let _g0 = stripes[lo].lock().unwrap_or_else(PoisonError::into_inner);
        let _g1 = (hi != lo).then(|| stripes[hi].lock().unwrap_or_else(PoisonError::into_inner));
        let entry = (tag << LOC_BITS) | loc;
        let found = match ck {
            None => self.find(key, b0, b1, tag).map(|(b, i, o)| (b, i, o, None)),
            Some(v) => self.find_merged(v, key, p.hash, b0, b1, tag),
        };
        if let Some((b, i, other, ck_version)) = found {
            acc.duplicates += 1;
            match ck_version {
                // The checkpoint's copy (in a segment not walked): the
                // walked copy wins a tie (a compaction move keeps the
                // version); the other is left alone (not read).
                Some(cv) => {
                    if h.version >= cv {
                        self.bucket(b).entries[i].store(entry, Ordering::Release);
                    } else {
                        self.mark(loc, OBJ_DEAD);
                    }
                }
                None => {
                    let ov = self.obj_header(other).map(|oh| oh.version).unwrap_or(0);
                    if (h.version, Reverse(loc)) > (ov, Reverse(other)) {
                        self.bucket(b).entries[i].store(entry, Ordering::Release);
                        self.mark(other, OBJ_DEAD);
                    } else {
                        self.mark(loc, OBJ_DEAD);
                    }
                }
            }
            return;
        }
        match self.empty_entry(b0, b1) {
            Some((b, i)) => {
                self.bucket(b).entries[i].store(entry, Ordering::Release);
                acc.indexed += 1;
            }
            None => {
                acc.err = Some(Error::Corrupt(format!(
                    "index rebuild: both buckets of a key are full at object {loc:#x}"
                )))
            }
        }
    }

    fn rebuild_insert(&self, loc: u64, h: &Obj, r: &mut RecoveryReport) -> Result<()> {
        let key = self.obj_key(h);
        let (b0, b1, tag) = self.buckets_of(nibble::hash_key(key));
        let entry = (tag << LOC_BITS) | loc;
        if let Some((b, i, other)) = self.find(key, b0, b1, tag) {
            r.duplicates += 1;
            let ov = self.obj_header(other).map(|oh| oh.version).unwrap_or(0);
            if h.version > ov {
                self.bucket(b).entries[i].store(entry, Ordering::Release);
                self.mark(other, OBJ_DEAD);
            } else {
                self.mark(loc, OBJ_DEAD);
            }
            return Ok(());
        }
        match self.empty_entry(b0, b1) {
            Some((b, i)) => {
                self.bucket(b).entries[i].store(entry, Ordering::Release);
                r.objects_indexed += 1;
                Ok(())
            }
            None => Err(Error::Corrupt(format!(
                "index rebuild: both buckets of a key are full at object {loc:#x}"
            ))),
        }
    }
}
