//! Writers' access to the index: [`Index::lock`] and the [`WriteGuard`]
//! it returns (dissertation §4.3).
//!
//! A writer locks both buckets of its key's neighbourhood, lower index
//! first (the one global order, shared with the resizer, so no deadlock),
//! after re-checking the subtable size it locked under. Through the guard
//! it finds the key's entry, replaces it, removes it or inserts one: home
//! while the home bucket has [`HOME_SPARE_SLOTS`] free entries, else the
//! emptier bucket. A find that misses has read all 30 entries, so it keeps
//! the free slots as two bit masks, and the insert that follows (the write
//! of a new key) picks its slot from them without reading an entry again.
//! Dropping the guard unlocks both buckets, which bumps their versions and
//! so publishes the change to optimistic readers.

use core::cell::Cell;

use super::*;

impl Index {
    /// Locks the neighbourhood of `hash` for writing and returns the guard;
    /// readers of these two buckets retry until it is dropped.
    ///
    /// If the subtable's load has passed `grow_load_factor`, grows it
    /// first (a failure to grow is ignored here: the insert will report
    /// [`IndexError::Full`] if it matters). Hence, and because of the lock
    /// order, a thread must hold at most one guard at a time.
    pub fn lock(&self, hash: u64) -> WriteGuard<'_> {
        let st = self.subtable(hash);
        if st.counters.entries.load(Ordering::Relaxed) > st.grow_at.load(Ordering::Relaxed) {
            let _ = self.grow_subtable(st, Trigger::Load);
        }
        loop {
            let n = st.n.load(Ordering::Acquire);
            let (home, second) = self.neighbourhood(hash, n);
            // Ascending index order, the order every writer and the resizer
            // lock in (the second bucket has the lower index when the
            // distance wraps around the end of the table).
            let (low, high) = (
                st.bucket(home.min(second)).lock(),
                st.bucket(home.max(second)).lock(),
            );
            // While we hold these buckets no resize can publish (it needs
            // every lock); one that published before our locking CAS
            // released `n` to it, so this load sees it and we retry.
            if st.n.load(Ordering::Relaxed) == n {
                let buckets = if home < second {
                    [low, high]
                } else {
                    [high, low]
                };
                return WriteGuard {
                    st,
                    buckets,
                    tag: tag_bits(hash),
                    free: Cell::new(None),
                };
            }
        }
    }
}

/// Free entry slots of a locked bucket.
pub(super) fn free_slots(bucket: &bucket::BucketGuard<'_, ENTRIES_PER_BUCKET>) -> usize {
    free_mask(bucket).count_ones() as usize
}

/// The free entry slots of a locked bucket as a bit mask (bit `i`: entry
/// `i` is empty).
fn free_mask(bucket: &bucket::BucketGuard<'_, ENTRIES_PER_BUCKET>) -> u16 {
    (0..ENTRIES_PER_BUCKET).fold(0, |m, i| m | u16::from(bucket.load(i) == 0) << i)
}

/// A position in a locked neighbourhood, from [`WriteGuard::find`] or
/// [`WriteGuard::insert`]; meaningful only to the guard that returned it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    /// 0: home bucket, 1: neighbour.
    bucket: u8,
    entry: u8,
}

/// The write lock on one key hash's neighbourhood (home bucket and its
/// neighbour). Dropping it unlocks both and publishes the changes.
pub struct WriteGuard<'a> {
    st: &'a Subtable,
    /// `[home, neighbour]`.
    buckets: [bucket::BucketGuard<'a, ENTRIES_PER_BUCKET>; NEIGHBOURHOOD_BUCKETS],
    tag: u64,
    /// The free slots of both buckets (bit masks, as [`free_mask`]) once a
    /// [`WriteGuard::find`] has read every entry: the insert that follows
    /// a miss, the usual write of a new key, then reads no entry again.
    /// `None` until known; kept exact by every change made through the
    /// guard (nobody else changes these buckets while it is held).
    free: Cell<Option<[u16; NEIGHBOURHOOD_BUCKETS]>>,
}

impl fmt::Debug for WriteGuard<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WriteGuard")
            .field("tag", &(self.tag >> LOC_BITS))
            .finish_non_exhaustive()
    }
}

/// Panics unless `loc` is a valid [`Loc`].
fn check_loc(loc: Loc) {
    assert!(
        loc != 0 && loc <= LOC_MASK,
        "location {loc:#x} is not in 1..2^48"
    );
}

impl WriteGuard<'_> {
    /// The first entry whose tag matches and for which `is_key` says yes
    /// (home bucket first). Only tag-matching entries are offered.
    /// A miss has read every entry, so it also records the free slots
    /// for the [`WriteGuard::insert`] that usually follows it.
    pub fn find(&self, mut is_key: impl FnMut(Loc) -> bool) -> Option<Slot> {
        let mut free = [0u16; NEIGHBOURHOOD_BUCKETS];
        for (b, guard) in self.buckets.iter().enumerate() {
            // The bucket's mask in a local, not in `free[b]`: indexed by
            // the loop's `b`, the array lives in memory, where every empty
            // entry (most of them, in a load) costs a load and a store.
            let mut bucket_free = 0u16;
            for i in 0..ENTRIES_PER_BUCKET {
                let e = guard.load(i);
                if e == 0 {
                    bucket_free |= 1 << i;
                } else if tag_bits(e) == self.tag && is_key(e & LOC_MASK) {
                    return Some(Slot {
                        bucket: b as u8,
                        entry: i as u8,
                    });
                }
            }
            free[b] = bucket_free;
        }
        self.free.set(Some(free));
        None
    }

    /// The first entry of either bucket, whatever its tag, for which
    /// `pick` says yes (home bucket first): cache mode evicts an entry of
    /// a full neighbourhood to make room. Every entry in these buckets is
    /// under this guard's lock, whichever key it belongs to: a writer of
    /// that key locks the bucket the entry is in.
    pub fn find_any(&self, mut pick: impl FnMut(Loc) -> bool) -> Option<Slot> {
        for (b, guard) in self.buckets.iter().enumerate() {
            for i in 0..ENTRIES_PER_BUCKET {
                let e = guard.load(i);
                if e != 0 && pick(e & LOC_MASK) {
                    return Some(Slot {
                        bucket: b as u8,
                        entry: i as u8,
                    });
                }
            }
        }
        None
    }

    fn entry(&self, slot: Slot) -> u64 {
        self.buckets[slot.bucket as usize].load(slot.entry as usize)
    }

    /// The location held in `slot`.
    ///
    /// # Panics
    /// If the slot is empty (it was removed).
    pub fn loc(&self, slot: Slot) -> Loc {
        let e = self.entry(slot);
        assert!(e != 0, "loc of an empty slot");
        e & LOC_MASK
    }

    /// Points `slot` at a new location (the key's new object version, or
    /// its relocated copy). Readers see the old or the new location.
    ///
    /// # Panics
    /// If the slot is empty, or `loc` is 0 or not below 2^48.
    pub fn replace(&mut self, slot: Slot, loc: Loc) {
        check_loc(loc);
        assert!(self.entry(slot) != 0, "replace of an empty slot");
        self.buckets[slot.bucket as usize].store(slot.entry as usize, self.tag | loc);
    }

    /// Empties `slot` and returns the location it held.
    ///
    /// # Panics
    /// If the slot is already empty.
    pub fn remove(&mut self, slot: Slot) -> Loc {
        let loc = self.loc(slot);
        self.buckets[slot.bucket as usize].store(slot.entry as usize, 0);
        if let Some(mut free) = self.free.get() {
            free[slot.bucket as usize] |= 1 << slot.entry;
            self.free.set(Some(free));
        }
        self.st.counters.entries.fetch_sub(1, Ordering::Relaxed);
        loc
    }

    /// Inserts a new entry (the caller has checked with [`find`] that the
    /// key is absent): home while home has [`HOME_SPARE_SLOTS`] free
    /// entries, else into the emptier of the two buckets, home on a tie.
    /// `Err(IndexError::Full)` if both are full: drop the guard, call
    /// [`Index::grow`] with the same hash, and retry.
    ///
    /// # Panics
    /// If `loc` is 0 or not below 2^48.
    ///
    /// [`find`]: WriteGuard::find
    pub fn insert(&mut self, loc: Loc) -> Result<Slot, IndexError> {
        check_loc(loc);
        let mut masks = self
            .free
            .get()
            .unwrap_or_else(|| [free_mask(&self.buckets[0]), free_mask(&self.buckets[1])]);
        let free = masks.map(|m| m.count_ones() as usize);
        if free == [0, 0] {
            self.st
                .counters
                .full_inserts
                .fetch_add(1, Ordering::Relaxed);
            return Err(IndexError::Full);
        }
        // Home while it has room to spare, so that most reads find their
        // key in the one bucket they read first; the emptier of the two
        // once home runs low, which keeps the overflow load near the
        // balanced choice's.
        let b = if free[0] >= HOME_SPARE_SLOTS {
            0
        } else {
            usize::from(free[1] > free[0])
        };
        // The first free slot (`free[b] > 0`, so the mask has a bit).
        let i = masks[b].trailing_zeros() as usize;
        self.buckets[b].store(i, self.tag | loc);
        masks[b] &= !(1 << i);
        self.free.set(Some(masks));
        let counters = &self.st.counters;
        counters.entries.fetch_add(1, Ordering::Relaxed);
        if b == 1 {
            counters.neighbour_inserts.fetch_add(1, Ordering::Relaxed);
        }
        Ok(Slot {
            bucket: b as u8,
            entry: i as u8,
        })
    }
}
