//! Concurrency: writers, readers and compaction at once, with checkers.
//!
//! Values are self-describing (key id, writer, sequence number, a checksum),
//! so a torn or misdirected read is detected. Each key has a single writer,
//! so per key the sequence numbers a reader sees must never go backwards
//! (no stale-after-newer), and after the run every key holds its writer's
//! last value. Segments are small and the store is tight, so heads roll and
//! compaction relocates objects while readers copy them: a use after free of
//! a retired segment would show up as a bad checksum.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nibble::{Config, Error, Expiry, Mode, PutOptions, Store};

const KEYS_PER_WRITER: u64 = 400;

/// Run length: `NIBBLE_STRESS_MS` overrides (long runs behind a flag).
fn run_ms() -> u64 {
    std::env::var("NIBBLE_STRESS_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(700)
}

fn encode(key: u64, seq: u64, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len.max(24));
    v.extend_from_slice(&key.to_le_bytes());
    v.extend_from_slice(&seq.to_le_bytes());
    let body = len.max(24) - 24;
    let mut sum = key ^ seq;
    for i in 0..body {
        let b = (key as usize * 7 + seq as usize * 13 + i) as u8;
        sum = sum.wrapping_mul(31).wrapping_add(b as u64);
        v.push(b);
    }
    v.extend_from_slice(&sum.to_le_bytes());
    v
}

fn decode(v: &[u8]) -> Option<(u64, u64)> {
    if v.len() < 24 {
        return None;
    }
    let key = u64::from_le_bytes(v[0..8].try_into().ok()?);
    let seq = u64::from_le_bytes(v[8..16].try_into().ok()?);
    let mut sum = key ^ seq;
    for &b in &v[16..v.len() - 8] {
        sum = sum.wrapping_mul(31).wrapping_add(b as u64);
    }
    (sum == u64::from_le_bytes(v[v.len() - 8..].try_into().ok()?)).then_some((key, seq))
}

/// A 31-bit pseudo-random number from a 64-bit LCG (Knuth's MMIX constants).
fn next_random(x: &mut u64) -> u64 {
    *x = x
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *x >> 33
}

fn stress(mode: Mode) {
    let mut cfg = Config::new(24 << 20);
    cfg.mode = mode;
    cfg.segment_bytes = Some(256 << 10);
    cfg.compaction_trigger_permille = 600;
    let store = Arc::new(Store::new(cfg).unwrap());
    let writers = 2u64;
    let stop = Arc::new(AtomicBool::new(false));
    let deadline = Instant::now() + Duration::from_millis(run_ms());
    let mut handles = Vec::new();
    for w in 0..writers {
        let (s, stop) = (store.clone(), stop.clone());
        handles.push(std::thread::spawn(move || {
            let mut last = vec![0u64; KEYS_PER_WRITER as usize];
            let mut seq = 0u64;
            while !stop.load(Ordering::Relaxed) {
                seq += 1;
                let i = (seq * 7919) % KEYS_PER_WRITER;
                let key = w * KEYS_PER_WRITER + i;
                let len = 100 + (seq as usize * 37) % 3000;
                match s.put(format!("k{key}").as_bytes(), &encode(key, seq, len)) {
                    Ok(_) => last[i as usize] = seq,
                    Err(Error::OutOfMemory { .. }) => {}
                    Err(e) => panic!("{e}"),
                }
            }
            last
        }));
    }
    let mut readers = Vec::new();
    for r in 0..2u64 {
        let (s, stop) = (store.clone(), stop.clone());
        readers.push(std::thread::spawn(move || {
            let n = writers * KEYS_PER_WRITER;
            let mut seen = vec![0u64; n as usize];
            let mut buf = Vec::new();
            let mut reads = 0u64;
            let mut x = r + 1;
            while !stop.load(Ordering::Relaxed) {
                let key = next_random(&mut x) % n;
                if s.get_into(format!("k{key}").as_bytes(), &mut buf)
                    .unwrap()
                    .is_some()
                {
                    let (k, seq) = decode(&buf).expect("torn or corrupt value");
                    assert_eq!(k, key, "value of another key");
                    assert!(seq >= seen[key as usize], "stale read after newer");
                    seen[key as usize] = seq;
                }
                reads += 1;
            }
            reads
        }));
    }
    // Force compaction while readers copy objects out (Nibble-2 makes
    // little garbage by itself).
    while Instant::now() < deadline {
        store.compact_now(Duration::from_millis(30));
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::Relaxed);
    let lasts: Vec<Vec<u64>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let reads: u64 = readers.into_iter().map(|h| h.join().unwrap()).sum();
    assert!(reads > 0);
    for (w, last) in lasts.iter().enumerate() {
        for (i, &seq) in last.iter().enumerate() {
            if seq == 0 {
                continue;
            }
            let key = w as u64 * KEYS_PER_WRITER + i as u64;
            let v = store
                .get(format!("k{key}").as_bytes())
                .unwrap()
                .expect("lost key");
            assert_eq!(decode(&v), Some((key, seq)), "final value of k{key}");
        }
    }
    let st = store.stats();
    assert!(st.segments_compacted > 0, "compaction never ran: {st:?}");
}

#[test]
fn concurrent_nibble() {
    stress(Mode::Nibble);
}

#[test]
fn concurrent_nibble2() {
    stress(Mode::Nibble2);
}

/// Fill until out of memory: it is reported promptly, reads and deletes keep
/// working, and after deletes writes succeed again.
#[test]
fn out_of_memory_and_recovery() {
    for mode in [Mode::Nibble, Mode::Nibble2] {
        let mut cfg = Config::new(16 << 20);
        cfg.mode = mode;
        let s = Store::new(cfg).unwrap();
        let v = vec![7u8; 4000];
        let mut n = 0u32;
        let t0 = Instant::now();
        let err = loop {
            match s.put(format!("fill-{n}").as_bytes(), &v) {
                Ok(_) => n += 1,
                Err(e) => break e,
            }
            assert!(t0.elapsed() < Duration::from_secs(30), "never ran out");
        };
        assert!(matches!(err, Error::OutOfMemory { .. }), "{err}");
        let t1 = Instant::now();
        assert!(s.put(b"one-more", &v).is_err());
        assert!(
            t1.elapsed() < Duration::from_secs(1),
            "out of memory not prompt"
        );
        let st = s.stats();
        assert!(
            st.live_bytes as f64 > 0.7 * st.pool_bytes as f64,
            "filled only {} of {}",
            st.live_bytes,
            st.pool_bytes
        );
        for i in (0..n).step_by(97) {
            assert_eq!(s.get(format!("fill-{i}").as_bytes()).unwrap().unwrap(), v);
        }
        for i in (0..n).filter(|i| i % 2 == 0) {
            assert!(s.delete(format!("fill-{i}").as_bytes()).unwrap());
        }
        let mut ok = 0;
        for i in 0..n / 4 {
            if s.put(format!("again-{i}").as_bytes(), &v).is_ok() {
                ok += 1;
            }
        }
        assert!(ok >= n / 4 - 2, "writes did not recover: {ok} of {}", n / 4);
        for i in (1..n).step_by(2).take(50) {
            assert_eq!(s.get(format!("fill-{i}").as_bytes()).unwrap().unwrap(), v);
        }
    }
}

/// Relocation racing in-place changes: every overwrite is in place
/// (Nibble-2, one value size) and a third thread keeps rewriting the
/// headers (expiry set and cleared), while fillers deleted around the hot
/// keys keep every segment worth compacting. A relocated copy published
/// over a newer value (a lost update), a lost expiry change, a torn value
/// or a sequence number going backwards fails the test. (It was written
/// for a compaction that copied objects before locking their buckets and
/// caught that variant without its re-check at once; that variant measured
/// no faster and was dropped, the test stays as a guard.)
#[test]
fn relocation_races_in_place_changes() {
    const HOT: u64 = 128;
    const LEN: usize = 900;
    let mut cfg = Config::new(24 << 20);
    cfg.mode = Mode::Nibble2;
    cfg.segment_bytes = Some(256 << 10);
    cfg.compaction_trigger_permille = 600;
    let store = Arc::new(Store::new(cfg).unwrap());
    let hot = |k: u64| format!("hot{k}").into_bytes();
    let filler = |k: u64, round: u64| format!("filler{k}-{round}").into_bytes();
    for k in 0..HOT {
        store.put(&hot(k), &encode(k, 1, LEN)).unwrap();
        store.put(&filler(k, 0), &[0u8; LEN]).unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let deadline = Instant::now() + Duration::from_millis(run_ms());
    // Two writers, each owning half of the hot keys.
    let keep_ttl = PutOptions {
        expiry: Expiry::Keep,
        ..PutOptions::default()
    };
    let writers: Vec<_> = (0..2u64)
        .map(|w| {
            let (s, stop) = (store.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut last = vec![1u64; HOT as usize];
                let mut seq = 1u64;
                while !stop.load(Ordering::Relaxed) {
                    seq += 1;
                    let k = w + 2 * ((seq * 7919) % (HOT / 2));
                    // Single writer per key: the store must hold exactly
                    // this writer's last value (a lost update shows here).
                    let v = s.get(&hot(k)).unwrap().expect("hot key lost");
                    assert_eq!(decode(&v), Some((k, last[k as usize])), "lost update");
                    // KEEPTTL: the expirer owns the expiry.
                    s.put_with(&hot(k), &encode(k, seq, LEN), keep_ttl).unwrap();
                    last[k as usize] = seq;
                }
                last
            })
        })
        .collect();
    // Header-only changes: the expiry of the hot keys set far ahead and
    // cleared again; the last state of each key is remembered.
    let expirer = {
        let (s, stop) = (store.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut state = vec![None; HOT as usize];
            let mut i = 0u64;
            let far = nibble::object::now_ms() + 3_600_000;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let k = (i * 104729) % HOT;
                let now = s.meta(&hot(k)).unwrap().expect("hot key lost");
                assert_eq!(now.expiry_ms, state[k as usize], "lost expiry change");
                let e = i.is_multiple_of(2).then_some(far + i);
                assert!(s.set_expiry(&hot(k), e).unwrap(), "hot{k} vanished");
                state[k as usize] = e;
            }
            state
        })
    };
    let readers: Vec<_> = (0..2u64)
        .map(|r| {
            let (s, stop) = (store.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut seen = vec![0u64; HOT as usize];
                let mut buf = Vec::new();
                let mut x = r + 7;
                while !stop.load(Ordering::Relaxed) {
                    let k = next_random(&mut x) % HOT;
                    s.get_into(&hot(k), &mut buf)
                        .unwrap()
                        .expect("hot key lost");
                    let (key, seq) = decode(&buf).expect("torn or corrupt value");
                    assert_eq!(key, k, "value of another key");
                    assert!(seq >= seen[k as usize], "stale read after newer");
                    seen[k as usize] = seq;
                }
            })
        })
        .collect();
    // Fillers die and are replaced, so segments keep half-dead and are
    // compacted, relocating the hot keys beside them.
    let mut round = 0u64;
    while Instant::now() < deadline {
        round += 1;
        for k in 0..HOT {
            store.delete(&filler(k, round - 1)).unwrap();
            store.put(&filler(k, round), &[0u8; LEN]).unwrap();
        }
        store.compact_now(Duration::from_millis(30));
    }
    stop.store(true, Ordering::Relaxed);
    let lasts: Vec<Vec<u64>> = writers.into_iter().map(|h| h.join().unwrap()).collect();
    let expiries = expirer.join().unwrap();
    for r in readers {
        r.join().unwrap();
    }
    for k in 0..HOT {
        let want = lasts[(k % 2) as usize][k as usize];
        let v = store.get(&hot(k)).unwrap().expect("hot key lost");
        assert_eq!(decode(&v), Some((k, want)), "final value of hot{k}");
        let meta = store.meta(&hot(k)).unwrap().unwrap();
        assert_eq!(meta.expiry_ms, expiries[k as usize], "expiry of hot{k}");
    }
    let st = store.stats();
    assert!(st.bytes_relocated > 0, "nothing was relocated: {st:?}");
}
