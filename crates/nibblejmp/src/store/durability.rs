//! Durability: what a flush makes survive a power cut, and what recovery
//! then finds (Redis's `appendfsync`, issue 25).
//!
//! A store on a disk directory is a set of shared file mappings: every
//! write is in the page cache at once (so it survives the process), and
//! reaches the disk when the kernel writes the page back — in no promised
//! order — or when someone flushes. [`SharedStore::flush_to_disk`] is that
//! flush: one `msync(MS_SYNC)` of the log (the dirty pages only: the
//! kernel keeps the dirty set), so one device flush per flush.
//!
//! **The log is the only thing recovery trusts after a power cut.** The
//! index and the meta segment (segment table, heads, counters) are not
//! flushed; their pages on disk may be of any age, or torn. So an unclean
//! attach of a store that may have lost power distrusts the meta segment
//! as a failed shutdown seal does: it re-derives every segment's state
//! and end from the log (walking each segment to its first zero word)
//! and rebuilds the index from the log (`crate::recovery`). "May have
//! lost power": a `boot_id` file in the directory, written when
//! durability is turned on or off, names another boot than this one
//! (the machine restarted since); without that file, the directory is
//! not on tmpfs. A process that died while the machine kept running
//! leaves every page in the page cache, so the same boot keeps the
//! cheaper SIGKILL recovery (verify the index in a parallel walk).
//! Turning durability on writes the meta segment once (its clean flag is
//! 0 from then on, on disk too), so a store that was clean before is
//! never taken for clean after a power cut.
//!
//! A flush is not a snapshot: writers keep running while it writes, and
//! the pages reach the disk one by one. Two rules make "every write that
//! finished before a flush began is durable once it completed" hold
//! anyway, whatever subset of later pages also reached the disk:
//!
//! 1. **No kill before its replacement is durable.** A put that replaces
//!    an object, and compaction that moves one, would set the old
//!    object's DEAD bit at once; that page may reach the disk before the
//!    page of the replacement, and a power cut between the two would lose
//!    the key (old dead, new absent). With durability on, these kills are
//!    *deferred*: the old object's location and state word go to a pending
//!    list (one per epoch slot of this process, so writers never share a
//!    lock), and the flusher applies them only after the flush that
//!    covers their replacements has completed. Until then the old object
//!    looks live in the log but no index entry names it: reads, scans and
//!    compaction go through the index and never see it; recovery after a
//!    crash finds two live versions of the key and keeps the newest (its
//!    rebuild's rule), which is the replacement if that reached the disk
//!    and the old, acknowledged value otherwise. A kill is a compare-and-
//!    swap on the exact state word recorded, so it can never touch other
//!    bytes. Without checkpoints deletes kill at once: their only effect
//!    is the kill, and a delete reaching the disk early is still a state
//!    the client could have seen. With checkpoints (`checkpoint.rs`) a
//!    delete's kill is deferred too, until its tombstone is durable.
//! 2. **No segment reused before its emptying is durable.** Compaction
//!    copies a victim's live objects, then retires it; reusing it would
//!    overwrite the originals. With durability on, a retired segment is
//!    freed only when a flush that *began* after its retirement has
//!    completed ([`Inner::reuse_stamp`], next to the epoch rule), so the
//!    copies are on disk first. A writer out of space whose only
//!    reclaimable segments wait for this flushes inline (one `msync`).
//!
//! What recovery relies on after a power cut is the log: checksummed
//! objects (a torn or partly written one fails its CRC and is skipped,
//! the walk resynchronizes on the next intact one), each with its state
//! bits, version and expiry. Among live objects of one key the newest
//! version wins. A segment's stale bytes past its new end, once reused,
//! hold only objects whose DEAD bits were set before the flush that
//! allowed the reuse began, so that flush wrote them.
//!
//! Restart time after a power cut is therefore one walk of the log (in
//! parallel, re-deriving each segment and indexing it in one pass), or,
//! from a fuzzy index checkpoint, a walk of what was written since it
//! (`checkpoint.rs`).
//!
//! Durability is per process: the kills and the reuse rule above are kept
//! by the process that turned it on (the server); another process attached
//! to the same store kills at once.
//!
//! ## The power-loss test layer
//!
//! [`SharedStore::keep_power_image`] keeps a *durable image* of the store:
//! a directory holding two generations (`a`, `b`) of the three segment
//! files and a `current` file naming the complete one. Every completed
//! flush copies the log file (which the flush made durable, with whatever
//! else happened to be in it: a fuzzy copy, as a real flush) into the
//! other generation, then renames a new `current` into place, so a
//! process killed mid-flush leaves the previous generation whole. The meta
//! and index files are copied once, when the image starts (after the
//! attach: the clean flag is 0 in them), since no flush writes them. A
//! test "cuts the power" by
//! killing the process and copying `current`'s files over the store's;
//! what it restarts from is then exactly what completed flushes wrote
//! (with no help from write-back the kernel might also have done).

use std::fs;

use super::attach::io_err;
use super::*;

/// Pending-kill lists: one per local epoch slot, at most this many.
pub(crate) const KILL_LISTS: usize = 64;

/// Flush counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlushStats {
    /// Completed flushes.
    pub flushes: u64,
    /// Time spent in them, µs.
    pub flush_us_total: u64,
    /// Failed flushes.
    pub flush_errors: u64,
    /// Kills applied after a flush (rule 1 of the essay).
    pub deferred_kills: u64,
    /// Flushes done inline by a writer or compaction waiting for a
    /// segment (rule 2).
    pub inline_flushes: u64,
}

/// Where the durable image of the power-loss test layer lives.
struct PowerImage {
    dir: PathBuf,
    /// The generation `current` names: false = `a`, true = `b`.
    current_b: bool,
    /// File offset of the log's data in `seg.log` (its header page).
    log_file_offset: u64,
    /// Log segments that were not FREE at the last flush.
    last_in_use: Vec<bool>,
    /// Per generation: segments written since it was last brought up to
    /// date.
    stale: [Vec<bool>; 2],
}

/// The process's durability state (see the module essay).
pub(crate) struct Durability {
    /// Deferred kills and the reuse rule are on.
    on: AtomicBool,
    /// Start stamp of the last completed flush.
    durable_stamp: AtomicU64,
    /// (location, state word) of objects to kill after the next flush.
    kills: Vec<Mutex<Vec<(u64, u64)>>>,
    /// One flush at a time.
    flush_lock: Mutex<()>,
    image: Mutex<Option<PowerImage>>,
    flushes: AtomicU64,
    flush_us_total: AtomicU64,
    flush_errors: AtomicU64,
    deferred_kills: AtomicU64,
    inline_flushes: AtomicU64,
}

impl Durability {
    pub(crate) fn new() -> Durability {
        Durability {
            on: AtomicBool::new(false),
            durable_stamp: AtomicU64::new(0),
            kills: (0..KILL_LISTS).map(|_| Mutex::new(Vec::new())).collect(),
            flush_lock: Mutex::new(()),
            image: Mutex::new(None),
            flushes: AtomicU64::new(0),
            flush_us_total: AtomicU64::new(0),
            flush_errors: AtomicU64::new(0),
            deferred_kills: AtomicU64::new(0),
            inline_flushes: AtomicU64::new(0),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Inner {
    /// Kill `old`, replaced by an object this operation (`op`) made
    /// visible: at once, or after the next flush when durability is on.
    pub(crate) fn kill_replaced(&self, op: &Op<'_>, old: u64) {
        if !self.dur.on.load(Ordering::Relaxed) {
            self.mark(old, OBJ_DEAD);
            return;
        }
        let Some(loc) = self.valid_loc(old) else {
            return;
        };
        let st = self.obj_state(loc).load(Ordering::Acquire);
        if st & OBJ_MAGIC_MASK != OBJ_MAGIC || st & OBJ_DEAD != 0 {
            return;
        }
        lock(&self.dur.kills[op.local % KILL_LISTS]).push((old, st));
    }

    /// Segments retired at or after this stamp stay retired (rule 2):
    /// the start of the last completed flush, or `u64::MAX` when
    /// durability is off.
    pub(crate) fn reuse_stamp(&self) -> u64 {
        if self.dur.on.load(Ordering::Acquire) {
            self.dur.durable_stamp.load(Ordering::Acquire)
        } else {
            u64::MAX
        }
    }

    /// A reclaimer found segments held back only by rule 2: flush now.
    pub(crate) fn flush_for_reuse(&self) {
        self.dur.inline_flushes.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = self.flush_to_disk() {
            log::error!("flushing {} for segment reuse: {e}", self.dir.display());
        }
    }

    /// Apply every pending kill (compare-and-swap on the recorded word).
    fn apply_kills(&self, kills: &[(u64, u64)]) {
        for &(loc, st) in kills {
            if let Some(v) = self.valid_loc(loc) {
                let _ = self.obj_state(v).compare_exchange(
                    st,
                    st | OBJ_DEAD,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                );
            }
        }
        self.dur
            .deferred_kills
            .fetch_add(kills.len() as u64, Ordering::Relaxed);
    }

    fn take_kills(&self) -> Vec<(u64, u64)> {
        let mut all = Vec::new();
        for l in &self.dur.kills {
            let mut g = lock(l);
            if all.is_empty() {
                std::mem::swap(&mut all, &mut *g);
            } else {
                all.append(&mut g);
            }
        }
        all
    }

    /// Apply the pending kills without a flush (durability turned off, or
    /// a clean close, which syncs everything after).
    pub(crate) fn drain_kills(&self) {
        let _g = lock(&self.dur.flush_lock);
        let k = self.take_kills();
        self.apply_kills(&k);
    }

    /// `msync` one mapped range.
    fn msync(&self, addr: u64, len: u64) -> Result<()> {
        // SAFETY: the range is the page-aligned start of one of the
        // store's segments, mapped shared by `vh` for as long as `self`
        // lives, and at most that segment's data length.
        if unsafe { libc::msync(addr as *mut libc::c_void, len as usize, libc::MS_SYNC) } != 0 {
            return Err(io_err("msync", &self.dir, std::io::Error::last_os_error()));
        }
        Ok(())
    }

    /// The flush (module essay): the log; then the kills recorded before
    /// it began; then segments retired before it began may be reused.
    pub(crate) fn flush_to_disk(&self) -> Result<()> {
        let _g = lock(&self.dur.flush_lock);
        let t = Instant::now();
        let start = ordered_stamp();
        let kills = self.take_kills();
        let r = self
            .msync(self.log as u64, self.log_bytes())
            .and_then(|()| self.copy_power_image());
        if let Err(e) = r {
            // The kills wait for a flush that succeeds.
            lock(&self.dur.kills[0]).extend(kills);
            self.dur.flush_errors.fetch_add(1, Ordering::Relaxed);
            return Err(e);
        }
        self.apply_kills(&kills);
        self.dur.durable_stamp.fetch_max(start, Ordering::AcqRel);
        self.dur.flushes.fetch_add(1, Ordering::Relaxed);
        self.dur
            .flush_us_total
            .fetch_add(t.elapsed().as_micros() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Rule 1 and 2 on or off. On also marks the directory as one that
    /// may lose power and writes the meta segment once (module essay).
    pub(crate) fn set_durable(&self, on: bool) -> Result<()> {
        let marker = self.dir.join(BOOT_MARKER);
        let boot = boot_id();
        if fs::read_to_string(&marker).ok() != boot {
            fs::write(&marker, boot.unwrap_or_default())
                .map_err(|e| io_err("write", &marker, e))?;
            fs::File::open(&marker)
                .and_then(|f| f.sync_all())
                .and_then(|()| fs::File::open(&self.dir))
                .and_then(|d| d.sync_all())
                .map_err(|e| io_err("fsync", &marker, e))?;
        }
        if on {
            self.msync(self.meta as u64, meta_bytes(self.geo.log_segments))?;
            if !self.dur.on.load(Ordering::Acquire) {
                self.dur
                    .durable_stamp
                    .store(ordered_stamp(), Ordering::Release);
                self.dur.on.store(true, Ordering::Release);
            }
            self.flush_to_disk()
        } else {
            self.dur.on.store(false, Ordering::Release);
            self.drain_kills();
            Ok(())
        }
    }

    pub(crate) fn flush_stats(&self) -> FlushStats {
        let d = &self.dur;
        FlushStats {
            flushes: d.flushes.load(Ordering::Relaxed),
            flush_us_total: d.flush_us_total.load(Ordering::Relaxed),
            flush_errors: d.flush_errors.load(Ordering::Relaxed),
            deferred_kills: d.deferred_kills.load(Ordering::Relaxed),
            inline_flushes: d.inline_flushes.load(Ordering::Relaxed),
        }
    }

    /// Start the power-loss test layer's image in `dir` (module essay).
    pub(crate) fn keep_power_image(&self, dir: &Path) -> Result<()> {
        let _g = lock(&self.dur.flush_lock);
        for g in ["a", "b"] {
            let gd = dir.join(g);
            fs::create_dir_all(&gd).map_err(|e| io_err("create", &gd, e))?;
            for seg in [SEG_META, SEG_INDEX, SEG_LOG] {
                let from = spacejmp::segment::seg_path(&self.dir, seg);
                let to = spacejmp::segment::seg_path(&gd, seg);
                fs::copy(&from, &to).map_err(|e| io_err("copy", &to, e))?;
            }
        }
        write_current(dir, "a")?;
        let log_file = spacejmp::segment::seg_path(&self.dir, SEG_LOG);
        let file_bytes = fs::metadata(&log_file)
            .map_err(|e| io_err("stat", &log_file, e))?
            .len();
        let n = self.geo.log_segments as usize;
        *lock(&self.dur.image) = Some(PowerImage {
            dir: dir.to_path_buf(),
            current_b: false,
            log_file_offset: file_bytes.saturating_sub(self.log_bytes()),
            last_in_use: self.segments_in_use(),
            stale: [vec![false; n], vec![false; n]],
        });
        Ok(())
    }

    fn segments_in_use(&self) -> Vec<bool> {
        (0..self.geo.log_segments as usize)
            .map(|s| self.seg(s).state.load(Ordering::Acquire) & 0xFF != SEG_FREE)
            .collect()
    }

    /// After a flush's `msync`: bring the other generation of the image
    /// up to date and name it current. Only segments in use at this flush
    /// or the one before can have changed since (nothing writes a FREE
    /// segment, and a segment is freed only after a flush that began after
    /// its retirement, so it is seen RETIRED by one), so only those are
    /// copied, whole, from the mapping.
    fn copy_power_image(&self) -> Result<()> {
        let mut img = lock(&self.dur.image);
        let Some(img) = img.as_mut() else {
            return Ok(());
        };
        let now = self.segments_in_use();
        let g = usize::from(!img.current_b);
        for (s, &in_use) in now.iter().enumerate() {
            let changed = in_use || img.last_in_use[s];
            img.stale[0][s] |= changed;
            img.stale[1][s] |= changed;
        }
        img.last_in_use = now;
        let next = if g == 1 { "b" } else { "a" };
        let to = spacejmp::segment::seg_path(&img.dir.join(next), SEG_LOG);
        let f = fs::OpenOptions::new()
            .write(true)
            .open(&to)
            .map_err(|e| io_err("open", &to, e))?;
        let seg = self.geo.seg_bytes;
        for s in 0..img.stale[g].len() {
            if !std::mem::take(&mut img.stale[g][s]) {
                continue;
            }
            let mut done = 0u64;
            while done < seg {
                let off = s as u64 * seg + done;
                // SAFETY: `off..s*seg+seg` lies inside the log mapping, which
                // lives as long as `self`; the kernel copies the bytes (no
                // Rust reference to them is formed, so racing appends and
                // state-word stores give a fuzzy copy, as a real flush
                // writes, and no data race in Rust's sense).
                let n = unsafe {
                    libc::pwrite(
                        f.as_raw_fd(),
                        self.log.add(off as usize).cast::<libc::c_void>(),
                        (seg - done) as usize,
                        (img.log_file_offset + off) as libc::off_t,
                    )
                };
                if n <= 0 {
                    return Err(io_err("write", &to, std::io::Error::last_os_error()));
                }
                done += n as u64;
            }
        }
        write_current(&img.dir, next)?;
        img.current_b = g == 1;
        Ok(())
    }
}

/// The file naming the boot during which the store was last used by a
/// process that manages durability ([`SharedStore::set_durable`]).
pub(crate) const BOOT_MARKER: &str = "boot_id";

/// `statfs` magic of tmpfs.
const TMPFS_MAGIC: i64 = 0x0102_1994;

/// This boot's id (`/proc/sys/kernel/random/boot_id`).
fn boot_id() -> Option<String> {
    fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()
}

/// Might the store in `dir` have lost power since it was last attached
/// (module essay)? Not if its boot marker names this boot: the machine
/// has not restarted, so every page written is still in the page cache
/// and only processes died. Otherwise yes if it was managed for
/// durability (a boot marker exists, so it had been flushed) or lives on
/// a file system that survives a reboot.
pub(crate) fn may_lose_power(dir: &Path) -> bool {
    if let Ok(b) = fs::read_to_string(dir.join(BOOT_MARKER)) {
        return Some(b) != boot_id();
    }
    let Ok(c) = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(dir.as_os_str()))
    else {
        return true;
    };
    // SAFETY: statfs is plain old data; zeroed is a valid initial value.
    let mut sf: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is NUL-terminated and `sf` is a valid out-pointer.
    if unsafe { libc::statfs(c.as_ptr(), &mut sf) } != 0 {
        return true;
    }
    sf.f_type as i64 != TMPFS_MAGIC
}

/// The power-loss test layer's cut (module essay), for a store no live
/// process has attached (its processes were killed): the store's files in
/// `store_dir` become the last complete generation of the image in
/// `image_dir` ([`SharedStore::keep_power_image`]), except the 4 KiB pages
/// that differ from it for which `keep_live_page()` answers true (the
/// kernel may have written any dirty page back before the cut); and the
/// boot marker names an earlier boot, as after a reboot. Returns the
/// number of live pages kept.
pub fn apply_power_cut(
    store_dir: &Path,
    image_dir: &Path,
    mut keep_live_page: impl FnMut() -> bool,
) -> Result<usize> {
    let cur = image_dir.join("current");
    let gen = fs::read_to_string(&cur).map_err(|e| io_err("read", &cur, e))?;
    let marker = store_dir.join(BOOT_MARKER);
    fs::write(&marker, "an earlier boot").map_err(|e| io_err("write", &marker, e))?;
    let mut kept = 0;
    for seg in [SEG_META, SEG_INDEX, SEG_LOG] {
        let from = spacejmp::segment::seg_path(&image_dir.join(gen.trim()), seg);
        let to = spacejmp::segment::seg_path(store_dir, seg);
        let mut durable = fs::read(&from).map_err(|e| io_err("read", &from, e))?;
        let live = fs::read(&to).map_err(|e| io_err("read", &to, e))?;
        for (d, l) in durable.chunks_mut(4096).zip(live.chunks(4096)) {
            if d != l && keep_live_page() {
                d.copy_from_slice(l);
                kept += 1;
            }
        }
        fs::write(&to, durable).map_err(|e| io_err("write", &to, e))?;
    }
    Ok(kept)
}

/// Name the complete generation, atomically (write, then rename).
fn write_current(dir: &Path, gen: &str) -> Result<()> {
    let tmp = dir.join("current.tmp");
    fs::write(&tmp, gen).map_err(|e| io_err("write", &tmp, e))?;
    let cur = dir.join("current");
    fs::rename(&tmp, &cur).map_err(|e| io_err("rename", &cur, e))
}
