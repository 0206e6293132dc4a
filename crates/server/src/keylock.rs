//! Striped key locks: the server's unit of atomicity above one engine item.
//!
//! The engine makes each single-item operation atomic (a put, a CAS on a
//! version, a delete). Some commands need more: a collection whose
//! elements live in several engine items, a MULTI/EXEC block over several
//! keys, a WATCH that must see every write to its keys. For those the
//! server keeps a fixed table of reader-writer locks, [`KEY_LOCK_STRIPES`]
//! of them, each on its own cache line; a key maps to the stripe of its
//! hash (the engine's own key hash, so the cost is one xxh3 of the key).
//!
//! Dispatch ([`crate::commands::execute`]) takes the stripes of a
//! command's keys before it runs the handler and drops them after the
//! reply is written: exclusive for a command flagged `write`, shared
//! otherwise. Commands on different keys almost never share a stripe, so
//! there is no global lock on the request path: an uncontended command
//! pays one atomic read-modify-write to take its stripe and one to drop
//! it. Several stripes are always taken in ascending stripe order, each
//! once, in the strongest mode any of its keys needs, so two commands
//! (or a command and an EXEC) can never wait on each other in a cycle.
//!
//! A handler must not take a stripe itself while dispatch holds one for
//! it (the locks are not reentrant); it relies on the stripes of the keys
//! the command table names, or asks for its keys through
//! [`crate::commands::Ctx::lock`] when dispatch takes none (commands whose
//! keys move, e.g. with a `numkeys` argument). Inside EXEC that call
//! returns an empty guard, because EXEC then already holds every stripe.
//!
//! Waiting: a short spin, then park. A write holds its stripe for one
//! command's engine work, 1-20 µs (a large-collection HSET reads and
//! writes four items). When many clients write one key, the workers
//! meet on its stripe; `parking_lot` spins well under a microsecond and
//! then parks the thread, and a parked worker serves none of its
//! connections until the futex wake-up *and* a turn on its pinned CPU,
//! which on a loaded machine is milliseconds, not the microseconds the
//! holder needed. So a contended acquisition retries `try_lock` for up to
//! [`SPIN_BEFORE_PARK_NS`] (longer than a command's hold, shorter than a
//! scheduler tick) before it parks. Measured (docs/BENCHMARKS.md,
//! "Collections"): 50 clients writing one hash or list on 2 pinned
//! workers spent about a fifth of a worker's time parked on the stripe;
//! the spin cuts that time by two thirds and lowers the p99 of such runs,
//! at some CPU per request on a loaded machine. A holder that is
//! descheduled still makes waiters park, after one spin; and most of the
//! latency tail of those runs is not the stripe at all but workers
//! waiting for their CPU (the same tail shows on random keys).
//!
//! Contention is recorded: an acquisition whose first `try_lock` fails
//! notes its stripe in a thread-local ([`take_contended`]), on the cold
//! path only. A connection reads it after each batch, and one that keeps
//! meeting another worker on one stripe moves to that stripe's owner
//! worker ([`crate::migrate`]), so a hot key's clients stop contending.
//!
//! Versions, for WATCH. Each stripe carries a counter in its lock's cache
//! line. Dropping a guard that holds a stripe exclusively adds one to it
//! (a plain load and store: the writer owns the line already, so the bump
//! costs no extra atomic read-modify-write and no extra cache miss). So
//! every write made under a stripe, by a RESP command, a memcached
//! command or an EXEC, moves its version, and WATCH is a record of
//! `(stripe, version)` pairs that EXEC compares while it holds the
//! stripes:
//!
//! ```text
//!   client A: WATCH k ── v = version(stripe k) ── MULTI .. EXEC: lock ── version == v ? run : nil
//!   client B:                 SET k: lock(k, excl) ── put ── drop: version += 1
//! ```
//!
//! A version counts writes to the stripe, not to the key, so a write to
//! another key of the same stripe (1 in [`KEY_LOCK_STRIPES`] for two
//! random keys) also aborts a watching EXEC, as does a write command that
//! changed nothing (DEL of a missing key). Both are false positives only:
//! optimistic clients retry. Writers that hold every stripe at once
//! (FLUSHALL, [`KeyLocks::lock_all`]) disarm the drop-time bump and call
//! [`KeyLocks::bump_held`] for the keys they really changed.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_utils::CachePadded;
use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use smallvec::SmallVec;

/// Stripes a guard holds without a heap allocation (nearly every command
/// names one or two keys).
const INLINE_STRIPES: usize = 2;

/// Longest a contended acquisition spins before it parks the thread.
pub const SPIN_BEFORE_PARK_NS: u64 = 50_000;

/// `spin_loop` hints between two `try_lock`s while spinning.
const SPINS_PER_TRY: u32 = 64;

/// Number of lock stripes (a power of two).
pub const KEY_LOCK_STRIPES: usize = 4096;

/// One stripe: its lock and its write version, on one cache line.
struct Stripe {
    lock: RwLock<()>,
    version: AtomicU64,
}

impl Stripe {
    /// The lock of stripe `i`, exclusive: `try_write` for up to
    /// [`SPIN_BEFORE_PARK_NS`], then park. A failed first try is recorded
    /// (see [`take_contended`]).
    #[inline]
    fn write(&self, i: usize) -> RwLockWriteGuard<'_, ()> {
        match self.lock.try_write() {
            Some(g) => g,
            None => {
                note_contended(i);
                spin_then(|| self.lock.try_write(), || self.lock.write())
            }
        }
    }

    /// The lock of stripe `i`, shared, the same way.
    #[inline]
    fn read(&self, i: usize) -> RwLockReadGuard<'_, ()> {
        match self.lock.try_read() {
            Some(g) => g,
            None => {
                note_contended(i);
                spin_then(|| self.lock.try_read(), || self.lock.read())
            }
        }
    }
}

thread_local! {
    /// Contended acquisitions on this thread since the last
    /// [`take_contended`]: (the last one's stripe, how many).
    static CONTENDED: Cell<(usize, u32)> = const { Cell::new((0, 0)) };
}

/// Record a contended acquisition of stripe `i` on this thread.
#[cold]
fn note_contended(i: usize) {
    CONTENDED.with(|c| {
        let (_, n) = c.get();
        c.set((i, n.saturating_add(1)));
    });
}

/// The contended stripe acquisitions of this thread since the last call,
/// as (the last one's stripe, how many), and clear them; `None` if there
/// were none. A connection calls it around each batch to learn which hot
/// stripe it shares with another worker (see [`crate::migrate`]).
#[inline]
pub fn take_contended() -> Option<(usize, u32)> {
    CONTENDED.with(|c| {
        let v = c.replace((0, 0));
        (v.1 > 0).then_some(v)
    })
}

/// Retry `attempt` for up to [`SPIN_BEFORE_PARK_NS`], then `park`.
#[cold]
fn spin_then<G>(attempt: impl Fn() -> Option<G>, park: impl FnOnce() -> G) -> G {
    let t0 = std::time::Instant::now();
    loop {
        for _ in 0..SPINS_PER_TRY {
            std::hint::spin_loop();
        }
        if let Some(g) = attempt() {
            return g;
        }
        if t0.elapsed().as_nanos() > u128::from(SPIN_BEFORE_PARK_NS) {
            return park();
        }
    }
}

/// The table of stripes.
pub struct KeyLocks {
    stripes: Box<[CachePadded<Stripe>]>,
}

/// One held stripe.
enum Held<'a> {
    Read {
        _g: RwLockReadGuard<'a, ()>,
    },
    Write {
        /// Add one to this version before unlocking, if armed.
        version: &'a AtomicU64,
        armed: bool,
        _g: RwLockWriteGuard<'a, ()>,
    },
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if let Held::Write {
            version,
            armed: true,
            ..
        } = self
        {
            // Only the holder of the exclusive lock writes the version, so
            // load + store is an increment; the unlock that follows
            // publishes it (release) to the next locker.
            version.store(version.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        }
    }
}

/// The stripes a command holds; dropping it releases them (and bumps the
/// version of each stripe held exclusively, unless disarmed).
#[must_use = "the stripes are released when the guard is dropped"]
pub struct KeyGuard<'a> {
    held: SmallVec<[Held<'a>; INLINE_STRIPES]>,
}

impl<'a> KeyGuard<'a> {
    /// A guard that holds nothing.
    pub fn none() -> KeyGuard<'a> {
        KeyGuard {
            held: SmallVec::new(),
        }
    }

    /// Number of stripes held.
    pub fn stripes(&self) -> usize {
        self.held.len()
    }

    /// Release without bumping any version (nothing was written, e.g. an
    /// EXEC aborted by a dirty WATCH).
    pub fn disarm(&mut self) {
        for h in &mut self.held {
            if let Held::Write { armed, .. } = h {
                *armed = false;
            }
        }
    }
}

impl Default for KeyLocks {
    fn default() -> Self {
        KeyLocks::new()
    }
}

impl KeyLocks {
    /// A table of [`KEY_LOCK_STRIPES`] unlocked stripes.
    pub fn new() -> KeyLocks {
        KeyLocks {
            stripes: (0..KEY_LOCK_STRIPES)
                .map(|_| {
                    CachePadded::new(Stripe {
                        lock: RwLock::new(()),
                        version: AtomicU64::new(0),
                    })
                })
                .collect(),
        }
    }

    /// The stripe of `key`.
    #[inline]
    pub fn stripe_of(key: &[u8]) -> usize {
        (nibble::hash_key(key) as usize) & (KEY_LOCK_STRIPES - 1)
    }

    /// Take the stripes of `keys`: exclusive if `write`, else shared.
    pub fn lock<'k>(&self, keys: impl IntoIterator<Item = &'k [u8]>, write: bool) -> KeyGuard<'_> {
        self.lock_modes(keys.into_iter().map(|k| (k, write)))
    }

    /// Take the stripe of one key (most commands): no ordering to do.
    pub fn lock_one(&self, key: &[u8], write: bool) -> KeyGuard<'_> {
        let i = Self::stripe_of(key);
        let s = &self.stripes[i];
        let mut held = SmallVec::new();
        held.push(if write {
            Held::Write {
                _g: s.write(i),
                version: &s.version,
                armed: true,
            }
        } else {
            Held::Read { _g: s.read(i) }
        });
        KeyGuard { held }
    }

    /// Take the stripes of `(key, write)` pairs, each stripe once, in
    /// ascending order, exclusive where any of its keys asks for it.
    pub fn lock_modes<'k>(&self, keys: impl IntoIterator<Item = (&'k [u8], bool)>) -> KeyGuard<'_> {
        let mut want: SmallVec<[(usize, bool); 4]> = keys
            .into_iter()
            .map(|(k, w)| (Self::stripe_of(k), w))
            .collect();
        // Ascending stripe, and for one stripe the write request first, so
        // `dedup_by_key` keeps the strongest mode.
        want.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        want.dedup_by_key(|s| s.0);
        let held = want
            .into_iter()
            .map(|(i, w)| {
                let s = &self.stripes[i];
                if w {
                    Held::Write {
                        _g: s.write(i),
                        version: &s.version,
                        armed: true,
                    }
                } else {
                    Held::Read { _g: s.read(i) }
                }
            })
            .collect();
        KeyGuard { held }
    }

    /// Take every stripe, in order: exclusive if `write` (disarmed: the
    /// holder bumps what it changes with [`KeyLocks::bump_held`]), else
    /// shared. For FLUSHALL and for an EXEC whose queue holds a command
    /// whose keys the table does not name. About 4096 uncontended lock
    /// operations, some tens of microseconds.
    pub fn lock_all(&self, write: bool) -> KeyGuard<'_> {
        let held = self
            .stripes
            .iter()
            .map(|s| {
                if write {
                    Held::Write {
                        _g: s.lock.write(),
                        version: &s.version,
                        armed: false,
                    }
                } else {
                    Held::Read { _g: s.lock.read() }
                }
            })
            .collect();
        KeyGuard { held }
    }

    /// The write version of `stripe`. Stable while the caller holds the
    /// stripe in either mode.
    #[inline]
    pub fn version(&self, stripe: usize) -> u64 {
        self.stripes[stripe].version.load(Ordering::Relaxed)
    }

    /// Record a write to `key` whose stripe the caller holds exclusively
    /// through a disarmed guard (see [`KeyLocks::lock_all`]).
    pub fn bump_held(&self, key: &[u8]) {
        let v = &self.stripes[Self::stripe_of(key)].version;
        v.store(v.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    #[test]
    fn same_stripe_taken_once_in_the_strongest_mode() {
        let l = KeyLocks::new();
        let g = l.lock_modes([(&b"a"[..], false), (b"a", true), (b"a", false)]);
        assert_eq!(g.stripes(), 1);
        let i = KeyLocks::stripe_of(b"a");
        assert!(l.stripes[i].lock.is_locked_exclusive());
        drop(g);
        assert!(!l.stripes[i].lock.is_locked());
        assert_eq!(l.version(i), 1, "an exclusive hold bumps once");
    }

    #[test]
    fn readers_share_writers_exclude() {
        let l = KeyLocks::new();
        let r1 = l.lock_one(b"k", false);
        let r2 = l.lock([&b"k"[..]], false);
        let i = KeyLocks::stripe_of(b"k");
        assert!(l.stripes[i].lock.try_write().is_none());
        drop((r1, r2));
        assert_eq!(l.version(i), 0, "shared holds do not bump");
        let mut w = l.lock_one(b"k", true);
        assert!(l.stripes[i].lock.try_read().is_none());
        w.disarm();
        drop(w);
        assert_eq!(l.version(i), 0, "a disarmed guard does not bump");
        let all = l.lock_all(true);
        assert_eq!(all.stripes(), KEY_LOCK_STRIPES);
        l.bump_held(b"k");
        drop(all);
        assert_eq!(l.version(i), 1);
    }

    /// A contended acquisition that outlasts the spin parks and still
    /// gets the stripe once the holder lets go, never before; one that
    /// the holder releases during the spin gets it without parking.
    #[test]
    fn contended_stripe_spins_then_parks_and_keeps_exclusion() {
        let l = Arc::new(KeyLocks::new());
        let inside = Arc::new(AtomicU64::new(0));
        for hold_us in [5u64, 20 * SPIN_BEFORE_PARK_NS / 1000] {
            let g = l.lock_one(b"k", true);
            inside.store(1, Ordering::SeqCst);
            let (l2, in2) = (l.clone(), inside.clone());
            let t = std::thread::spawn(move || {
                let _g = l2.lock_one(b"k", true);
                assert_eq!(in2.load(Ordering::SeqCst), 0, "got the stripe while held");
            });
            std::thread::sleep(std::time::Duration::from_micros(hold_us));
            inside.store(0, Ordering::SeqCst);
            drop(g);
            t.join().unwrap();
            // Readers wait for a writer the same way.
            let w = l.lock_one(b"k", true);
            let l3 = l.clone();
            let r = std::thread::spawn(move || drop(l3.lock_one(b"k", false)));
            std::thread::sleep(std::time::Duration::from_micros(hold_us));
            drop(w);
            r.join().unwrap();
        }
        let i = KeyLocks::stripe_of(b"k");
        assert_eq!(l.version(i), 6, "every exclusive hold bumped once");
    }

    /// Two threads move units between overlapping key sets in opposite
    /// orders: ordered acquisition means no deadlock, exclusion means the
    /// (non-atomic) read-modify-write pairs never lose an update.
    #[test]
    fn multi_key_locking_neither_deadlocks_nor_loses_updates() {
        let l = Arc::new(KeyLocks::new());
        let cells: Arc<Vec<AtomicU64>> = Arc::new((0..4).map(|_| AtomicU64::new(0)).collect());
        let keys: [&[u8]; 4] = [b"w", b"x", b"y", b"z"];
        let hs: Vec<_> = (0..2)
            .map(|t| {
                let (l, cells) = (l.clone(), cells.clone());
                std::thread::spawn(move || {
                    for n in 0..20_000u64 {
                        let (a, b) = if t == 0 { (0, 3) } else { (3, 0) };
                        let a = (a + n as usize) % 4;
                        let b = (b + n as usize) % 4;
                        let _g = l.lock([keys[a], keys[b]], true);
                        for c in [a, b] {
                            let v = cells[c].load(Ordering::Relaxed);
                            cells[c].store(v + 1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        let total: u64 = cells.iter().map(|c| c.load(Ordering::Relaxed)).sum();
        assert_eq!(total, 2 * 2 * 20_000);
    }
}
