//! `memlab keys`: small objects in process: how many keys a fixed amount
//! of memory holds (issue 23: per-object metadata; Segcache NSDI'21 §3,
//! "about 5 bytes of metadata per object").
//!
//! ```text
//!  per value size V and system (a fresh store each cell):
//!    insert key:%010d (14 bytes) -> V bytes, k = 0, 1, 2, ...
//!    until the system refuses a write (Nibble, Nibble-2: noeviction)
//!    or drops a key it was given (Segcache: its first eviction, seen
//!    as a missing key among the first written, checked every 1024)
//!    keys held = the keys written before it refused or evicted
//! ```
//!
//! Every system gets the same bytes. Nibble's capacity covers its log, its
//! index and its compaction reserve (the index's share of the capacity,
//! the frequency sketch, everything the engine accounts). Segcache
//! (crate `segcache` 0.4, Pelikan's storage engine) keeps its hash table
//! outside its heap, so it runs twice: `segcache-heap`, heap = the
//! budget with the table on top (the issue's "same heap", which gives it
//! the table for free), and `segcache`, heap + table = the budget. Its
//! table (2^power 8-byte slots) refuses inserts at 35-40 % of its slots
//! with these keys, so five table sizes are tried per cell and the best
//! count is reported (`index_bytes` says which). Bytes per key = budget
//! ÷ keys held.
//!
//! What this does not count: process overhead (the server's figure, RSS
//! per key, is `scripts/smallkeys.py`); Segcache's per-segment headers
//! live outside its heap too (a few dozen bytes per 1 MiB segment).

use nibble::{Config, Mode, Store};

use crate::report::{Reporter, Row};

/// Key bytes: `key:%010d`, as `scripts/smallkeys.py` and the issue.
const KEY_BYTES: usize = 14;
/// Segcache's segment size (its default).
const SEGCACHE_SEGMENT_BYTES: i32 = 1 << 20;
/// Segcache's hash table: 2^power 8-byte item slots (eight per 64-byte
/// bucket, two bucket choices per key, no overflow chains).
const SEGCACHE_SLOT_BYTES: usize = 8;
/// Segcache's smallest hash power.
const SEGCACHE_MIN_POWER: u8 = 7;
/// Inserts between two looks for evicted keys.
const CHECK_EVERY: u64 = 1024;
/// The first keys, looked up to see whether Segcache has evicted.
const PROBE_KEYS: u64 = 16;

/// What a run measures.
pub struct KeysOpts {
    pub capacity_mib: usize,
    pub value_sizes: Vec<usize>,
    pub systems: Vec<KeysSys>,
    pub repeat: usize,
}

/// The systems `memlab keys` compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum KeysSys {
    Nibble,
    Nibble2,
    /// Segcache, heap + hash table = the budget.
    Segcache,
    /// Segcache, heap = the budget, hash table on top.
    SegcacheHeap,
}

impl KeysSys {
    fn name(self) -> &'static str {
        match self {
            KeysSys::Nibble => "nibble",
            KeysSys::Nibble2 => "nibble2",
            KeysSys::Segcache => "segcache",
            KeysSys::SegcacheHeap => "segcache-heap",
        }
    }
}

/// One cell's result.
struct Held {
    keys: u64,
    /// Keys present when it stopped (after Segcache's first eviction).
    after: u64,
    /// Bytes of the budget in Segcache's table or Nibble's index.
    index_bytes: u64,
    /// Why it stopped.
    stop: String,
}

fn key(k: u64, out: &mut Vec<u8>) {
    use std::io::Write;
    out.clear();
    // Formatting into a Vec cannot fail.
    let _ = write!(out, "key:{k:010}");
}

fn nibble_cell(mode: Mode, bytes: usize, value: &[u8]) -> Result<Held, String> {
    let mut cfg = Config::new(bytes);
    cfg.mode = mode;
    let s = Store::new(cfg).map_err(|e| e.to_string())?;
    let mut k = 0u64;
    let mut buf = Vec::with_capacity(KEY_BYTES);
    let stop = loop {
        key(k, &mut buf);
        if let Err(e) = s.put(&buf, value) {
            break e.to_string();
        }
        k += 1;
    };
    let st = s.stats();
    Ok(Held {
        keys: s.len(),
        after: s.len(),
        index_bytes: st.index_bytes,
        stop,
    })
}

/// Bytes of a Segcache table of 2^power slots.
fn segcache_table_bytes(power: u8) -> usize {
    SEGCACHE_SLOT_BYTES << power
}

/// Fill one Segcache of `heap` bytes and 2^`power` table slots.
fn segcache_fill(heap: usize, power: u8, value: &[u8]) -> Result<Held, String> {
    let heap = heap / SEGCACHE_SEGMENT_BYTES as usize * SEGCACHE_SEGMENT_BYTES as usize;
    if heap < SEGCACHE_SEGMENT_BYTES as usize {
        return Err("segcache: no room for one segment".into());
    }
    let c = segcache::Segcache::builder()
        .heap_size(heap)
        .segment_size(SEGCACHE_SEGMENT_BYTES)
        .hash_power(power)
        .eviction(segcache::Policy::Merge {
            max: 8,
            merge: 4,
            compact: 2,
        })
        .build()
        .map_err(|e| format!("segcache: {e}"))?;
    // Segcache counts its items only in debug builds, so eviction is
    // detected by probing the first keys: every policy evicts from the
    // oldest segments, which hold them (none of them is ever read).
    let present = |k: u64, buf: &mut Vec<u8>| {
        key(k, buf);
        c.get_no_freq_incr(buf).is_some()
    };
    let (mut k, mut clean) = (0u64, 0u64);
    let mut buf = Vec::with_capacity(KEY_BYTES);
    let stop = loop {
        key(k, &mut buf);
        if let Err(e) = c.insert(&buf, value, None, std::time::Duration::ZERO) {
            break format!("insert: {e}");
        }
        k += 1;
        if k % CHECK_EVERY == 0 {
            if !(0..PROBE_KEYS.min(k)).all(|p| present(p, &mut buf)) {
                break "evicted".into();
            }
            clean = k;
        }
    };
    // Keys present now (after the first eviction, if any): every key
    // written, looked up once.
    let now = (0..k).filter(|&p| present(p, &mut buf)).count() as u64;
    Ok(Held {
        keys: clean.max(now),
        after: now,
        index_bytes: segcache_table_bytes(power) as u64,
        stop,
    })
}

/// The smallest hash power whose slots hold `items`.
fn power_for(items: usize) -> u8 {
    let mut p = SEGCACHE_MIN_POWER;
    while (1usize << p) < items && p < 40 {
        p += 1;
    }
    p
}

/// Segcache's item size for `value` (header, key, value, 8-byte aligned).
fn segcache_item_bytes(value: usize) -> usize {
    (segcache_header_bytes() + KEY_BYTES + value).div_ceil(8) * 8
}

fn segcache_header_bytes() -> usize {
    // keyvalue's item header without its integrity magic.
    6
}

fn segcache_cell(sys: KeysSys, bytes: usize, value: &[u8]) -> Result<Held, String> {
    // Its two-choice table refuses inserts well before it is full (at
    // 35-40 % of its slots with these keys), so every table size from
    // half the budget's items to eight times is tried and the best count
    // kept: with the table on top (`segcache-heap`) the largest wins;
    // within the budget (`segcache`) the table takes heap.
    let fit = bytes / segcache_item_bytes(value.len());
    let lo = power_for(fit).saturating_sub(1).max(SEGCACHE_MIN_POWER);
    let mut best: Option<Held> = None;
    for p in lo..=lo + 4 {
        let table = segcache_table_bytes(p);
        let heap = match sys {
            KeysSys::SegcacheHeap => bytes,
            _ if table < bytes => bytes - table,
            _ => break,
        };
        let h = match segcache_fill(heap, p, value) {
            Ok(h) => h,
            Err(_) => continue,
        };
        if best.as_ref().is_none_or(|b| h.keys > b.keys) {
            best = Some(h);
        }
    }
    best.ok_or_else(|| "segcache: no table size fits".into())
}

/// Run it all.
pub fn run(o: &KeysOpts, rep: &mut Reporter) -> std::io::Result<()> {
    let bytes = o.capacity_mib << 20;
    for &v in &o.value_sizes {
        let value = vec![b'v'; v];
        for run in 0..o.repeat.max(1) {
            for &sys in &o.systems {
                let r = match sys {
                    KeysSys::Nibble => nibble_cell(Mode::Nibble, bytes, &value),
                    KeysSys::Nibble2 => nibble_cell(Mode::Nibble2, bytes, &value),
                    _ => segcache_cell(sys, bytes, &value),
                };
                match r {
                    Ok(h) => rep.emit(
                        Row::new("keys", sys.name(), 1)
                            .set("value", v as u64)
                            .set("run", run as u64)
                            .set("budget_bytes", bytes as u64)
                            .set("keys", h.keys)
                            .set_f("bytes_per_key", bytes as f64 / h.keys.max(1) as f64, 1)
                            .set("keys_at_stop", h.after)
                            .set("index_bytes", h.index_bytes)
                            .set("stop", h.stop),
                    )?,
                    Err(e) => rep.fail(format!("keys {} {v} B: {e}", sys.name())),
                }
            }
        }
    }
    rep.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nibble_fills_and_says_why_it_stopped() {
        let h = nibble_cell(Mode::Nibble2, 16 << 20, &[b'v'; 64]).unwrap();
        // 16 MiB of 86-byte objects: at least half as many keys as fit
        // with no metadata, and at most all of them.
        let raw = (16u64 << 20) / (KEY_BYTES as u64 + 64);
        assert!(h.keys > raw / 2 && h.keys <= raw, "{} of {raw}", h.keys);
        assert!(h.stop.contains("memory"), "{}", h.stop);
    }

    #[test]
    fn segcache_counts_keys_until_it_evicts() {
        let h = segcache_cell(KeysSys::Segcache, 16 << 20, &[b'v'; 64]).unwrap();
        let raw = (16u64 << 20) / (KEY_BYTES as u64 + 64);
        assert!(h.keys > raw / 2 && h.keys <= raw, "{} of {raw}", h.keys);
        // Heap + table within the budget.
        assert!(h.index_bytes < 16 << 20);
    }

    #[test]
    fn the_table_power_holds_the_items() {
        for items in [1usize, 100, 10_000, 3_000_000] {
            let p = power_for(items);
            assert!(1usize << p >= items);
            assert!(p == SEGCACHE_MIN_POWER || 1usize << (p - 1) < items);
        }
    }
}
