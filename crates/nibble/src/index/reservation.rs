//! The address-space reservation behind one subtable (§4.3): the largest
//! bucket array the subtable may ever need, mapped once, up front, with
//! `MAP_NORESERVE`, so that growing never calls `mmap` (serialised in the
//! kernel) and only the buckets actually written become resident.
//!
//! Transparent huge pages are switched off for the reservation
//! (`MADV_NOHUGEPAGE`): otherwise touching the first bucket would fault in
//! 2 MiB and resident memory would no longer follow
//! [`Index::memory_bytes`](super::Index::memory_bytes), which the store
//! charges against its capacity. They are switched back on
//! ([`Reservation::in_use`]) for every 2 MiB-aligned chunk that lies wholly
//! below the subtable's published size, whose buckets a resize has already
//! locked (written) or is about to: huge pages there add no resident
//! memory, and an index of millions of keys on 4 KiB pages misses the TLB
//! on nearly every lookup. A shrink switches them off again for the
//! chunks its released half touches ([`Reservation::release`]), so that
//! khugepaged cannot fold released buckets back in. A reservation of at
//! least 2 MiB is aligned to 2 MiB so that its chunks are whole huge pages. Buckets about to come into use (the
//! initial ones, a resize's new half) have their pages populated writable
//! first ([`Reservation::populate`]): a bucket lock reads before it
//! writes, and a read of an untouched page maps the shared zero page,
//! which the lock's write must then replace at the cost of a TLB flush on
//! every CPU running the process. With more than one NUMA node the range is
//! bound (`MPOL_PREFERRED`) to its node before anything touches it, the
//! paper's answer to first-touch placement.
//!
//! Under `cfg(loom)` the "reservation" is a boxed slice of constructed
//! buckets, because loom's atomics are not plain words that zero pages can
//! stand in for.

use super::bucket::Bucket;
use super::{IndexError, ENTRIES_PER_BUCKET};

/// A transparent huge page.
#[cfg(not(loom))]
const HUGE_PAGE_BYTES: usize = 2 << 20;

/// `MAP_NORESERVE`, except under Miri, whose `mmap` knows only plain
/// private anonymous mappings (and tests there use tiny reservations).
#[cfg(not(loom))]
const NORESERVE: libc::c_int = if cfg!(miri) { 0 } else { libc::MAP_NORESERVE };

/// The bucket type the index stores.
pub(crate) type IndexBucket = Bucket<ENTRIES_PER_BUCKET>;

/// A fixed-size, never-moving array of `buckets` buckets, all initially
/// free (zero).
pub(crate) struct Reservation {
    #[cfg(not(loom))]
    base: core::ptr::NonNull<IndexBucket>,
    #[cfg(loom)]
    slice: Box<[IndexBucket]>,
    buckets: usize,
}

// SAFETY: the reservation is an owned mapping (or boxed slice) that is only
// ever accessed through shared references to `Bucket`s, whose fields are
// all atomics; nothing about it is tied to the creating thread.
unsafe impl Send for Reservation {}
// SAFETY: as above: `&Reservation` only hands out `&Bucket`, which is Sync.
unsafe impl Sync for Reservation {}

impl Reservation {
    /// Length of the reservation in bytes.
    pub(crate) fn bytes(&self) -> usize {
        self.buckets * core::mem::size_of::<IndexBucket>()
    }

    /// The `i`-th bucket.
    ///
    /// # Panics
    /// If `i` is beyond the reservation (the index never asks for that:
    /// it only uses buckets below its published size, which is at most the
    /// reservation; the check keeps a logic error from becoming UB).
    #[inline]
    pub(crate) fn bucket(&self, i: usize) -> &IndexBucket {
        assert!(i < self.buckets, "bucket {i} beyond the reservation");
        #[cfg(not(loom))]
        {
            // SAFETY: `i < buckets`, so the address lies inside the live
            // mapping, which outlives `&self`. mmap returns page-aligned
            // memory, so every bucket is 128-byte aligned. Untouched
            // anonymous memory reads as zero and an all-zero `Bucket` is
            // valid (`AtomicU64` has `u64`'s representation). All accesses
            // go through atomics, so handing out shared references is sound.
            unsafe { &*self.base.as_ptr().add(i) }
        }
        #[cfg(loom)]
        {
            &self.slice[i]
        }
    }

    /// Reserves `buckets` buckets of address space; `node` is a NUMA node
    /// id to prefer for the pages, or `None` for the default policy.
    #[cfg(not(loom))]
    pub(crate) fn new(buckets: usize, node: Option<usize>) -> Result<Reservation, IndexError> {
        let bytes = buckets
            .checked_mul(core::mem::size_of::<IndexBucket>())
            .ok_or_else(|| IndexError::Config(format!("{buckets} buckets overflow usize")))?;
        // Room to align a huge-page-sized reservation (not under Miri,
        // whose tests use tiny ones).
        let slop = if bytes >= HUGE_PAGE_BYTES && !cfg!(miri) {
            HUGE_PAGE_BYTES
        } else {
            0
        };
        let map_bytes = bytes
            .checked_add(slop)
            .ok_or_else(|| IndexError::Config(format!("{buckets} buckets overflow usize")))?;
        // SAFETY: a fresh private anonymous mapping with no address hint
        // and no file: it cannot alias any existing Rust object. The result
        // is checked against MAP_FAILED before use.
        let mapped = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                map_bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | NORESERVE,
                -1,
                0,
            )
        };
        if mapped == libc::MAP_FAILED {
            return Err(IndexError::Config(format!(
                "cannot reserve {bytes} bytes for a subtable: {}",
                std::io::Error::last_os_error()
            )));
        }
        let p = if slop == 0 {
            mapped
        } else {
            let start = mapped as usize;
            let aligned = start.next_multiple_of(HUGE_PAGE_BYTES);
            let (head, tail) = (aligned - start, slop - (aligned - start));
            // SAFETY: both ranges lie inside the mapping just made and
            // outside `[aligned, aligned + bytes)`, which is what we keep;
            // nothing refers to them. munmap of page-aligned ranges of our
            // own anonymous mapping cannot fail in a way that matters (a
            // failure only leaves address space reserved).
            unsafe {
                if head > 0 {
                    libc::munmap(mapped, head);
                }
                if tail > 0 {
                    libc::munmap((aligned + bytes) as *mut libc::c_void, tail);
                }
            }
            aligned as *mut libc::c_void
        };
        // SAFETY: advice on the range we just mapped; failure (e.g. a
        // kernel without THP) only leaves the default policy in place.
        #[cfg(not(miri))]
        unsafe {
            libc::madvise(p, bytes, libc::MADV_NOHUGEPAGE)
        };
        if let Some(node) = node {
            bind_to_node(p, bytes, node);
        }
        let base = core::ptr::NonNull::new(p.cast::<IndexBucket>())
            .ok_or_else(|| IndexError::Config("mmap returned null".into()))?;
        Ok(Reservation { base, buckets })
    }

    /// The start and length of the whole 2 MiB chunks under the first
    /// `buckets` buckets, if any (and if the reservation is aligned).
    #[cfg(not(loom))]
    fn whole_chunks(&self, buckets: usize) -> Option<(usize, usize)> {
        let bytes = buckets.min(self.buckets) * core::mem::size_of::<IndexBucket>();
        let whole = bytes / HUGE_PAGE_BYTES * HUGE_PAGE_BYTES;
        let base = self.base.as_ptr() as usize;
        (whole > 0 && !cfg!(miri) && base.is_multiple_of(HUGE_PAGE_BYTES)).then_some((base, whole))
    }

    /// The first `buckets` buckets are in use (published, or about to be
    /// written by a resize): give their whole 2 MiB chunks huge pages.
    #[cfg(not(loom))]
    pub(crate) fn in_use(&self, buckets: usize) {
        let Some((base, whole)) = self.whole_chunks(buckets) else {
            return;
        };
        // SAFETY: advice on a range inside our own mapping; it changes no
        // contents, and failure (a kernel without THP) only leaves 4 KiB
        // pages.
        unsafe {
            libc::madvise(base as *mut libc::c_void, whole, libc::MADV_HUGEPAGE);
        }
    }

    /// The first `buckets` buckets are all resident: fold their whole
    /// 2 MiB chunks that are still in 4 KiB pages (they held buckets before
    /// [`Reservation::in_use`] covered them) into huge pages now
    /// (`MADV_COLLAPSE`, Linux 6.1+; elsewhere they stay 4 KiB, or
    /// khugepaged folds them later). Adds no resident memory: the chunks
    /// are fully resident already.
    #[cfg(not(loom))]
    pub(crate) fn collapse(&self, buckets: usize) {
        let Some((base, whole)) = self.whole_chunks(buckets) else {
            return;
        };
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: advice on a range inside our own mapping; the kernel
        // copies the pages and remaps them transparently (concurrent
        // accesses wait on the fault), so contents and atomicity are kept.
        // Failure (an older kernel, no free huge page) changes nothing.
        unsafe {
            libc::madvise(base as *mut libc::c_void, whole, libc::MADV_COLLAPSE);
        }
    }

    /// Buckets `[from, to)` are about to be written for the first time
    /// (the initial size, or a resize's new half): map their pages in
    /// writable now, one `MADV_POPULATE_WRITE` (Linux 5.14+) for the whole
    /// pages of the range. Otherwise the first access to each page is the
    /// load of a bucket lock's test-and-set, which maps the shared zero
    /// page, and the lock's CAS then faults again to replace it; that
    /// second fault flushes the page from every CPU's TLB (an IPI to each
    /// CPU running the process), 8 % of a 1 M-record load's CPU samples
    /// in a profile. Only the range's whole pages: a partial page at the
    /// end would make buckets resident that nobody has counted. Failure
    /// (an older kernel) changes nothing; the writes then fault as usual.
    #[cfg(not(loom))]
    pub(crate) fn populate(&self, from: usize, to: usize) {
        const PAGE_BYTES: usize = 4096;
        let bucket = core::mem::size_of::<IndexBucket>();
        let base = self.base.as_ptr() as usize;
        let start = (base + from.min(self.buckets) * bucket) / PAGE_BYTES * PAGE_BYTES;
        let end = (base + to.min(self.buckets) * bucket) / PAGE_BYTES * PAGE_BYTES;
        if end > start && !cfg!(miri) {
            // SAFETY: a page-aligned range inside our own private
            // anonymous mapping (`start` rounds down to at most `base`'s
            // page, which is page-aligned; `end` is at most the mapping's
            // end). Populating changes no contents: a page already present
            // is left as it is, a missing one is mapped in as zeros, which
            // is what it read as before.
            unsafe {
                libc::madvise(
                    start as *mut libc::c_void,
                    end - start,
                    libc::MADV_POPULATE_WRITE,
                );
            }
        }
    }

    /// Loom build: the buckets are constructed already.
    #[cfg(loom)]
    pub(crate) fn populate(&self, _from: usize, _to: usize) {}

    /// Buckets `[from, to)` are no longer in use and nobody reads them:
    /// drop their whole pages (`MADV_DONTNEED`), which then read as free
    /// buckets again, as they did before they were first touched. The
    /// 2 MiB chunks the range touches are no longer wholly in use, so
    /// they lose their huge pages first (`MADV_NOHUGEPAGE`, until
    /// [`Reservation::in_use`] covers them again): otherwise khugepaged
    /// would fold the chunk that still holds buckets below `from` back
    /// into one huge page, and its released pages would be resident again
    /// (up to 2 MiB that [`Index::memory_bytes`](super::Index::memory_bytes)
    /// does not count).
    #[cfg(not(loom))]
    pub(crate) fn release(&self, from: usize, to: usize) {
        const PAGE_BYTES: usize = 4096;
        let bucket = core::mem::size_of::<IndexBucket>();
        let base = self.base.as_ptr() as usize;
        let lo = base + from.min(self.buckets) * bucket;
        let hi = base + to.min(self.buckets) * bucket;
        if hi > lo && !cfg!(miri) && base.is_multiple_of(HUGE_PAGE_BYTES) {
            let chunk_lo = lo / HUGE_PAGE_BYTES * HUGE_PAGE_BYTES;
            let chunk_hi = hi
                .next_multiple_of(HUGE_PAGE_BYTES)
                .min(base + self.bytes());
            // SAFETY: advice on a range inside our own mapping (`chunk_lo`
            // is at least `base`, `chunk_hi` at most its end); it changes
            // no contents, and failure only leaves the advice as it was.
            unsafe {
                libc::madvise(
                    chunk_lo as *mut libc::c_void,
                    chunk_hi - chunk_lo,
                    libc::MADV_NOHUGEPAGE,
                );
            }
        }
        let start = lo.next_multiple_of(PAGE_BYTES);
        let end = hi / PAGE_BYTES * PAGE_BYTES;
        if end > start && !cfg!(miri) {
            // SAFETY: a page-aligned range inside our own private
            // anonymous mapping whose buckets the caller says nobody
            // uses; afterwards it reads as zero, a valid free bucket.
            unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED);
            }
        }
    }

    /// Loom build: nothing to release.
    #[cfg(loom)]
    pub(crate) fn release(&self, _from: usize, _to: usize) {}

    /// Loom build: nothing to advise.
    #[cfg(loom)]
    pub(crate) fn in_use(&self, _buckets: usize) {}

    /// Loom build: nothing to collapse.
    #[cfg(loom)]
    pub(crate) fn collapse(&self, _buckets: usize) {}

    /// Loom build: constructs every bucket (the node is ignored).
    #[cfg(loom)]
    pub(crate) fn new(buckets: usize, _node: Option<usize>) -> Result<Reservation, IndexError> {
        Ok(Reservation {
            slice: (0..buckets).map(|_| IndexBucket::new()).collect(),
            buckets,
        })
    }
}

#[cfg(not(loom))]
impl Drop for Reservation {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the range `new` mapped; `&mut self` means
        // no bucket reference derived from it is still alive.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.bytes()) };
    }
}

/// Prefers `node` for the pages of `[p, p + bytes)`. Best effort: a kernel
/// without NUMA support, or a node that disappeared, keeps the default
/// first-touch policy, which is correct, only slower.
#[cfg(not(loom))]
fn bind_to_node(p: *mut libc::c_void, bytes: usize, node: usize) {
    const BITS_PER_WORD: usize = u64::BITS as usize;
    let mut mask = vec![0u64; node / BITS_PER_WORD + 1];
    mask[node / BITS_PER_WORD] |= 1 << (node % BITS_PER_WORD);
    // The kernel reads `maxnode - 1` bits of the mask.
    let max_node = mask.len() * BITS_PER_WORD + 1;
    // SAFETY: mbind only changes the memory policy of a range we own; the
    // mask pointer is valid for `mask.len()` words for the whole call.
    unsafe {
        libc::syscall(
            libc::SYS_mbind,
            p,
            bytes,
            libc::MPOL_PREFERRED,
            mask.as_ptr(),
            max_node,
            0u32,
        )
    };
}

#[cfg(all(test, not(loom), not(miri), target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::*;

    const PAGE_BYTES: usize = 4096;

    /// Resident pages of `len` bytes at byte `from` of the reservation
    /// (`mincore`).
    fn resident_pages(r: &Reservation, from: usize, len: usize) -> usize {
        let mut vec = vec![0u8; len / PAGE_BYTES];
        // SAFETY: the range lies inside the reservation's mapping (the
        // caller's offsets are page multiples below `r.bytes()`), and
        // `vec` has one byte per page of it.
        let rc = unsafe {
            libc::mincore(
                r.base.as_ptr().cast::<u8>().add(from).cast(),
                len,
                vec.as_mut_ptr(),
            )
        };
        assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
        vec.iter().filter(|&&p| p & 1 != 0).count()
    }

    /// A halving from 4 MiB to 1 MiB of buckets: the released pages stay
    /// released even when the chunk that still holds buckets is collapsed
    /// (`MADV_COLLAPSE`, what khugepaged does on its own: it folds a chunk
    /// with any page present into a huge page, filling the holes).
    #[test]
    fn released_buckets_stay_released_through_a_collapse() {
        let bucket = core::mem::size_of::<IndexBucket>();
        let n = 2 * HUGE_PAGE_BYTES / bucket;
        let r = Reservation::new(n, None).unwrap();
        r.in_use(n);
        r.populate(0, n);
        assert_eq!(resident_pages(&r, 0, r.bytes()), r.bytes() / PAGE_BYTES);
        let keep_bytes = HUGE_PAGE_BYTES / 2;
        r.release(keep_bytes / bucket, n);
        // SAFETY: advice on the reservation's first 2 MiB chunk, inside
        // its mapping; a collapse keeps every page's contents.
        unsafe {
            libc::madvise(r.base.as_ptr().cast(), HUGE_PAGE_BYTES, libc::MADV_COLLAPSE);
        }
        assert_eq!(
            resident_pages(&r, keep_bytes, r.bytes() - keep_bytes),
            0,
            "released buckets are resident again"
        );
        assert_eq!(resident_pages(&r, 0, keep_bytes), keep_bytes / PAGE_BYTES);
    }
}
