//! Fuzzy index checkpoints: a power-cut restart that reads a fraction of
//! the log (issue 25's last target; Garnet's fuzzy checkpoints of its hash
//! index, with the log as the truth, in the manner of ARIES's fuzzy
//! checkpoints: the checkpoint is taken while writers run, and what it
//! misses is redone from the log written since it began).
//!
//! Without a checkpoint a power-cut restart walks the whole written log
//! (`crate::recovery`), because the index and the segment table are never
//! flushed. A checkpoint bounds that walk to the segments written since it
//! began. It is, every `interval` (`SharedStore::set_checkpoint_interval`;
//! the server's `--checkpoint-interval`), and sooner once the segments
//! opened since the last one hold an eighth of the log (so the walk after
//! a power cut reads at most about that much, however fast the writes),
//! on its own thread:
//!
//! 1. **Epoch.** The checkpoint epoch `E` is the process's epoch counter
//!    plus one. Every segment opened from then on is *stamped* with the
//!    counter: its first object is a stamp object (an empty key, the epoch
//!    as its 8-byte value, COMMITTED | DEAD so every live-object walk
//!    skips it, marked by a capacity slack no user object has:
//!    `layout::STAMP_SLACK_BYTES`), durable with the segment's bytes. The
//!    epoch is read after the segment is claimed (a SeqCst fence between),
//!    so a segment claimed before the counter moved is OPEN in step 2.
//! 2. **Quiesce and snapshot.** Wait until every operation that began
//!    before `E` has ended (the epoch table: no slot's start stamp is older
//!    than `E`'s), then copy the segment table (state, used, live bytes,
//!    earliest expiry), marking for recovery's walk every segment OPEN
//!    now or CLOSED since the quiesce began (its close stamp is later):
//!    an operation begun after that may have appended to it and store its
//!    entry after its bucket is copied. A segment closed earlier holds only
//!    objects of operations that have ended, so the copy names them.
//! 3. **Copy the index**, bucket by bucket, each under its bucket lock
//!    (held for 15 header reads): for every entry its word, the key's full
//!    hash and the object's version. The records are sorted by entry word
//!    (recovery looks them up by it, within the run of its hash tag).
//! 4. **Flush** the log twice (`flush_to_disk`): every object a record
//!    names was written before its bucket was copied, so it is durable
//!    after the first; the kills the first applies (of copies replaced or
//!    deleted before the snapshot, rule 1 of `durability.rs`) are durable
//!    after the second, so no copy the checkpoint does not name looks live
//!    in a segment recovery walks.
//! 5. **Write** the file `checkpoint.tmp` (header, table, records, CRC-32C
//!    of all of it), fsync it, rename it over `checkpoint`, fsync the
//!    directory. A cut before the rename leaves the previous checkpoint;
//!    after it, this one. Only then is `E` the *completed* epoch.
//!
//! **Recovery** after a power cut with a valid checkpoint
//! (`crate::recovery::ckpt`): read the stamps (one small read per
//! segment); walk, with checksums, only the segments OPEN in the snapshot
//! or stamped at or after `E` (every object written after the snapshot is
//! in one: appends go only to open segments); take every other segment's
//! table entry from the checkpoint (its bytes have not changed since, but
//! for DEAD bits and expiry words) and load the records that name such
//! segments; index what the walks find, newest version winning, a walked
//! copy winning a tie (compaction's moves keep the version); then apply
//! the walked tombstones.
//!
//! **Deletes.** A delete after the snapshot only sets the DEAD bit of an
//! object in a segment recovery does not walk, while the checkpoint still
//! names it. So while checkpoints are on a delete also appends a
//! *tombstone* (the deleted key, the deleted object's version, the epoch;
//! `layout::TOMBSTONE_SLACK_BYTES`), appended before the key's buckets are
//! locked and made to count (COMMITTED | DEAD, version and epoch filled
//! in) under them; and the deleted object's kill waits for the next flush,
//! as a replaced object's does (`durability.rs` rule 1), so a cut that
//! keeps the kill keeps the tombstone. Recovery (this one and the full
//! pass) removes a key whose winning copy's version is at or below a
//! tombstone's. Versions must then grow across restarts (they are TSC
//! ticks, which a reboot restarts): a put takes its version above a
//! *version floor*, which recovery sets to the largest version it saw
//! (the checkpoint's bound, every walked object and tombstone), a clean
//! shutdown writes to `version_floor`, and every tombstone raises.
//! Compaction keeps a tombstone (copies it with the live objects) while
//! its epoch is at or after the completed checkpoint's: the epoch is read
//! under the bucket locks, so a delete that removed an entry after the
//! checkpoint copied its bucket carries that checkpoint's epoch or a
//! later one. A tombstone only counts in a segment walked without a
//! resynchronization before it (a reused segment's stale tail may hold
//! old ones). A delete in a full log (no room for its tombstone after a
//! few rounds of compaction; deletes are how room is made, so it must
//! not wait longer) goes without one: it
//! removes the checkpoint file first (durably), and a checkpoint under way
//! then is not installed.
//!
//! Compaction's removal of an expired object leaves no tombstone: after a
//! checkpoint recovery an entry may name such a DEAD (expired, so
//! invisible) object, and compaction, which otherwise skips DEAD objects,
//! removes the entry that names one before retiring its segment.
//!
//! Any doubt (no file, a short or damaged one, another geometry, a
//! record naming a segment the snapshot had free, a bucket that would
//! overflow) falls back to the full pass. Turning checkpoints off removes
//! the file (without tombstones it could bring deleted keys back).
//!
//! Costs: a checkpoint reads every indexed object's header and key once
//! (on its own thread; each bucket locked for 15 of them) and writes 24
//! bytes per key; a delete appends a tombstone of its key's length plus
//! 40 bytes; a segment starts with a 56-byte stamp. Under
//! `appendfsync no` the server takes no checkpoints (they rely on the
//! durability rules). Durability and checkpoints are per process, like
//! the kills they depend on: a delete by another process attached to the
//! same store writes no tombstone, so a restart from a checkpoint after a
//! power cut may bring such a key back (the server is the only writer of
//! a store it serves in the deployments this targets).

use std::fs;
use std::io::Write;

use super::attach::io_err;
use super::*;

/// The checkpoint file in the store directory.
pub(crate) const CHECKPOINT_FILE: &str = "checkpoint";
/// Where a checkpoint is written before it is renamed over the last one.
const CHECKPOINT_TMP_FILE: &str = "checkpoint.tmp";
/// Written by a clean shutdown with checkpoints on: the version floor.
const VERSION_FLOOR_FILE: &str = "version_floor";
/// `"NIBCKPT1"`.
const CHECKPOINT_MAGIC: u64 = u64::from_le_bytes(*b"NIBCKPT1");
/// Header words: magic, epoch, version bound, seg_bytes, log_segments,
/// index_buckets, records, reserved.
const HEADER_WORDS: usize = 8;
/// Words per segment: state, used, live, earliest expiry.
pub(crate) const SEG_WORDS: usize = 4;
/// Words per record: entry, key hash, version (bit 63: in the key's
/// second bucket).
pub(crate) const RECORD_WORDS: usize = 3;
/// Record flag: the entry lies in the key's second bucket.
pub(crate) const SECOND_BUCKET_BIT: u64 = 1 << 63;
/// Bit of a segment's state word in the file: recovery walks the segment
/// (open at the snapshot, or closed after the checkpoint began).
pub(crate) const SNAPSHOT_WALK_BIT: u64 = 1 << 32;
/// Appends a tombstone tries, making space between them, before its
/// delete goes without one.
const TOMBSTONE_APPEND_TRIES: usize = 4;
/// Hash tags (the top 16 bits of an entry word).
const TAGS: usize = 1 << (64 - LOC_BITS);
/// Buckets copied per pin of the epoch table.
const BUCKETS_PER_PIN: usize = 256;
/// Longest wait for the operations begun before a checkpoint's epoch.
const QUIESCE_TIMEOUT_MS: u64 = 10_000;
/// The checkpoint thread checks for shutdown this often.
const THREAD_NAP_MS: u64 = 50;
/// The checkpoint thread also starts a checkpoint, before its interval is
/// up, once the segments opened since the last one began add up to this
/// fraction (1/N) of the log: a restart after a power cut walks what was
/// written since the last checkpoint, so this bounds that walk whatever
/// the write rate (about 512 MiB of a 4 GiB store).
const CHECKPOINT_WRITTEN_LOG_DIVISOR: u64 = 8;

/// Which marker object an object is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Marker {
    Stamp,
    Tombstone,
}

/// Checkpoint counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CheckpointStats {
    /// Completed checkpoints.
    pub checkpoints: u64,
    /// Failed checkpoint attempts.
    pub errors: u64,
    /// Epoch of the last completed checkpoint (0: none).
    pub last_epoch: u64,
    /// Duration of the last completed checkpoint, ms.
    pub last_ms: u64,
    /// Size of its file, bytes.
    pub last_bytes: u64,
    /// Keys it recorded.
    pub last_keys: u64,
    /// Tombstones written by deletes.
    pub tombstones: u64,
    /// Tombstones compaction copied (still needed).
    pub tombstones_kept: u64,
}

/// The process's checkpoint state (see the module essay).
pub(crate) struct Ckpt {
    /// Stamps and tombstones are written.
    on: AtomicBool,
    /// The epoch counter.
    epoch: AtomicU64,
    /// Epoch of the last completed checkpoint.
    completed: AtomicU64,
    /// Puts take versions above this.
    version_floor: AtomicU64,
    /// After a checkpoint recovery: entries may name DEAD objects.
    pub(crate) stale_dead: AtomicBool,
    /// Period of the checkpoint thread, ms (0: no thread).
    interval_ms: AtomicU64,
    /// Segments stamped since the checkpoint thread last started one.
    stamped_since: AtomicU64,
    /// The thread also starts a checkpoint once `stamped_since` reaches
    /// the log's share ([`CHECKPOINT_WRITTEN_LOG_DIVISOR`]).
    on_log_written: AtomicBool,
    /// One checkpoint at a time.
    write_lock: Mutex<()>,
    /// Deletes that could write no tombstone (a full log).
    untombed: AtomicU64,
    /// Held to install a checkpoint file, or to remove it for such a
    /// delete.
    install_lock: Mutex<()>,
    thread: Mutex<Option<JoinHandle<()>>>,
    checkpoints: AtomicU64,
    errors: AtomicU64,
    last_ms: AtomicU64,
    last_bytes: AtomicU64,
    last_keys: AtomicU64,
    tombstones: AtomicU64,
    pub(crate) tombstones_kept: AtomicU64,
}

impl Ckpt {
    pub(crate) fn new() -> Ckpt {
        Ckpt {
            on: AtomicBool::new(false),
            epoch: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            version_floor: AtomicU64::new(0),
            stale_dead: AtomicBool::new(false),
            interval_ms: AtomicU64::new(0),
            stamped_since: AtomicU64::new(0),
            on_log_written: AtomicBool::new(true),
            write_lock: Mutex::new(()),
            untombed: AtomicU64::new(0),
            install_lock: Mutex::new(()),
            thread: Mutex::new(None),
            checkpoints: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            last_ms: AtomicU64::new(0),
            last_bytes: AtomicU64::new(0),
            last_keys: AtomicU64::new(0),
            tombstones: AtomicU64::new(0),
            tombstones_kept: AtomicU64::new(0),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A checkpoint read back from its file.
pub(crate) struct Loaded {
    pub(crate) epoch: u64,
    /// Every version of an object the checkpoint could name is at most
    /// this.
    pub(crate) bound: u64,
    pub(crate) segs: Vec<[u64; SEG_WORDS]>,
    /// Sorted by entry word.
    pub(crate) recs: Vec<[u64; RECORD_WORDS]>,
    /// `tag_start[t]..tag_start[t + 1]`: the records whose entry has hash
    /// tag `t` (the entry word's top 16 bits), so a lookup searches a few
    /// dozen records, not all of them.
    tag_start: Vec<u32>,
}

impl Loaded {
    /// The record of the entry word `entry`.
    pub(crate) fn record(&self, entry: u64) -> Option<&[u64; RECORD_WORDS]> {
        let t = (entry >> LOC_BITS) as usize;
        let (lo, hi) = (self.tag_start[t] as usize, self.tag_start[t + 1] as usize);
        let run = &self.recs[lo..hi];
        run.binary_search_by_key(&entry, |r| r[0])
            .ok()
            .map(|i| &run[i])
    }
}

fn words_to_bytes(out: &mut Vec<u8>, words: &[u64]) {
    for w in words {
        out.extend_from_slice(&w.to_le_bytes());
    }
}

impl Inner {
    /// Stamps and tombstones are written (checkpoints are on).
    #[inline]
    pub(crate) fn ck_on(&self) -> bool {
        self.ck.on.load(Ordering::Acquire)
    }

    /// The version a new key's put starts from (above the floor).
    #[inline]
    pub(crate) fn new_version(&self) -> u64 {
        nibble::object::next_version(self.ck.version_floor.load(Ordering::Relaxed))
    }

    /// Raise the version floor to `v`.
    pub(crate) fn raise_version_floor(&self, v: u64) {
        self.ck.version_floor.fetch_max(v, Ordering::AcqRel);
    }

    /// The epoch a stamp or tombstone written now carries.
    fn current_epoch(&self) -> u64 {
        fence(Ordering::SeqCst);
        self.ck.epoch.load(Ordering::SeqCst)
    }

    /// Whether `h` is a stamp or a tombstone, and its epoch (the caller
    /// checks its state bits and checksum).
    pub(crate) fn marker(&self, h: &Obj) -> Option<(Marker, u64)> {
        if h.value_len as usize != MARKER_VALUE_BYTES {
            return None;
        }
        let kind = match h.value_cap - h.value_len {
            TOMBSTONE_SLACK_BYTES => Marker::Tombstone,
            STAMP_SLACK_BYTES if h.key_len == 0 => Marker::Stamp,
            _ => return None,
        };
        let mut b = [0u8; MARKER_VALUE_BYTES];
        b.copy_from_slice(self.obj_value(h));
        Some((kind, u64::from_le_bytes(b)))
    }

    /// A marker's header: `key_len` key bytes, the epoch as value.
    fn marker_header(key_len: usize, slack: u32, version: u64) -> Header {
        Header {
            key_len: key_len as u32,
            value_len: MARKER_VALUE_BYTES as u32,
            value_cap: MARKER_VALUE_BYTES as u32 + slack,
            flags: 0,
            version,
            expiry_ms: 0,
            expiry_slot: true,
            flags_slot: true,
            slack_slot: true,
            pinned: false,
        }
    }

    /// Segment `s` was just claimed (nobody else writes it): with
    /// checkpoints on, write its stamp at offset 0 and count it in `used`.
    pub(crate) fn write_stamp(&self, s: usize) {
        if !self.ck_on() {
            return;
        }
        let value = self.current_epoch().to_le_bytes();
        let hdr = Self::marker_header(0, STAMP_SLACK_BYTES, 0);
        let Some(loc) = self.valid_loc(s as u64 * self.geo.seg_bytes + 1) else {
            return;
        };
        // SAFETY: the segment was claimed by the caller a moment ago and
        // is not linked anywhere yet: nobody else reads or writes it, and
        // a stamp (a few dozen bytes) fits any segment (64 KiB at least).
        unsafe { self.write_object(loc, b"", &value, &hdr, obj_crc_kv(b"", &value)) };
        self.mark(loc.get(), OBJ_COMMITTED | OBJ_DEAD);
        self.ck.stamped_since.fetch_add(1, Ordering::Relaxed);
        self.seg(s).used.store(
            object_bytes(0, MARKER_VALUE_BYTES + STAMP_SLACK_BYTES as usize),
            Ordering::Release,
        );
    }

    /// With checkpoints on: append `key`'s tombstone (uncommitted; see
    /// [`Inner::finish_tombstone`]) before a delete locks its buckets.
    pub(crate) fn append_tombstone(&self, op: &Op<'_>, key: &[u8]) -> Result<Option<ValidLoc>> {
        if !self.ck_on() {
            return Ok(None);
        }
        let value = self.current_epoch().to_le_bytes();
        let hdr = Self::marker_header(key.len(), TOMBSTONE_SLACK_BYTES, 0);
        let kv = obj_crc_kv(key, &value);
        for _ in 0..TOMBSTONE_APPEND_TRIES {
            if let Append::Done(loc) = self.append(op, key, &value, &hdr, kv)? {
                return Ok(Some(loc));
            }
            // As a put does (unpinned, so retired segments can be
            // reused), but without waiting for progress.
            op.unpin();
            self.make_space();
            op.repin();
        }
        // A log still full: the delete must work anyway (it is how room
        // is made), so it goes without a tombstone, and the checkpoint,
        // which could bring the key back, is removed first.
        self.untombed_delete()?;
        Ok(None)
    }

    /// A delete without a tombstone: remove the checkpoint file (durably)
    /// and keep a checkpoint under way from being installed.
    fn untombed_delete(&self) -> Result<()> {
        let _g = lock(&self.ck.install_lock);
        self.ck.untombed.fetch_add(1, Ordering::SeqCst);
        let p = self.dir.join(CHECKPOINT_FILE);
        match fs::remove_file(&p) {
            Ok(()) => sync_dir(&self.dir),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_err("remove", &p, e)),
        }
    }

    /// Under the key's bucket locks: make the tombstone at `t` count for
    /// the deleted object's `version` (or void it: `None`). Its epoch is
    /// read here, under the locks: a checkpoint that copied these buckets
    /// before this delete removed the entry began before this read, so the
    /// tombstone carries its epoch or a later one and compaction keeps it
    /// for as long as that checkpoint is the completed one.
    pub(crate) fn finish_tombstone(&self, t: Option<ValidLoc>, key: &[u8], version: Option<u64>) {
        let Some(t) = t else {
            return;
        };
        let Some(v) = version else {
            self.mark(t.get(), OBJ_DEAD);
            return;
        };
        let value = self.current_epoch().to_le_bytes();
        // SAFETY: `t` is this operation's own tombstone of `key`
        // (`object_bytes(key.len(), 8 + slack)` bytes appended by
        // `append_tombstone`), still uncommitted: no reader uses its bytes
        // (walks skip uncommitted objects, and its segment cannot be
        // compacted while this operation is pinned). Its value lies after
        // the prefix and the key, inside the object.
        unsafe {
            let p = self.obj(t).add(OBJ_PREFIX_BYTES as usize + key.len());
            std::ptr::copy_nonoverlapping(value.as_ptr(), p, MARKER_VALUE_BYTES);
        }
        let hdr = Self::marker_header(key.len(), TOMBSTONE_SLACK_BYTES, v);
        self.rewrite_header(t, &hdr, obj_crc_kv(key, &value));
        self.raise_version_floor(v);
        self.mark(t.get(), OBJ_COMMITTED | OBJ_DEAD);
        self.ck.tombstones.fetch_add(1, Ordering::Relaxed);
    }

    /// Tombstones written in this epoch or later are still needed.
    pub(crate) fn tombstone_needed(&self, epoch: u64) -> bool {
        epoch >= self.ck.completed.load(Ordering::Acquire)
    }

    pub(crate) fn checkpoint_stats(&self) -> CheckpointStats {
        let c = &self.ck;
        CheckpointStats {
            checkpoints: c.checkpoints.load(Ordering::Relaxed),
            errors: c.errors.load(Ordering::Relaxed),
            last_epoch: c.completed.load(Ordering::Relaxed),
            last_ms: c.last_ms.load(Ordering::Relaxed),
            last_bytes: c.last_bytes.load(Ordering::Relaxed),
            last_keys: c.last_keys.load(Ordering::Relaxed),
            tombstones: c.tombstones.load(Ordering::Relaxed),
            tombstones_kept: c.tombstones_kept.load(Ordering::Relaxed),
        }
    }

    /// At attach: the epoch counter, the completed epoch and the version
    /// floor from the checkpoint file's header and `version_floor` (both
    /// absent: zeros).
    pub(crate) fn init_checkpoint_state(&self) {
        let mut floor = fs::read(self.dir.join(VERSION_FLOOR_FILE))
            .ok()
            .and_then(|b| {
                b.get(..8)
                    .map(|w| u64::from_le_bytes(w.try_into().unwrap_or([0; 8])))
            })
            .unwrap_or(0);
        if let Ok(h) = self.read_checkpoint_header() {
            self.ck.epoch.fetch_max(h[1], Ordering::AcqRel);
            self.ck.completed.fetch_max(h[1], Ordering::AcqRel);
            floor = floor.max(h[2]);
        }
        self.raise_version_floor(floor);
    }

    /// After a checkpoint recovery: the loaded checkpoint is the completed
    /// one; the counter starts at or above every stamp seen.
    pub(crate) fn resume_checkpoints(&self, completed: u64, max_stamp: u64) {
        self.ck.completed.store(completed, Ordering::Release);
        self.ck
            .epoch
            .fetch_max(completed.max(max_stamp), Ordering::AcqRel);
        self.ck.stale_dead.store(true, Ordering::Release);
    }

    /// Clean shutdown: keep the version floor for the next boot.
    pub(crate) fn write_version_floor(&self) -> Result<()> {
        if !self.ck_on() && !self.dir.join(CHECKPOINT_FILE).exists() {
            return Ok(());
        }
        let v = self.new_version();
        let p = self.dir.join(VERSION_FLOOR_FILE);
        fs::write(&p, v.to_le_bytes())
            .and_then(|()| fs::File::open(&p)?.sync_all())
            .map_err(|e| io_err("write", &p, e))
    }

    /// Turn stamps and tombstones on (before the first checkpoint) or off
    /// (the checkpoint file is removed: without tombstones it could
    /// resurrect deleted keys).
    pub(crate) fn set_checkpointing(&self, on: bool) -> Result<()> {
        let _g = lock(&self.ck.write_lock);
        if on {
            self.ck.on.store(true, Ordering::Release);
            return Ok(());
        }
        self.ck.on.store(false, Ordering::Release);
        for f in [CHECKPOINT_FILE, CHECKPOINT_TMP_FILE] {
            let p = self.dir.join(f);
            match fs::remove_file(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err("remove", &p, e)),
            }
        }
        sync_dir(&self.dir)
    }

    /// Take a checkpoint now (module essay); returns its epoch.
    pub(crate) fn checkpoint_now(&self) -> Result<u64> {
        let r = self.checkpoint_inner();
        if r.is_err() {
            self.ck.errors.fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    fn checkpoint_inner(&self) -> Result<u64> {
        let _g = lock(&self.ck.write_lock);
        if !self.ck_on() {
            return Err(Error::InvalidArgument("checkpoints are off".into()));
        }
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        let t = Instant::now();
        // 1. The epoch.
        let e = self.ck.epoch.fetch_add(1, Ordering::SeqCst) + 1;
        let untombed = self.ck.untombed.load(Ordering::SeqCst);
        let start = ordered_stamp();
        // 2. Quiesce: every operation begun before `start` has ended.
        let deadline = t + Duration::from_millis(QUIESCE_TIMEOUT_MS);
        while self.min_epoch() <= start {
            if Instant::now() >= deadline {
                return Err(Error::Busy(
                    "checkpoint: an operation did not end in time".into(),
                ));
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        fence(Ordering::SeqCst);
        let n_segs = self.geo.log_segments as usize;
        let mut segs = Vec::with_capacity(n_segs);
        for s in 0..n_segs {
            let x = self.seg(s);
            let st = x.state.load(Ordering::Acquire);
            // Appends may still land in a segment open at the snapshot,
            // or closed since `start` (by an operation begun after it).
            let walk = match st & 0xFF {
                SEG_OPEN => true,
                SEG_CLOSED => x.stamp.load(Ordering::Acquire) >= start,
                _ => false,
            };
            segs.push([
                st | if walk { SNAPSHOT_WALK_BIT } else { 0 },
                x.used.load(Ordering::Acquire),
                x.live.load(Ordering::Relaxed),
                x.min_expiry_ms.load(Ordering::Relaxed),
            ]);
        }
        // 3. The index, bucket by bucket under its lock.
        let n = self.geo.index_buckets as usize;
        let mut recs: Vec<[u64; RECORD_WORDS]> = Vec::with_capacity(self.len() as usize + 1024);
        let mut max_version = 0u64;
        for first in (0..n).step_by(BUCKETS_PER_PIN) {
            let op = self.begin();
            for b in first..(first + BUCKETS_PER_PIN).min(n) {
                if self
                    .bucket(b)
                    .entries
                    .iter()
                    .all(|x| x.load(Ordering::Relaxed) == 0)
                {
                    continue;
                }
                self.set_intent(&op, INTENT_NONE, b, b, 0, 0);
                self.lock_pair(&op, b, b)?;
                for x in &self.bucket(b).entries {
                    let entry = x.load(Ordering::Acquire);
                    if entry == 0 {
                        continue;
                    }
                    let Some(h) = self.obj_header(entry & LOC_MASK) else {
                        continue; // damaged: reads report it; not recorded
                    };
                    let hash = nibble::hash_key(self.obj_key(&h));
                    let (b0, b1, _) = self.buckets_of(hash);
                    let second = if b == b0 {
                        0
                    } else if b == b1 {
                        SECOND_BUCKET_BIT
                    } else {
                        continue; // a damaged key: not recorded
                    };
                    max_version = max_version.max(h.version);
                    recs.push([entry, hash, h.version | second]);
                }
                self.unlock_pair(b, b);
            }
        }
        recs.sort_unstable_by_key(|r| r[0]);
        let bound = self
            .new_version()
            .max(max_version)
            .max(self.ck.version_floor.load(Ordering::Acquire));
        // 4. Everything the records name is durable after this flush; the
        //    kills it then applies (of copies deletes and puts replaced
        //    before the snapshot) are durable after the second.
        self.flush_to_disk()?;
        self.flush_to_disk()?;
        // 5. The file.
        let mut out = Vec::with_capacity(
            (HEADER_WORDS + n_segs * SEG_WORDS + recs.len() * RECORD_WORDS + 1) * 8,
        );
        words_to_bytes(
            &mut out,
            &[
                CHECKPOINT_MAGIC,
                e,
                bound,
                self.geo.seg_bytes,
                self.geo.log_segments,
                self.geo.index_buckets,
                recs.len() as u64,
                0,
            ],
        );
        for sg in &segs {
            words_to_bytes(&mut out, sg);
        }
        for r in &recs {
            words_to_bytes(&mut out, r);
        }
        let crc = u64::from(crc32c::crc32c(&out));
        words_to_bytes(&mut out, &[crc]);
        let tmp = self.dir.join(CHECKPOINT_TMP_FILE);
        let dst = self.dir.join(CHECKPOINT_FILE);
        fs::File::create(&tmp)
            .and_then(|mut f| {
                f.write_all(&out)?;
                f.sync_all()
            })
            .map_err(|e| io_err("write", &tmp, e))?;
        {
            let _g = lock(&self.ck.install_lock);
            if self.ck.untombed.load(Ordering::SeqCst) != untombed {
                let _ = fs::remove_file(&tmp);
                return Err(Error::Busy(
                    "checkpoint: a delete in a full log wrote no tombstone meanwhile".into(),
                ));
            }
            fs::rename(&tmp, &dst).map_err(|e| io_err("rename", &dst, e))?;
            sync_dir(&self.dir)?;
        }
        self.ck.completed.store(e, Ordering::Release);
        let c = &self.ck;
        c.checkpoints.fetch_add(1, Ordering::Relaxed);
        c.last_ms
            .store(t.elapsed().as_millis() as u64, Ordering::Relaxed);
        c.last_bytes.store(out.len() as u64, Ordering::Relaxed);
        c.last_keys.store(recs.len() as u64, Ordering::Relaxed);
        Ok(e)
    }

    /// The checkpoint file's header words, checked for magic and geometry.
    fn read_checkpoint_header(&self) -> std::result::Result<[u64; HEADER_WORDS], String> {
        use std::io::Read;
        let p = self.dir.join(CHECKPOINT_FILE);
        let mut f = fs::File::open(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        let mut b = [0u8; HEADER_WORDS * 8];
        f.read_exact(&mut b)
            .map_err(|e| format!("{}: header: {e}", p.display()))?;
        let h = parse_words::<HEADER_WORDS>(&b);
        self.check_header(&h)?;
        Ok(h)
    }

    fn check_header(&self, h: &[u64; HEADER_WORDS]) -> std::result::Result<(), String> {
        if h[0] != CHECKPOINT_MAGIC {
            return Err("bad magic".into());
        }
        let g = [
            self.geo.seg_bytes,
            self.geo.log_segments,
            self.geo.index_buckets,
        ];
        if h[3..6] != g {
            return Err(format!("geometry {:?} is not the store's {g:?}", &h[3..6]));
        }
        Ok(())
    }

    /// Read and check the whole checkpoint file (recovery).
    pub(crate) fn read_checkpoint(&self) -> std::result::Result<Loaded, String> {
        let p = self.dir.join(CHECKPOINT_FILE);
        let b = fs::read(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        if b.len() < (HEADER_WORDS + 1) * 8 || b.len() % 8 != 0 {
            return Err(format!("{}: {} bytes, too short", p.display(), b.len()));
        }
        let h = parse_words::<HEADER_WORDS>(&b[..HEADER_WORDS * 8]);
        self.check_header(&h)?;
        let n_segs = self.geo.log_segments as usize;
        let n_recs = h[6] as usize;
        let want = n_recs
            .checked_mul(RECORD_WORDS)
            .and_then(|w| w.checked_add(HEADER_WORDS + n_segs * SEG_WORDS + 1))
            .and_then(|w| w.checked_mul(8));
        if want != Some(b.len()) {
            return Err(format!(
                "{}: {} bytes, {n_recs} records need {want:?}",
                p.display(),
                b.len()
            ));
        }
        let body = b.len() - 8;
        let crc = u64::from_le_bytes(b[body..].try_into().unwrap_or([0; 8]));
        if u64::from(crc32c::crc32c(&b[..body])) != crc {
            return Err(format!("{}: checksum mismatch", p.display()));
        }
        let mut off = HEADER_WORDS * 8;
        let mut segs = Vec::with_capacity(n_segs);
        for _ in 0..n_segs {
            segs.push(parse_words::<SEG_WORDS>(&b[off..off + SEG_WORDS * 8]));
            off += SEG_WORDS * 8;
        }
        let mut recs = Vec::with_capacity(n_recs);
        let mut prev = 0u64;
        for _ in 0..n_recs {
            let r = parse_words::<RECORD_WORDS>(&b[off..off + RECORD_WORDS * 8]);
            off += RECORD_WORDS * 8;
            if r[0] <= prev || !self.loc_ok(r[0] & LOC_MASK) {
                return Err(format!(
                    "{}: records out of order or out of range",
                    p.display()
                ));
            }
            prev = r[0];
            recs.push(r);
        }
        if recs.len() >= u32::MAX as usize {
            return Err(format!("{}: too many records", p.display()));
        }
        let mut tag_start = vec![0u32; TAGS + 1];
        for r in &recs {
            tag_start[(r[0] >> LOC_BITS) as usize + 1] += 1;
        }
        for t in 0..TAGS {
            tag_start[t + 1] += tag_start[t];
        }
        Ok(Loaded {
            epoch: h[1],
            bound: h[2],
            segs,
            recs,
            tag_start,
        })
    }

    /// See [`crate::SharedStore::set_checkpoint_on_log_written`].
    pub(crate) fn set_checkpoint_on_log_written(&self, on: bool) {
        self.ck.on_log_written.store(on, Ordering::Relaxed);
    }

    /// Start (or re-time, or with `None` stop) the checkpoint thread.
    pub(crate) fn set_checkpoint_interval(self: &Arc<Self>, every: Option<Duration>) -> Result<()> {
        let ms = every.map_or(0, |d| (d.as_millis() as u64).max(1));
        if ms != 0 {
            self.set_checkpointing(true)?;
        }
        self.ck.interval_ms.store(ms, Ordering::Release);
        let mut th = lock(&self.ck.thread);
        if ms == 0 {
            if let Some(t) = th.take() {
                let _ = t.join();
            }
            return self.set_checkpointing(false);
        }
        if th.as_ref().is_some_and(|t| !t.is_finished()) {
            return Ok(());
        }
        let me = Arc::clone(self);
        *th = Some(
            std::thread::Builder::new()
                .name("nibblejmp-ckpt".into())
                .spawn(move || me.checkpoint_loop())
                .map_err(|e| io_err("spawn a checkpoint thread in", &self.dir, e))?,
        );
        Ok(())
    }

    fn checkpoint_loop(&self) {
        let mut last = Instant::now();
        loop {
            let ms = self.ck.interval_ms.load(Ordering::Acquire);
            if ms == 0 || self.stop.load(Ordering::Acquire) {
                return;
            }
            let due = Duration::from_millis(ms);
            let waited = last.elapsed();
            let written_segments = self.ck.stamped_since.load(Ordering::Relaxed);
            let segment_budget = (self.geo.log_segments / CHECKPOINT_WRITTEN_LOG_DIVISOR).max(1);
            let written_due = self.ck.on_log_written.load(Ordering::Relaxed)
                && written_segments >= segment_budget;
            if waited < due && !written_due {
                std::thread::sleep((due - waited).min(Duration::from_millis(THREAD_NAP_MS)));
                continue;
            }
            last = Instant::now();
            self.ck.stamped_since.store(0, Ordering::Relaxed);
            if let Err(e) = self.checkpoint_now() {
                if !self.stop.load(Ordering::Acquire) {
                    log::error!("checkpoint of {}: {e}", self.dir.display());
                }
            }
        }
    }

    /// Join the checkpoint thread (detach; `stop` is set).
    pub(crate) fn stop_checkpoints(&self) {
        if let Some(t) = lock(&self.ck.thread).take() {
            let _ = t.join();
        }
    }
}

fn parse_words<const N: usize>(b: &[u8]) -> [u64; N] {
    let mut w = [0u64; N];
    for (i, c) in b.chunks_exact(8).take(N).enumerate() {
        w[i] = u64::from_le_bytes(c.try_into().unwrap_or([0; 8]));
    }
    w
}

fn sync_dir(dir: &Path) -> Result<()> {
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_err("fsync", dir, e))
}
