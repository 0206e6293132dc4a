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
//! the command table names, or asks for its keys through [`KeyLocks::lock`]
//! when dispatch takes none (commands whose keys move, e.g. with a
//! `numkeys` argument).

use crossbeam_utils::CachePadded;
use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Number of lock stripes (a power of two).
pub const KEY_LOCK_STRIPES: usize = 4096;

/// The table of stripes.
pub struct KeyLocks {
    stripes: Box<[CachePadded<RwLock<()>>]>,
}

/// One held stripe.
enum Held<'a> {
    Read { _g: RwLockReadGuard<'a, ()> },
    Write { _g: RwLockWriteGuard<'a, ()> },
}

/// The stripes a command holds; dropping it releases them.
#[must_use = "the stripes are released when the guard is dropped"]
pub struct KeyGuard<'a> {
    held: Vec<Held<'a>>,
}

impl KeyGuard<'_> {
    /// A guard that holds nothing.
    pub fn none() -> KeyGuard<'static> {
        KeyGuard { held: Vec::new() }
    }

    /// Number of stripes held.
    pub fn stripes(&self) -> usize {
        self.held.len()
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
                .map(|_| CachePadded::new(RwLock::new(())))
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

    /// Take the stripes of `(key, write)` pairs, each stripe once, in
    /// ascending order, exclusive where any of its keys asks for it.
    pub fn lock_modes<'k>(&self, keys: impl IntoIterator<Item = (&'k [u8], bool)>) -> KeyGuard<'_> {
        let mut want: Vec<(usize, bool)> = keys
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
                    Held::Write { _g: s.write() }
                } else {
                    Held::Read { _g: s.read() }
                }
            })
            .collect();
        KeyGuard { held }
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
        assert!(l.stripes[i].is_locked_exclusive());
        drop(g);
        assert!(!l.stripes[i].is_locked());
    }

    #[test]
    fn readers_share_writers_exclude() {
        let l = KeyLocks::new();
        let r1 = l.lock([&b"k"[..]], false);
        let r2 = l.lock([&b"k"[..]], false);
        let i = KeyLocks::stripe_of(b"k");
        assert!(l.stripes[i].try_write().is_none());
        drop((r1, r2));
        let _w = l.lock([&b"k"[..]], true);
        assert!(l.stripes[i].try_read().is_none());
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
