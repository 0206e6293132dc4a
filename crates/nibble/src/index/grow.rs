//! Resizing one subtable in place: growth by a quarter, and the rebuild
//! that growth and shrinking share (dissertation §4.3; the dissertation
//! doubles).
//!
//! The resizer locks every bucket of the subtable in ascending order (the
//! order writers use), re-checks that the resize is still needed, and
//! rebuilds: every entry's key is rehashed (entries keep only 16 hash
//! bits, so the store is asked for the full hash, `rehash`) and placed in
//! a scratch copy of the new bucket array with the writers' two-choice
//! rule, in the order of the old buckets. Only once every entry has a
//! place does anything change: the new buckets' budget is reserved, the
//! scratch copy is written over the locked buckets, the subtable's
//! generation is bumped and the new size is published with a release
//! store before the unlock. So a `rehash` that panics, or an entry with
//! no room in the new size, leaves the subtable as it was. The scratch
//! copy (120 bytes a bucket of the new size, plus the old buckets' 120)
//! is mapped for the resize and unmapped before it returns
//! ([`ScratchArray`]: not heap, whose freed blocks stay resident).
//!
//! Why a quarter and a rebuild rather than the paper's doubling, in which
//! bucket `c` splits into `c` and `c + n` and nothing else moves: a table
//! that can only double spends half its life under 60 % full (0.85 / 2
//! right after each doubling), and its index is the largest overhead of a
//! store of small objects (issue 23: 16 MiB, 12.5 % of 128 MiB of 64→128
//! B objects). Multiply-shift home buckets (`Index::neighbourhood`) let
//! the subtable take any size, and a growth by a quarter keeps the load
//! between 0.68 and 0.85. What it costs: every growth rehashes every key
//! of the subtable (a doubling rehashes them too), and a growth comes
//! every 1.25× of keys instead of every 2×, so a load of `K` keys rehashes
//! about `4K` of them instead of `2K`; and SCAN cannot rely on entries
//! moving only from `c` to `c + n`, so its cursor restarts a subtable
//! that resized under it (`index/scan.rs`).
//!
//! The keys are scattered over the log, so each rehash is a cache miss:
//! the resizer hints the objects of the bucket [`REHASH_PREFETCH_BUCKETS`]
//! ahead to the owner (`rehash_prefetch`), and those misses overlap.

use super::bucket::BucketGuard;
use super::*;

/// A growth adds `n / GROWTH_DIVISOR` buckets (at least one) to a
/// subtable of `n`: 1.25× a step, so the load right after a growth at
/// [`DEFAULT_GROW_LOAD_FACTOR`] is 0.68, not the doubling's 0.425.
pub const GROWTH_DIVISOR: usize = 4;

/// The size a subtable of `n` buckets grows to, before the reservation's
/// cap.
fn grown_size(n: usize) -> usize {
    n + (n / GROWTH_DIVISOR).max(1)
}

/// A new bucket array being filled by a rebuild: entries in slot order
/// and each bucket's fill count.
pub(super) struct Scratch {
    buckets: ScratchArray<[u64; ENTRIES_PER_BUCKET]>,
    fill: ScratchArray<u8>,
    /// The locked buckets' entries as the rebuild read them (buckets past
    /// them hold zeros: growth and shrinking leave free entries above `n`).
    old: ScratchArray<[u64; ENTRIES_PER_BUCKET]>,
}

impl Scratch {
    fn new(n: usize, old_n: usize) -> Option<Scratch> {
        Some(Scratch {
            buckets: ScratchArray::zeroed(n)?,
            fill: ScratchArray::zeroed(n)?,
            old: ScratchArray::zeroed(old_n)?,
        })
    }

    /// Place `entry` by the writers' rule ([`WriteGuard::insert`]): home
    /// while home has [`HOME_SPARE_SLOTS`] free, else the emptier, home
    /// on a tie. False when both are full.
    fn place(&mut self, home: usize, second: usize, entry: u64) -> bool {
        let free = |b: usize| ENTRIES_PER_BUCKET - self.fill[b] as usize;
        let (fh, fs) = (free(home), free(second));
        if fh + fs == 0 {
            return false;
        }
        let b = if fh >= HOME_SPARE_SLOTS || fh >= fs {
            home
        } else {
            second
        };
        let slot = self.fill[b] as usize;
        self.buckets[b][slot] = entry;
        self.fill[b] += 1;
        true
    }

    /// Write the new array over `guards` (one a bucket, at least as many
    /// as the array has); buckets past it are emptied. Only entries that
    /// change are stored: most of a growth's entries keep their slot.
    pub(super) fn write(&self, guards: &mut [BucketGuard<'_, ENTRIES_PER_BUCKET>]) {
        for (c, g) in guards.iter_mut().enumerate() {
            let src = self.buckets.get(c);
            let was = self.old.get(c);
            for i in 0..ENTRIES_PER_BUCKET {
                let v = src.map_or(0, |b| b[i]);
                if v != was.map_or(0, |b| b[i]) {
                    g.store(i, v);
                }
            }
        }
    }
}

impl Index {
    /// Grows the subtable of `hash` unless its neighbourhood has room
    /// again (another thread grew it, or an entry was removed). Call it
    /// after [`WriteGuard::insert`] returned [`IndexError::Full`], with the
    /// guard dropped, then retry the insert. Fails with
    /// [`IndexError::Full`] if the subtable is at its reservation or the
    /// index at its byte budget; existing entries are unaffected.
    pub fn grow(&self, hash: u64) -> Result<(), IndexError> {
        self.grow_subtable(self.subtable(hash), Trigger::Full(hash))
    }

    /// The resize of §4.3, by a quarter: lock every bucket, rebuild,
    /// publish, unlock.
    pub(super) fn grow_subtable(&self, st: &Subtable, trigger: Trigger) -> Result<(), IndexError> {
        // Bucket 0 first: this also serialises concurrent resizers, and
        // once we hold it `n` cannot change (publishing needs it).
        let first = st.bucket(0).lock();
        let n = st.n.load(Ordering::Acquire);
        let mut guards = Vec::with_capacity(grown_size(n).min(self.max_buckets).max(n));
        guards.push(first);
        guards.extend((1..n).map(|c| st.bucket(c).lock()));

        let still_needed = match trigger {
            Trigger::Full(hash) => {
                let (home, second) = self.neighbourhood(hash, n);
                free_slots(&guards[home]) + free_slots(&guards[second]) == 0
            }
            Trigger::Load => {
                st.counters.entries.load(Ordering::Relaxed) > st.grow_at.load(Ordering::Relaxed)
            }
        };
        if !still_needed {
            return Ok(());
        }

        // The new size: a quarter more, or more again in the rare case
        // that a neighbourhood of the rebuilt table would overflow.
        let mut m = n;
        let mut mismatches = 0;
        let built = loop {
            if m >= self.max_buckets {
                break None;
            }
            m = grown_size(m).min(self.max_buckets);
            mismatches = 0;
            if let Some(s) = self.rebuild(&guards, m, &mut mismatches) {
                break Some(s);
            }
        };
        let reserved = built
            .as_ref()
            .and_then(|_| self.reserve_budget(((m - n) * BUCKET_BYTES) as u64));
        let (Some(scratch), Some(mut reserved)) = (built, reserved) else {
            st.counters.failed_resizes.fetch_add(1, Ordering::Relaxed);
            // Stop the proactive check from locking the subtable again: the
            // reservation never grows back, and the budget only when the
            // owner frees space, which a later insert that finds its
            // neighbourhood full tries (and a success re-arms the check).
            st.grow_at.store(u64::MAX, Ordering::Relaxed);
            return Err(IndexError::Full);
        };

        // The new buckets are unpublished (no reader or writer can reach
        // them before `n` changes); locking them only lets us write through
        // guards. Their pages are mapped in writable first (`populate`),
        // so that the locks' loads do not map the zero page for their CAS
        // to replace with a TLB flush.
        st.buckets.in_use(m);
        st.buckets.populate(n, m);
        guards.extend((n..m).map(|c| st.bucket(c).lock()));
        reserved.bytes = 0;
        self.publish_rebuild(st, guards, scratch, mismatches, m);
        st.counters.resizes.fetch_add(1, Ordering::Relaxed);
        // Chunks that held old buckets were faulted in 4 KiB pages; now
        // that every bucket below `m` is resident, fold them into huge
        // pages (outside the locks: it copies up to the subtable's size).
        st.buckets.collapse(m);
        Ok(())
    }

    /// Make the rebuilt array `scratch` of `m` buckets the subtable's:
    /// write it over the locked `guards` (buckets past it emptied), reset
    /// the resize thresholds for the new size, bump the generation, publish
    /// `m`, unlock. Growth and shrinking end with it.
    pub(super) fn publish_rebuild(
        &self,
        st: &Subtable,
        mut guards: Vec<BucketGuard<'_, ENTRIES_PER_BUCKET>>,
        scratch: Scratch,
        mismatches: u64,
        m: usize,
    ) {
        scratch.write(&mut guards);
        drop(scratch);
        if mismatches > 0 {
            st.counters
                .rehash_mismatches
                .fetch_add(mismatches, Ordering::Relaxed);
        }
        st.grow_at
            .store(grow_threshold(self.grow_load_factor, m), Ordering::Relaxed);
        st.shrink_below.store(u64::MAX, Ordering::Relaxed);
        st.generation.fetch_add(1, Ordering::Relaxed);
        // Release: whoever learns the new size also sees the new entries
        // and generation (and the bucket unlocks below come after it,
        // which is what the re-checks of `n` in `read` and `lock` rely on).
        st.n.store(m, Ordering::Release);
        drop(guards);
    }

    /// Place every entry of the locked buckets `guards` (the subtable's
    /// `guards.len()` buckets in use) in a new array of `m` buckets;
    /// `None` if some neighbourhood of it overflows (or the scratch
    /// arrays cannot be mapped). Entries whose
    /// `rehash` disagrees with their tag or bucket (a store bug) are
    /// counted in `mismatches` and placed by the hash it gave.
    pub(super) fn rebuild(
        &self,
        guards: &[BucketGuard<'_, ENTRIES_PER_BUCKET>],
        m: usize,
        mismatches: &mut u64,
    ) -> Option<Scratch> {
        let n = guards.len();
        let mut scratch = Scratch::new(m, n)?;
        // The objects of the first buckets, then each step the bucket
        // `REHASH_PREFETCH_BUCKETS` ahead: hints only, read from locked
        // buckets.
        let prefetch = self.rehash_prefetch.get();
        let prefetch_bucket = |g: &BucketGuard<'_, ENTRIES_PER_BUCKET>| {
            if let Some(p) = prefetch {
                for i in 0..ENTRIES_PER_BUCKET {
                    let e = g.load(i);
                    if e != 0 {
                        p(e & LOC_MASK);
                    }
                }
            }
        };
        for g in &guards[..REHASH_PREFETCH_BUCKETS.min(n)] {
            prefetch_bucket(g);
        }
        for c in 0..n {
            if let Some(g) = guards.get(c + REHASH_PREFETCH_BUCKETS) {
                prefetch_bucket(g);
            }
            let mut row = [0; ENTRIES_PER_BUCKET];
            for (i, slot) in row.iter_mut().enumerate() {
                *slot = guards[c].load(i);
            }
            scratch.old[c] = row;
            for e in row {
                if e == 0 {
                    continue;
                }
                let hash = (self.rehash)(e & LOC_MASK);
                let (home, second) = self.neighbourhood(hash, n);
                if tag_bits(hash) != tag_bits(e) || (c != home && c != second) {
                    *mismatches += 1;
                }
                let (home, second) = self.neighbourhood(hash, m);
                if !scratch.place(home, second, e) {
                    return None;
                }
            }
        }
        Some(scratch)
    }
}

impl Index {
    /// Reserve `bytes` more bucket bytes: within `max_bytes`, or past it
    /// with the part above borrowed from the overflow. `None` when neither
    /// has room.
    fn reserve_budget(&self, bytes: u64) -> Option<BudgetReservation<'_>> {
        let mut b = self.bucket_bytes.load(Ordering::Relaxed);
        loop {
            let new = b + bytes;
            let own_limit = self.max_bytes.max(self.metadata_bytes + b);
            let over = (self.metadata_bytes + new).saturating_sub(own_limit);
            if over > 0 && !self.overflow.get().is_some_and(|o| o.take(over)) {
                return None;
            }
            match self.bucket_bytes.compare_exchange_weak(
                b,
                new,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    self.borrowed_bytes.fetch_add(over, Ordering::Relaxed);
                    return Some(BudgetReservation {
                        index: self,
                        bytes,
                        borrowed: over,
                    });
                }
                Err(cur) => {
                    if let (true, Some(o)) = (over > 0, self.overflow.get()) {
                        o.give_back(over);
                    }
                    b = cur;
                }
            }
        }
    }
}

/// Gives reserved budget bytes (and what was borrowed for them) back
/// unless the resize completed.
struct BudgetReservation<'a> {
    index: &'a Index,
    bytes: u64,
    borrowed: u64,
}

impl Drop for BudgetReservation<'_> {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.index
                .bucket_bytes
                .fetch_sub(self.bytes, Ordering::Relaxed);
            if self.borrowed > 0 {
                self.index
                    .borrowed_bytes
                    .fetch_sub(self.borrowed, Ordering::Relaxed);
                if let Some(o) = self.index.overflow.get() {
                    o.give_back(self.borrowed);
                }
            }
        }
    }
}

/// Values that are valid when every byte is zero (what a fresh anonymous
/// mapping holds).
///
/// # Safety
/// The all-zero bit pattern must be a valid `Self`.
unsafe trait Zeroable: Copy {}
// SAFETY: integers and arrays of them are valid all-zero.
unsafe impl Zeroable for u8 {}
// SAFETY: as above.
unsafe impl Zeroable for [u64; ENTRIES_PER_BUCKET] {}

/// A zeroed array of `len` values in its own anonymous mapping, unmapped
/// when dropped.
///
/// A rebuild's scratch arrays are a subtable's size (up to megabytes) and
/// live for one resize. From the heap, glibc serves the first such block
/// with `mmap` and then raises its mmap threshold to that size (its
/// dynamic threshold), so every later one comes from an arena, and the
/// freed blocks stay resident: 3-4 MiB of RSS after loading 1 M small
/// objects (`memlab frag --pairs 64:128`: store bloat 1.215 from the heap,
/// 1.183 mapped), more than the quarter growth saves. A mapping of its
/// own returns every page at once. Under loom (no system calls in the
/// models) it is a boxed slice.
struct ScratchArray<T: Zeroable> {
    #[cfg(not(loom))]
    base: core::ptr::NonNull<T>,
    #[cfg(loom)]
    slice: Box<[T]>,
    #[cfg(not(loom))]
    len: usize,
}

impl<T: Zeroable> ScratchArray<T> {
    /// `len` zeroed values; `None` if the mapping fails.
    fn zeroed(len: usize) -> Option<ScratchArray<T>> {
        #[cfg(loom)]
        {
            // SAFETY: `T: Zeroable`: all-zero is a valid `T`.
            let v = vec![unsafe { core::mem::zeroed::<T>() }; len];
            Some(ScratchArray {
                slice: v.into_boxed_slice(),
            })
        }
        #[cfg(not(loom))]
        {
            let bytes = Self::bytes_of(len);
            if bytes == 0 {
                return Some(ScratchArray {
                    base: core::ptr::NonNull::dangling(),
                    len,
                });
            }
            // SAFETY: a fresh private anonymous mapping: no existing memory
            // is affected; the result is checked below.
            let p = unsafe {
                libc::mmap(
                    core::ptr::null_mut(),
                    bytes,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                return None;
            }
            Some(ScratchArray {
                base: core::ptr::NonNull::new(p.cast())?,
                len,
            })
        }
    }

    #[cfg(not(loom))]
    fn bytes_of(len: usize) -> usize {
        len * core::mem::size_of::<T>()
    }
}

impl<T: Zeroable> core::ops::Deref for ScratchArray<T> {
    type Target = [T];
    #[cfg(loom)]
    fn deref(&self) -> &[T] {
        &self.slice
    }
    #[cfg(not(loom))]
    fn deref(&self) -> &[T] {
        // SAFETY: `base` points at `len` zero-initialised (so valid, by
        // `Zeroable`) values of our own mapping, page-aligned, alive until
        // drop; `&self` excludes a `&mut` alias.
        unsafe { core::slice::from_raw_parts(self.base.as_ptr(), self.len) }
    }
}

impl<T: Zeroable> core::ops::DerefMut for ScratchArray<T> {
    #[cfg(loom)]
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.slice
    }
    #[cfg(not(loom))]
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`; `&mut self` makes this the only reference.
        unsafe { core::slice::from_raw_parts_mut(self.base.as_ptr(), self.len) }
    }
}

#[cfg(not(loom))]
impl<T: Zeroable> Drop for ScratchArray<T> {
    fn drop(&mut self) {
        let bytes = Self::bytes_of(self.len);
        if bytes > 0 {
            // SAFETY: unmaps exactly the mapping `zeroed` made; `&mut self`
            // means no slice derived from it is alive.
            unsafe { libc::munmap(self.base.as_ptr().cast(), bytes) };
        }
    }
}

// SAFETY: the array is owned memory of `T: Copy` plain values, reached only
// through `&self`/`&mut self`; nothing ties it to the creating thread.
unsafe impl<T: Zeroable + Send> Send for ScratchArray<T> {}
