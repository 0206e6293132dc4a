//! Per-key linearizability of put/get/delete under concurrency, with
//! compaction forced on, in both modes.
//!
//! Three threads hammer a small key space (so every key sees writes from
//! several threads) and record a history: for each operation its kind, the
//! value written or read, and two stamps from one global counter taken
//! just before the call and just after it returns (`start < end`; `a`
//! precedes `b` in real time iff `a.end < b.start`). Every written value is
//! unique (thread, sequence number), and a delete writes a unique
//! "tombstone", so a read maps to the one write it observed.
//!
//! Each key's history is then checked against the conditions an atomic
//! register must satisfy (Gibbons and Korach's read-mapping conditions):
//!
//! 1. a read returns a value that was written (no torn or invented data);
//! 2. no read from the future: the write did not start after the read ended;
//! 3. no overwritten read: there is no write `w2` with `w < w2 < r`;
//! 4. no new-old inversion: if `r1 < r2`, `r2` does not return a value whose
//!    write precedes the write `r1` returned.
//!
//! A read of "absent" must map to the initial state or some delete `d` with
//! `d.start < r.end` and no value write strictly between `d` and `r`.
//! `NIBBLE_STRESS_MS` lengthens the run.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use nibble::{Config, Error, Mode, Store};

const THREADS: u64 = 3;
const KEYS: u64 = 64;

fn run_ms() -> u64 {
    std::env::var("NIBBLE_STRESS_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(600)
}

/// What an operation did. Values are `(thread << 32) | seq`, never 0.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Put(u64),
    Delete(u64),
    Get(Option<u64>),
}

#[derive(Clone, Copy, Debug)]
struct Op {
    key: u64,
    kind: Kind,
    start: u64,
    end: u64,
}

fn value_bytes(v: u64, len: usize) -> Vec<u8> {
    let mut b = vec![(v as u8) ^ 0x5a; len.max(16)];
    b[..8].copy_from_slice(&v.to_le_bytes());
    let n = b.len();
    b[n - 8..].copy_from_slice(&v.to_le_bytes());
    b
}

fn parse_value(b: &[u8]) -> u64 {
    assert!(b.len() >= 16, "short value {}", b.len());
    let v = u64::from_le_bytes(b[..8].try_into().unwrap());
    assert_eq!(&b[b.len() - 8..], &v.to_le_bytes(), "torn value");
    assert!(
        b[8..b.len() - 8].iter().all(|&x| x == (v as u8) ^ 0x5a),
        "corrupt value body"
    );
    v
}

fn history(mode: Mode) -> Vec<Op> {
    let mut cfg = Config::new(16 << 20);
    cfg.mode = mode;
    cfg.segment_bytes = Some(128 << 10);
    cfg.compaction_trigger_permille = 700;
    let store = Arc::new(Store::new(cfg).unwrap());
    let clock = Arc::new(AtomicU64::new(1));
    let barrier = Arc::new(Barrier::new(THREADS as usize + 1));
    let deadline = Instant::now() + Duration::from_millis(run_ms());
    let mut handles = Vec::new();
    for t in 0..THREADS {
        let (s, clock, barrier) = (store.clone(), clock.clone(), barrier.clone());
        handles.push(std::thread::spawn(move || {
            let mut ops = Vec::new();
            let mut x = t * 0x9e37_79b9 + 7;
            let mut buf = Vec::new();
            barrier.wait();
            let mut seq = 0u64;
            // The checker is quadratic per key: bound the history.
            let max_ops = 20_000 * run_ms().div_ceil(600) as usize;
            while Instant::now() < deadline && ops.len() < max_ops {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let r = x >> 33;
                let key = r % KEYS;
                let name = format!("key-{key}");
                seq += 1;
                let v = ((t + 1) << 32) | seq;
                let start = clock.fetch_add(1, Ordering::SeqCst);
                let kind = match (r >> 8) % 10 {
                    0..=3 => {
                        // Sizes vary so Nibble-2 both overwrites in place
                        // and appends.
                        let len = 16 + ((r >> 16) % 700) as usize;
                        match s.put(name.as_bytes(), &value_bytes(v, len)) {
                            Ok(_) => Kind::Put(v),
                            Err(Error::OutOfMemory { .. }) => continue,
                            Err(e) => panic!("{e}"),
                        }
                    }
                    4 => {
                        s.delete(name.as_bytes()).unwrap();
                        Kind::Delete(v)
                    }
                    _ => match s.get_into(name.as_bytes(), &mut buf).unwrap() {
                        Some(_) => Kind::Get(Some(parse_value(&buf))),
                        None => Kind::Get(None),
                    },
                };
                let end = clock.fetch_add(1, Ordering::SeqCst);
                ops.push(Op {
                    key,
                    kind,
                    start,
                    end,
                });
            }
            ops
        }));
    }
    // The full release (`release_memory`: every free block, the never-used
    // spares of regions taken whole included, goes back to the OS) runs
    // every 100 µs beside the clients, which it must never disturb. It
    // turns a block freed too early into zeros at once, where stale bytes
    // would hide it: a segment retired with live objects (compaction's
    // lock-free scan losing its place on a header that a Nibble-2
    // overwrite rewrites, see the layout essay in `object.rs`) reads back
    // as a vanished value or one whose tail is zeros.
    let releaser = {
        let s = store.clone();
        std::thread::spawn(move || {
            while Instant::now() < deadline {
                s.release_memory();
                std::thread::sleep(Duration::from_micros(100));
            }
        })
    };
    barrier.wait();
    // Force compaction so reads race with relocation.
    while Instant::now() < deadline && !handles.iter().all(|h| h.is_finished()) {
        store.compact_now(Duration::from_millis(20));
        std::thread::sleep(Duration::from_millis(10));
    }
    let ops: Vec<Op> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    releaser.join().unwrap();
    assert!(store.stats().segments_compacted > 0, "compaction never ran");
    ops
}

/// Check one key's history; `Err` describes the first violation.
fn check_key(ops: &[Op]) -> Result<(), String> {
    use std::collections::HashMap;
    // Writes (puts and deletes) by their unique value.
    let mut writes: HashMap<u64, &Op> = HashMap::new();
    let mut value_writes: Vec<&Op> = Vec::new();
    let mut deletes: Vec<&Op> = Vec::new();
    for op in ops {
        match op.kind {
            Kind::Put(v) => {
                writes.insert(v, op);
                value_writes.push(op);
            }
            Kind::Delete(v) => {
                writes.insert(v, op);
                deletes.push(op);
            }
            Kind::Get(_) => {}
        }
    }
    let precedes = |a: &Op, b: &Op| a.end < b.start;
    // The write each read observed (`None` = the initial state).
    let mut mapped: Vec<(&Op, Option<&Op>)> = Vec::new();
    for r in ops {
        let Kind::Get(got) = r.kind else { continue };
        match got {
            Some(v) => {
                let w = writes
                    .get(&v)
                    .ok_or_else(|| format!("read {v:#x} that was never written: {r:?}"))?;
                if !matches!(w.kind, Kind::Put(_)) {
                    return Err(format!("read a tombstone's id: {r:?}"));
                }
                if precedes(r, w) {
                    return Err(format!("read from the future: {r:?} saw {w:?}"));
                }
                if let Some(w2) = value_writes
                    .iter()
                    .chain(deletes.iter())
                    .find(|w2| precedes(w, w2) && precedes(w2, r))
                {
                    return Err(format!("overwritten read: {r:?} saw {w:?} after {w2:?}"));
                }
                mapped.push((r, Some(w)));
            }
            None => {
                // Some delete (or the initial state) not yet overwritten.
                let ok_from = |d: Option<&Op>| {
                    d.is_none_or(|d| !precedes(r, d))
                        && !value_writes
                            .iter()
                            .any(|w2| d.is_none_or(|d| precedes(d, w2)) && precedes(w2, r))
                };
                if ok_from(None) {
                    continue;
                }
                if !deletes.iter().any(|d| ok_from(Some(d))) {
                    return Err(format!("read absent, but a value was live: {r:?}"));
                }
            }
        }
    }
    // New-old inversion between value reads.
    for &(r1, w1) in &mapped {
        for &(r2, w2) in &mapped {
            if let (Some(w1), Some(w2)) = (w1, w2) {
                if precedes(r1, r2) && precedes(w2, w1) {
                    return Err(format!(
                        "new-old inversion: {r1:?} saw {w1:?}, later {r2:?} saw older {w2:?}"
                    ));
                }
            }
        }
    }
    Ok(())
}

fn check(mode: Mode) {
    let ops = history(mode);
    let reads = ops
        .iter()
        .filter(|o| matches!(o.kind, Kind::Get(Some(_))))
        .count();
    assert!(ops.len() > 1000 && reads > 100, "too little happened");
    for key in 0..KEYS {
        let mine: Vec<Op> = ops.iter().filter(|o| o.key == key).copied().collect();
        if let Err(e) = check_key(&mine) {
            panic!("{mode:?}, key {key} ({} ops): {e}", mine.len());
        }
    }
}

#[test]
fn linearizable_nibble() {
    check(Mode::Nibble);
}

#[test]
fn linearizable_nibble2() {
    check(Mode::Nibble2);
}

/// The checker itself rejects the violations it claims to catch.
#[test]
fn checker_catches_violations() {
    let op = |kind, start, end| Op {
        key: 0,
        kind,
        start,
        end,
    };
    // Overwritten read: w1 < w2 < r, r saw w1.
    let h = [
        op(Kind::Put(1), 1, 2),
        op(Kind::Put(2), 3, 4),
        op(Kind::Get(Some(1)), 5, 6),
    ];
    assert!(check_key(&h).is_err());
    // Read from the future.
    let h = [op(Kind::Get(Some(1)), 1, 2), op(Kind::Put(1), 3, 4)];
    assert!(check_key(&h).is_err());
    // New-old inversion with concurrent reads of overlapping writes.
    let h = [
        op(Kind::Put(1), 1, 2),
        op(Kind::Put(2), 3, 10),
        op(Kind::Get(Some(2)), 4, 5),
        op(Kind::Get(Some(1)), 6, 7),
    ];
    assert!(check_key(&h).is_err());
    // Absent although a put completed after the last delete.
    let h = [
        op(Kind::Delete(9), 1, 2),
        op(Kind::Put(1), 3, 4),
        op(Kind::Get(None), 5, 6),
    ];
    assert!(check_key(&h).is_err());
    // Fine: concurrent write and read may see either value.
    let h = [
        op(Kind::Put(1), 1, 2),
        op(Kind::Put(2), 3, 8),
        op(Kind::Get(Some(1)), 4, 5),
        op(Kind::Get(None), 0, 1),
    ];
    assert!(check_key(&h).is_ok(), "{:?}", check_key(&h));
}
