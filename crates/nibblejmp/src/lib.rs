//! # nibblejmp — Nibble inside SpaceJMP segments
//!
//! The dissertation's two halves joined (§10.4, §12.1.3; SpaceJMP §5.3,
//! "RedisJMP"): the whole key-value store — log, index, live-bytes table,
//! epoch table, metadata — lives in three SpaceJMP segments mapped at the
//! same fixed address in every process. Any process attaches the store by
//! directory and runs `put` / `get` / `delete` on it directly, at memory
//! speed, concurrently with the others: no server, no socket, and (unlike
//! RedisJMP, which takes a segment-wide write lock) no global lock. A
//! process can die at any instruction without making the store unusable,
//! and a restarted server finds its data where it left it.
//!
//! ## Why not `nibble::Store` in a segment
//!
//! `nibble::Store` is process-private: `Arc`s, `Vec`s, parking_lot mutexes
//! and condvars, a buddy allocator with heap state, per-process compaction
//! threads. None of that may be inside a shared segment. This crate keeps
//! Nibble's *design* (§4.2–4.5) and its object header
//! (`nibble::object::Header` in its fixed 24-byte wide layout, plus an 8-byte state word in
//! front), key hash (`nibble::hash_key`) and version clock
//! (`nibble::object::next_version`), and re-places the rest:
//!
//! | Nibble (`nibble` crate) | here (shared) | why |
//! |---|---|---|
//! | buddy-allocated 64 KiB blocks, segment = block list | log segment = a fixed run of 64 KiB blocks in the log segment file; allocation = CAS on the segment table's state word | no allocator heap state to corrupt; a segment claimed by a process that dies before linking it is found by state (OPEN, no head names it) |
//! | `index::bucket::Bucket` seqlock, `lock()` waits forever | same 128-byte layout (version word + 15 entries of 16-bit tag / 48-bit location); the version word is `seq << 8 \| holder slot + 1` | nibble's `lock` cannot time out and does not record who holds it, so a lock held by a dead process could never be broken; readers here need no validation (below) |
//! | `epoch` crate: per-thread slots, TLS destructors | 252 slots in the meta segment, claimed per process (pid + start time), up to 4 per process, one thread per slot at a time | TLS destructors would touch unmapped memory after `close`; a dead process's slots must be recognisable |
//! | per-node compaction workers | one compactor in one process at a time, under a lease with takeover | two processes compacting the same segment would duplicate objects |
//! | index grows in place | fixed capacity at creation (6.2 % of capacity) | growth would need a cross-process resize protocol with a breakable whole-table lock; left for later |
//!
//! ## The object life cycle (every crash guarantee follows from it)
//!
//! ```text
//!  put(k, v):  pin ─ lock head ─ append [state=MAGIC, hdr, k, v] ─ head.off += n ─ unlock head
//!              intent{PUT, b0, b1, new} ─ lock b0, b1 (lower first) ─ find old, intent.old = old
//!              (a) entry := tag|new   ← linearization point
//!              (b) new.state |= COMMITTED      (c) old.state |= DEAD ─ unlock ─ unpin
//!  delete(k):  intent{DEL} ─ lock ─ intent.old ─ (a) entry := 0 ─ (c) old |= DEAD ─ unlock
//!  get(k):     pin ─ read b0, b1 entries (one atomic word each) ─ compare key ─ copy ─ unpin
//!  compaction: intent{MOVE, old} ─ lock ─ still indexed? ─ copy to dest, intent.new
//!              (a) entry := copy  (b) copy |= COMMITTED  (c) old |= DEAD ─ unlock
//! ```
//!
//! * An object is part of the store's contents **iff it is COMMITTED and
//!   not DEAD**; the index names exactly those objects whenever no bucket
//!   is locked. So the log alone determines the contents: recovery can
//!   rebuild the index by scanning it (`recovery`), newest version first
//!   as a second line of defence.
//! * Readers take no lock and never wait. An entry is one 8-byte word, the
//!   object it names is immutable (key, value and lengths; only the state
//!   word and, under the bucket locks, the expiry word change, each by one
//!   atomic store), and the segment holding it is not reused while the reader is
//!   pinned in the epoch table. A reader that sees the new entry linearizes
//!   after (a), one that sees the old entry before it.
//! * **Breakable locks.** Every lock word names its holder's epoch slot;
//!   every slot names its process by pid and start time. A writer that
//!   waits on a bucket checks the holder every 512 spins: if the holder's
//!   process is dead, it steals the lock with a compare-and-swap on the
//!   exact word it saw (the sequence number in the word rules out ABA),
//!   reads the dead holder's *intent* from its slot, and finishes or rolls
//!   back the update: if the entry already names `new`, commit `new` and
//!   kill `old` (roll forward); otherwise kill `new` (roll back); for a
//!   delete, kill `old` iff its entry is gone. Each step is an idempotent
//!   `fetch_or`, and the deciding fact cannot change while any bucket of
//!   the key is held, so racing repairers agree. Head locks are taken over
//!   the same way; the taker closes any segment the dead holder claimed
//!   but had not linked, and extends `used` over completed appends.
//!   A wait behind a *live* holder ends with `Busy` after `lock_wait`
//!   (5 s): writers never spin forever; readers never wait at all.
//! * **What a server needs** (`put_with`, `delete_if`, `set_expiry`,
//!   `scan`; nibble's own `PutOptions`, `Condition`, `Expiry`, `ItemMeta`).
//!   A put's condition (absent, present, version) is decided under the
//!   bucket locks, between "find old" and (a); a failed condition kills the
//!   appended object and unlocks, as a put that finds the index full does.
//!   The version (`max(TSC/1024, old + 1)`) and a kept expiry are decided
//!   there too and written into the new object's header before (a), while
//!   nobody can read it. An expiry change (`set_expiry`) is one atomic
//!   store, under the bucket locks, of the header word that holds the
//!   expiry (its low 16 bits, the top of the version, unchanged): no copy,
//!   no space needed, the version kept; readers load header words
//!   atomically, so they see the old expiry or the new one. An expired
//!   object is invisible at once to every read and condition; compaction
//!   removes it (a delete with a DEL intent) instead of moving it, and a
//!   segment whose earliest expiry (`min_expiry_ms`) has passed is a
//!   victim however live it looks. `scan`'s cursor is a bucket number: an
//!   entry never changes bucket while the store is attached, so a key
//!   present for a whole walk is returned exactly once.
//! * **Epochs** (§4.5): an operation stores the TSC in its slot, a
//!   reclaimer (after a SeqCst fence) frees a retired segment only when
//!   every non-zero slot is past the segment's retirement stamp; a closed
//!   segment becomes a compaction candidate only when every slot is past
//!   its close stamp (so no append into it is still unpublished). A slot
//!   whose process is dead is reclaimed (its intent resolved, its locks
//!   released) instead of holding reclamation back forever.
//! * **Compaction** (`compaction`): one process holds the lease (its id in
//!   the meta segment); others take it when the holder is dead. Cost-benefit
//!   victim choice as in Nibble.
//! * **Space**: capacity is fixed at creation and covers meta + index +
//!   log. Clients may not take the last 3 % of segments (at least 2):
//!   compaction's reserve. A put that finds no segment reclaims retired
//!   segments, compacts inline if it can get the lease, and otherwise
//!   waits for the lease holder, at most `oom_wait` (200 ms) before
//!   `OutOfMemory`. Reads and deletes keep working; after deletes,
//!   compaction frees segments and puts succeed again.
//!
//! ## Crash guarantees, per operation
//!
//! "Killed" means SIGKILL (or any death) of the process at any instruction;
//! the other processes continue. "Recovery" is what the next attach does
//! when the last process died (or a rebuild is requested); while other
//! processes run, the same repairs happen lazily when someone needs the
//! lock or slot.
//!
//! | killed during | visible to others afterwards | space | what repairs it |
//! |---|---|---|---|
//! | `put`, before the append completes (`head.off` not advanced) | old value | the partial bytes are overwritten by the next append on that head | next locker of the head (takeover) |
//! | `put`, after the append, before (a) | old value | the orphan object is uncommitted; compaction skips it and its segment is reclaimed | intent resolution: rolled back (marked DEAD) |
//! | `put`, after (a), before (b)/(c) | **new value** (it was already visible) | old object marked DEAD by the repair | intent resolution: rolled forward |
//! | `put`, after unlock (acknowledged or not yet returned) | new value | — | nothing needed |
//! | `delete`, before (a) | key still present | — | rolled back |
//! | `delete`, after (a) | key absent | old object DEAD | rolled forward |
//! | `get` | nothing changes | its epoch pin is cleared with the slot | slot reclaim |
//! | compaction move, before (a) | original | the partial copy is uncommitted, skipped | rolled back; lease taken over, victim back to CLOSED |
//! | compaction move, after (a) | the copy (same bytes) | original DEAD | rolled forward |
//! | compaction, between objects | unchanged | victim is CLOSED again after takeover and compacted later | lease takeover |
//! | `set_expiry` | old or new expiry (one atomic store) | — | next locker breaks the bucket lock (no intent) |
//! | segment claim, before the head links it | — | segment closed (empty) and compacted away | head takeover / recovery |
//! | `create`, before the magic is written | attach reports `NotAStore` | files left; `create` cleans up what it can on errors | user removes the directory |
//! | `close` | as after a crash of a process with no operation in flight | — | the clean flag stays 0: next sole attach verifies |
//!
//! In words: **an acknowledged put or delete is never lost**, an
//! unacknowledged one is either fully applied or not at all, a get never
//! returns a torn value, and no death leaves a lock held for more than one
//! liveness check (~512 spins plus a `/proc` read) after someone needs it.
//! The machine crashing is outside these guarantees on tmpfs (the store is
//! gone). On a disk directory, `close` by the last process `msync`s the
//! segments before and after setting the clean flag, so a cleanly closed
//! store survives a reboot. While the store is in use, what survives a
//! power cut is what [`SharedStore::flush_to_disk`] made durable
//! (`store/durability.rs`: with [`SharedStore::set_durable`] on, every
//! write finished before the last completed flush) plus whatever the
//! kernel wrote back; recovery then re-derives the segment table from the
//! log and rebuilds the index, skipping torn objects by their checksums.
//!
//! ## Damaged files (`store/integrity.rs`)
//!
//! Bytes of a stopped store's files can be damaged. Every object carries a
//! CRC-32C of its key, value and immutable header bytes in its state word
//! (no extra byte); reads, scans, compaction and recovery verify it, and a
//! damaged object is never served (an [`Error::Damaged`] for its key,
//! counted and logged), never indexed by a rebuild, and never hides the
//! intact objects after it. A clean shutdown seals the index and meta
//! segment with checksums that the next attach verifies before trusting
//! the clean flag (a mismatch rebuilds from the log). Segment files are
//! size-checked before they are mapped, so a truncated file is an error,
//! not a SIGBUS.
//!
//! ## What is real and what is emulated on Linux
//!
//! Segments are files on tmpfs (default `/dev/shm/nibblejmp-<uid>/<name>`)
//! or a disk directory, mapped `MAP_SHARED|MAP_FIXED` at addresses recorded
//! in the SpaceJMP registry: real. Process death is detected through
//! `/proc/PID/stat` (pid + start time; zombies are dead): real, but polled,
//! not notified. The TSC is the epoch clock on an invariant-TSC machine:
//! real. There is no kernel help: no robust futexes, no page-table switch.
//!
//! ## Modules
//!
//! | module | concern |
//! |---|---|
//! | [`layout`] | the bytes in the three segments; lock words; object format |
//! | [`store`] | attach/create, epoch slots, breakable locks, segments, put/get/delete (one file each under `store/`) |
//! | [`compaction`] | the lease and the cleaner |
//! | [`recovery`] | what an attach after a crash (or a failed shutdown seal) does |
//! | `store/durability.rs` | flushes, what a power cut keeps, the power-loss test image |
//! | [`proc_id`] | pid + start time in one word |
//! | [`testing`] | deterministic crash points for the crash-guarantee tests |
//!
//! ```no_run
//! use nibblejmp::{Options, SharedStore};
//! # fn main() -> nibblejmp::Result<()> {
//! let dir = nibblejmp::default_dir("demo");
//! let s = SharedStore::create(&dir, 64 << 20, &Options::default())?;
//! s.put(b"hello", b"world")?;
//! s.close()?;
//! // any other process, any time later:
//! let s = SharedStore::attach(&dir, &Options::default())?;
//! assert_eq!(s.get(b"hello")?.as_deref(), Some(&b"world"[..]));
//! # Ok(()) }
//! ```

#![deny(clippy::undocumented_unsafe_blocks, unsafe_op_in_unsafe_fn)]

pub mod compaction;
pub mod error;
pub mod layout;
pub mod proc_id;
pub mod recovery;
pub mod store;
pub mod testing;

pub use error::{Error, Result};
/// The write and metadata types are `nibble`'s own, so code written for
/// `nibble::Store` (the server) drives a shared store the same way.
pub use nibble::{Condition, Expiry, ItemMeta, PutOptions};
pub use recovery::RecoveryReport;
pub use store::{default_dir, CheckpointStats, FlushStats, Geometry, Options, SharedStore, Stats};
