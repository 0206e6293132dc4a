//! Integrity: checksums that keep damaged bytes from being served.
//!
//! A store's files can be damaged while no process has them mapped (a bad
//! disk block, a stray write, an adversary with the directory). Three
//! checksums, each placed where it costs little, make every such damage
//! either detected or harmless:
//!
//! * **Per object** (CRC-32C, hardware `crc32` instruction through the
//!   `crc32c` crate): over the key, the value and the immutable header
//!   bytes (lengths, flags, version), kept in the object's state word next
//!   to a 16-bit magic — no byte added to an object. Written by the append
//!   (and re-finished if the put's version is decided under the locks),
//!   copied unchanged by compaction. Verified by every read that returns
//!   object bytes (`get`, `meta`, `scan`, key iteration), by compaction
//!   before it moves an object, and by recovery's log walk. A read that
//!   finds its key's object damaged answers [`Error::Damaged`] for that key
//!   (never the bytes); the object is counted (`damaged_objects` in the
//!   meta header, `Stats`) and logged (rate-limited). Compaction drops a
//!   damaged object from the index instead of moving it; recovery leaves it
//!   out of the rebuilt index. The cost is one CRC pass over the bytes a
//!   read copies anyway (`examples/checksum_cost`: ~30 ns for a 16-byte
//!   key and a value up to 64 bytes, ~130 ns at 1 KiB, ~20 GB/s for large
//!   values; the CRC chain's latency, not its bandwidth, bounds small
//!   objects). What it does not cover: the two state bits (COMMITTED,
//!   DEAD) and the expiry, which change in place after publication. A
//!   flipped expiry bit can make a key expire early or late; a flipped
//!   COMMITTED bit hides an object from a rebuild; a flipped DEAD bit
//!   revives an old version in a rebuild, where the newest version still
//!   wins unless it was itself damaged (two faults on one key).
//! * **Structure, at clean shutdown** ("the seal"): the last process to
//!   detach writes CRC-32C of the index segment and of the meta segment
//!   (less its header) next to the clean flag; the next attach verifies
//!   both before it trusts the flag. A bad index seal makes the attach
//!   rebuild the index from the log (the existing recovery path) instead of
//!   trusting it; a bad meta seal makes it also distrust the segment table
//!   and heads (every segment is walked to its end and its state and
//!   length are re-derived from what parses). Checking the seal reads the
//!   index once (6.2 % of the capacity, faulted in with
//!   `MADV_POPULATE_READ` and checksummed over up to 16 threads), so a
//!   clean restart stays a map plus one pass over the index, not a log
//!   scan: 30-100 ms for 4 GiB of data (a 128-256 MiB index) on 2 busy CPUs,
//!   where mapping alone took 0.5-6 ms.
//! * **Geometry** (CRC-32C of the header's geometry words, written at
//!   creation): checked at every attach; a mismatch is refused, since
//!   nothing can be rebuilt without the geometry.
//!
//! The log walk that recovery and compaction share ([`Inner::walk_intact`])
//! survives damage: after an object whose checksum fails (its length is
//! not trusted: a flipped length bit can land exactly on a later object's
//! start and skip the intact ones between) or a word where no object
//! parses, the walk resynchronizes by scanning ahead 8 bytes at a time for
//! the next intact object (magic, length inside the segment, checksum).
//! So one damaged object loses only itself, never the intact objects
//! after it, and garbage never parses as a key (a false resync needs a
//! 16-bit magic and a 32-bit checksum to match by chance). Compaction
//! quarantines a victim with an unparseable region or a damaged object it
//! cannot find in the index (tagged CLOSED, never picked): index entries
//! may still name objects in it, so its space waits for the next index
//! rebuild.

use super::*;

/// Log the first this many damaged objects one by one, then powers of two.
const DAMAGE_LOG_FIRST: u64 = 32;
/// Most threads the seal check uses.
const MAX_SEAL_THREADS: usize = 16;
/// Page size for aligning `madvise` ranges (4 KiB; a larger real page
/// only makes the range start earlier within the same mapping).
const PAGE_BYTES: u64 = 4096;
/// Each seal-check thread gets at least this many bytes.
const MIN_SEAL_CHUNK_BYTES: u64 = 16 << 20;

/// What [`Inner::walk_intact`] found in one segment.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SegWalk {
    /// Damaged objects that were live, and unparseable regions (whose
    /// contents are unknown).
    pub(crate) damaged: u64,
    /// Unparseable regions among those.
    pub(crate) regions: u64,
    /// End of the last intact object.
    pub(crate) end: u64,
    /// Times the walk resynchronized (after a damaged object or where no
    /// object parsed). With none, every object up to `end` parsed and
    /// passed its checksum, one after the other.
    pub(crate) resyncs: u64,
}

/// The outcome of checking the clean-shutdown seal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SealCheck {
    pub(crate) meta_ok: bool,
    pub(crate) index_ok: bool,
}

impl Inner {
    /// Count and log a damaged object (at log location `loc`) found by
    /// `by`.
    pub(crate) fn note_damaged(&self, loc: u64, by: &str) {
        let n = self.hdr().damaged_objects.fetch_add(1, Ordering::Relaxed) + 1;
        if n <= DAMAGE_LOG_FIRST || n.is_power_of_two() {
            log::error!(
                "nibblejmp store {}: damaged object at log offset {:#x} (checksum mismatch, found by {by}); not served ({n} damaged objects counted)",
                self.dir.display(),
                loc.saturating_sub(1)
            );
        }
    }

    /// The key's object for a read: `Ok(None)` if absent, the object if
    /// present and intact, [`Error::Damaged`] if its object, or an object
    /// with its hash tag that fails its checksum (it may have been this
    /// key with a damaged key byte), is damaged and no intact one exists.
    /// Expiry is the caller's.
    pub(crate) fn find_checked(
        &self,
        key: &[u8],
        b0: usize,
        b1: usize,
        tag: u64,
    ) -> Result<Option<Obj>> {
        let mut damaged = None;
        let bs = if b0 == b1 { [b0, usize::MAX] } else { [b0, b1] };
        for b in bs {
            if b == usize::MAX {
                continue;
            }
            for e in &self.bucket(b).entries {
                let e = e.load(Ordering::Acquire);
                if e == 0 || e >> LOC_BITS != tag {
                    continue;
                }
                let loc = e & LOC_MASK;
                let Some(h) = self.obj_header(loc) else {
                    // An indexed object whose magic or length is gone.
                    damaged = Some(loc);
                    continue;
                };
                let same = h.key_len as usize == key.len() && self.obj_key(&h) == key;
                // Tags rarely collide (16 bits), so the checksum of a
                // different key's object is almost never computed.
                let intact = self.obj_intact(&h);
                if same && intact {
                    return Ok(Some(h));
                }
                if !intact {
                    damaged = Some(loc);
                }
            }
        }
        match damaged {
            None => Ok(None),
            Some(loc) => {
                self.note_damaged(loc, "a read");
                Err(Error::Damaged {
                    key: String::from_utf8_lossy(&key[..key.len().min(64)]).into_owned(),
                })
            }
        }
    }

    /// The first offset from `from` (8-aligned) where an intact object
    /// starts, or past `limit`.
    fn resync(&self, base: u64, from: u64, limit: u64) -> u64 {
        let mut n = from;
        while n + OBJ_PREFIX_BYTES <= limit && !self.intact_at(base, n, limit) {
            n += 8;
        }
        n
    }

    /// Remove every index entry whose object fails its checksum (a
    /// damaged key cannot be deleted by name: `flush` calls this after
    /// deleting the keys it could list). Each removal is a delete under the
    /// entry's bucket lock with a DEL intent. Returns how many.
    pub(crate) fn drop_damaged_entries(&self) -> Result<u64> {
        const BUCKETS_PER_PIN: usize = 256;
        let intact = |e: u64| {
            self.obj_header(e & LOC_MASK)
                .is_some_and(|h| self.obj_intact(&h))
        };
        let n_buckets = self.geo.index_buckets as usize;
        let mut n = 0;
        for first in (0..n_buckets).step_by(BUCKETS_PER_PIN) {
            let op = self.begin();
            for b in first..(first + BUCKETS_PER_PIN).min(n_buckets) {
                for i in 0..ENTRIES_PER_BUCKET {
                    let e = self.bucket(b).entries[i].load(Ordering::Acquire);
                    if e == 0 || intact(e) {
                        continue;
                    }
                    self.set_intent(&op, INTENT_DEL, b, b, 0, 0);
                    self.lock_pair(&op, b, b)?;
                    if self.bucket(b).entries[i].load(Ordering::Acquire) == e {
                        let loc = e & LOC_MASK;
                        self.set_intent_old(&op, loc);
                        self.bucket(b).entries[i].store(0, Ordering::Release);
                        self.mark(loc, OBJ_DEAD);
                        self.count_items(&op, -1);
                        n += 1;
                    }
                    self.unlock_pair(b, b);
                }
            }
        }
        Ok(n)
    }

    /// Whether an intact object (magic, length inside `limit`, checksum)
    /// starts at offset `off` of the segment at log offset `base`.
    fn intact_at(&self, base: u64, off: u64, limit: u64) -> bool {
        if off + OBJ_PREFIX_BYTES > limit {
            return false;
        }
        self.obj_header(base + off + 1).is_some_and(|h| {
            off + object_bytes(h.key_len as usize, h.value_cap as usize) <= limit
                && self.obj_intact(&h)
        })
    }

    /// Walk the objects of segment `s` from its start to `limit` bytes
    /// (the caller reports what it counts as damaged),
    /// calling `f(object, size, intact)` for each object that parses
    /// (magic, length inside the limit), intact or not; `f` returns false
    /// to stop. After a damaged object (whose length cannot be trusted),
    /// and where no object parses, the walk scans ahead 8 bytes at a time
    /// for the next intact object (magic, length, checksum). With `zero_ends`, a zero word where an object
    /// should start ends the walk (the end of the data when `limit` is not
    /// known to be the end).
    pub(crate) fn walk_intact(
        &self,
        s: usize,
        limit: u64,
        zero_ends: bool,
        f: impl FnMut(&Obj, u64, bool) -> bool,
    ) -> SegWalk {
        self.walk_intact_with(s, limit, zero_ends, true, f)
    }

    /// [`walk_intact`](Self::walk_intact), with the checksums left
    /// unchecked (every object taken as intact) when `check` is false:
    /// only for a segment that an earlier walk in the same exclusive
    /// recovery found with no resync up to `limit` (its bytes have not
    /// changed since, and the checksum covers none of the state bits
    /// recovery changes).
    pub(crate) fn walk_intact_with(
        &self,
        s: usize,
        limit: u64,
        zero_ends: bool,
        check: bool,
        mut f: impl FnMut(&Obj, u64, bool) -> bool,
    ) -> SegWalk {
        let base = s as u64 * self.geo.seg_bytes;
        let limit = limit.min(self.geo.seg_bytes);
        let mut w = SegWalk::default();
        let mut off = 0;
        while off + OBJ_PREFIX_BYTES <= limit {
            if let Some(h) = self.obj_header(base + off + 1) {
                let size = object_bytes(h.key_len as usize, h.value_cap as usize);
                let next = off + size;
                if next <= limit {
                    let intact = !check || self.obj_intact(&h);
                    if intact {
                        off = next;
                        w.end = off;
                        if !f(&h, size, true) {
                            return w;
                        }
                        continue;
                    }
                    // Damaged: its length is not to be trusted (a flipped
                    // length bit can land on a later object's start and
                    // skip the intact ones between).
                    let st = self.obj_state(h.loc()).load(Ordering::Acquire);
                    if st & OBJ_COMMITTED != 0 && st & OBJ_DEAD == 0 {
                        w.damaged += 1;
                    }
                    if !f(&h, size, false) {
                        return w;
                    }
                    w.resyncs += 1;
                    off = self.resync(base, off + 8, limit);
                    continue;
                }
            } else if zero_ends {
                let loc = self.valid_loc(base + off + 1);
                if loc.is_some_and(|l| self.obj_state(l).load(Ordering::Acquire) == 0) {
                    return w;
                }
            }
            // Nothing parses here.
            if !zero_ends {
                w.damaged += 1;
                w.regions += 1;
            }
            w.resyncs += 1;
            off = self.resync(base, off + 8, limit);
        }
        w
    }

    // ---- the clean-shutdown seal and the geometry checksum ----------

    /// CRC-32C of the geometry words of the meta header.
    pub(crate) fn geometry_crc(&self) -> u64 {
        let h = self.hdr();
        // The magic as it must be (it is stored last at creation and
        // checked on its own at attach).
        let magic = AtomicU64::new(MAGIC);
        let words = [
            &magic,
            &h.layout_version,
            &h.capacity_bytes,
            &h.seg_bytes,
            &h.log_segments,
            &h.index_buckets,
            &h.heads,
            &h.reserve_segments,
        ];
        debug_assert_eq!(words.len(), GEOMETRY_WORDS);
        let mut b = [0u8; GEOMETRY_WORDS * 8];
        for (chunk, w) in b.chunks_exact_mut(8).zip(words) {
            chunk.copy_from_slice(&w.load(Ordering::Acquire).to_le_bytes());
        }
        SEAL_VALID | u64::from(crc32c::crc32c(&b))
    }

    /// CRC-32C of `len` bytes at `addr`, split over threads, combined.
    ///
    /// # Safety
    /// `[addr, addr + len)` is mapped and readable for the call, and no
    /// thread or process writes it meanwhile (the caller holds the attach
    /// lock and is the only process attached, with no operation running).
    unsafe fn crc_range(addr: u64, len: u64) -> u32 {
        let threads = std::thread::available_parallelism()
            .map_or(1, |p| p.get())
            .clamp(1, MAX_SEAL_THREADS)
            .min(len.div_ceil(MIN_SEAL_CHUNK_BYTES).max(1) as usize);
        let chunk = len.div_ceil(threads as u64).next_multiple_of(8);
        let crcs: Vec<(u32, u64)> = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..threads as u64)
                .map(|t| {
                    let start = (t * chunk).min(len);
                    let n = chunk.min(len - start);
                    sc.spawn(move || {
                        // Fault the chunk in with one call (a fresh mapping
                        // would otherwise take a page fault per 4 KiB);
                        // advisory, so a kernel without it just faults.
                        // SAFETY: madvise on a mapped range the caller
                        // vouches for; POPULATE_READ only reads it.
                        unsafe {
                            libc::madvise(
                                ((addr + start) & !(PAGE_BYTES - 1)) as *mut libc::c_void,
                                (n + ((addr + start) & (PAGE_BYTES - 1))) as usize,
                                libc::MADV_POPULATE_READ,
                            )
                        };
                        // SAFETY: within the range the caller vouches for,
                        // which nobody writes during the call.
                        let s = unsafe {
                            std::slice::from_raw_parts((addr + start) as *const u8, n as usize)
                        };
                        (crc32c::crc32c(s), n)
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap_or((0, u64::MAX)))
                .collect()
        });
        crcs.into_iter().fold(0u32, |acc, (c, n)| {
            if n == u64::MAX {
                // A thread panicked: make the seal fail rather than pass.
                !acc
            } else {
                crc32c::crc32c_combine(acc, c, n as usize)
            }
        })
    }

    /// The current (meta, index) seal words.
    ///
    /// # Safety
    /// As [`crc_range`](Self::crc_range): no one else is attached and no
    /// operation of this process runs.
    unsafe fn seal_words(&self) -> (u64, u64) {
        let hdr_bytes = core::mem::size_of::<MetaHeader>() as u64;
        let meta_len = meta_bytes(self.geo.log_segments) - hdr_bytes;
        let index_len = self.geo.index_buckets * BUCKET_BYTES;
        // SAFETY: the meta segment holds `meta_bytes(log_segments)` bytes
        // and the index `index_buckets` buckets (checked at attach); the
        // caller vouches that nobody writes them.
        let (m, i) = unsafe {
            (
                Self::crc_range(self.meta as u64 + hdr_bytes, meta_len),
                Self::crc_range(self.index as u64, index_len),
            )
        };
        (SEAL_VALID | u64::from(m), SEAL_VALID | u64::from(i))
    }

    /// Write the seal (the last process's clean detach, before `clean`).
    ///
    /// # Safety
    /// As [`seal_words`](Self::seal_words).
    pub(crate) unsafe fn write_seal(&self) {
        // SAFETY: forwarded from the caller.
        let (m, i) = unsafe { self.seal_words() };
        self.hdr().seal_meta_crc.store(m, Ordering::Relaxed);
        self.hdr().seal_index_crc.store(i, Ordering::Relaxed);
    }

    /// Check the seal written by the last clean detach, and clear it (it
    /// is only valid until the store is used again).
    ///
    /// # Safety
    /// As [`seal_words`](Self::seal_words).
    pub(crate) unsafe fn check_seal(&self) -> SealCheck {
        let h = self.hdr();
        let (m0, i0) = (
            h.seal_meta_crc.load(Ordering::Acquire),
            h.seal_index_crc.load(Ordering::Acquire),
        );
        // SAFETY: forwarded from the caller.
        let (m, i) = unsafe { self.seal_words() };
        h.seal_meta_crc.store(0, Ordering::Relaxed);
        h.seal_index_crc.store(0, Ordering::Relaxed);
        SealCheck {
            meta_ok: m0 == m,
            index_ok: i0 == i,
        }
    }
}
