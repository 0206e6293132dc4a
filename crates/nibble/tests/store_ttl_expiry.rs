//! Bulk expiry and TTL placement (modules `log` and `compaction::expire`):
//! with placement on, segments of objects that expired together are freed
//! whole by reading only them; with it off, expired objects are unlinked
//! from the mixed segments that hold them; either way every unexpired key
//! keeps its latest value and no expired key is served, in both modes,
//! against a model under a fake clock (`object::skew_clock_ms`), and
//! readers racing the expiry pass see a whole value or a miss.
//!
//! The fake clock is process-wide, so every test here takes `CLOCK` (and
//! this binary has no other tests). `NIBBLE_STRESS_MS` lengthens the
//! concurrent run.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nibble::object::{now_ms, skew_clock_ms};
use nibble::{Config, Expiry, Mode, PutOptions, Store};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Serialises the tests of this binary (the clock skew is process-wide).
static CLOCK: Mutex<()> = Mutex::new(());

const CAPACITY_BYTES: usize = 32 << 20;

/// TTL of the fill's expiring objects: well beyond how long the fill
/// takes, even in a debug build on a loaded machine.
const FILL_TTL_MS: u64 = 600_000;

fn store(mode: Mode, ttl_placement: bool) -> Store {
    let mut cfg = Config::new(CAPACITY_BYTES);
    cfg.mode = mode;
    cfg.ttl_placement = ttl_placement;
    Store::new(cfg).unwrap()
}

fn key(i: u64) -> Vec<u8> {
    format!("key:{i:010}").into_bytes()
}

/// A value naming its key and version, `len` bytes (at least the prefix),
/// so a torn, stale or foreign read shows.
fn value(i: u64, ver: u64, len: usize) -> Vec<u8> {
    let mut v = format!("{i}:{ver}:").into_bytes();
    let fill = b'a' + (ver % 23) as u8;
    v.resize(len.max(v.len()), fill);
    v
}

/// Whether `v` is a whole value of key `i` (some version).
fn intact(i: u64, v: &[u8]) -> bool {
    let s = String::from_utf8_lossy(v);
    let mut parts = s.splitn(3, ':');
    let (Some(k), Some(ver), Some(rest)) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    let Ok(ver) = ver.parse::<u64>() else {
        return false;
    };
    let fill = b'a' + (ver % 23) as u8;
    k == i.to_string() && rest.bytes().all(|b| b == fill)
}

fn ttl(at_ms: u64) -> PutOptions {
    PutOptions {
        expiry: Expiry::At(at_ms),
        ..Default::default()
    }
}

/// 20,000 objects with a TTL and 2,000 without, interleaved; the clock
/// moves past the TTL; one expiry pass. The TTL (`FILL_TTL_MS`) is far
/// longer than the fill takes on a slow machine, so nothing expires before
/// the clock moves. Returns the store's statistics and
/// the bytes the TTL objects held.
fn expire_mixed_fill(mode: Mode, placement: bool) -> (Store, nibble::Stats, u64) {
    let s = store(mode, placement);
    let start = now_ms();
    let mut ttl_bytes = 0u64;
    for i in 0..22_000u64 {
        let v = value(i, 1, 200);
        if i % 11 == 0 {
            s.put(&key(i), &v).unwrap();
        } else {
            s.put_with(&key(i), &v, ttl(start + FILL_TTL_MS)).unwrap();
            ttl_bytes += (key(i).len()
                + v.len()
                + nibble::object::HEADER_MIN_BYTES
                + nibble::object::EXPIRY_SLOT_BYTES) as u64;
        }
    }
    assert_eq!(s.stats().expired_segments, 0, "nothing expired yet");
    skew_clock_ms(FILL_TTL_MS + 1000);
    s.expire_now();
    let st = s.stats();
    eprintln!(
        "{mode:?} placement {placement}: {ttl_bytes} B expired, {} segments freed whole \
         ({} B each), {} B read, {} mixed segments read, {} keys left",
        st.expired_segments,
        st.segment_bytes,
        st.expiry_bytes_read,
        st.expiry_mixed_scans,
        s.len()
    );
    for i in 0..22_000u64 {
        let got = s.get(&key(i)).unwrap();
        if i % 11 == 0 {
            assert_eq!(got, Some(value(i, 1, 200)), "key {i} without a TTL");
        } else {
            assert_eq!(got, None, "key {i} expired");
        }
    }
    (s, st, ttl_bytes)
}

#[test]
fn placement_frees_expired_segments_whole_reading_only_them() {
    let _c = CLOCK.lock().unwrap_or_else(|e| e.into_inner());
    for mode in [Mode::Nibble, Mode::Nibble2] {
        let (s, st, ttl_bytes) = expire_mixed_fill(mode, true);
        let seg = st.segment_bytes;
        // Every TTL object sat in a TTL head's segment: all of them are
        // gone from the index, their segments freed whole, and the pass
        // read no more than those segments (no segment of the persistent
        // keys).
        assert_eq!(s.len(), 2000, "{mode:?}: only the keys without a TTL");
        assert!(
            st.expired_segments * seg >= ttl_bytes.saturating_sub(seg),
            "{mode:?}: {} segments of {seg} B freed whole for {ttl_bytes} B",
            st.expired_segments
        );
        assert!(
            st.expiry_bytes_read <= ttl_bytes + ttl_bytes / 8 + seg,
            "{mode:?}: read {} B for {ttl_bytes} B expired",
            st.expiry_bytes_read
        );
        assert_eq!(st.expiry_mixed_scans, 0, "{mode:?}: no mixed segment read");
        assert_eq!(st.bytes_relocated, 0, "{mode:?}: nothing relocated");
        // The freed segments' blocks go back to the allocator once the
        // epoch passes (at once here: no operation is running).
        let deadline = Instant::now() + Duration::from_secs(1);
        while s.stats().segments_retired > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let after = s.stats();
        assert_eq!(
            after.segments_retired, 0,
            "{mode:?}: retired segments freed"
        );
        assert!(
            after.blocks_in_use * 65536 < ttl_bytes / 2,
            "{mode:?}: {} blocks still in use",
            after.blocks_in_use
        );
    }
}

#[test]
fn without_placement_expired_objects_are_unlinked_from_mixed_segments() {
    let _c = CLOCK.lock().unwrap_or_else(|e| e.into_inner());
    for mode in [Mode::Nibble, Mode::Nibble2] {
        let (s, st, ttl_bytes) = expire_mixed_fill(mode, false);
        // No segment expires whole (each holds persistent keys): the pass
        // reads every closed segment to unlink the expired objects; those
        // in a CPU head that has not rolled yet wait for it.
        assert_eq!(st.expired_segments, 0, "{mode:?}");
        assert!(st.expiry_mixed_scans > 0, "{mode:?}");
        assert!(
            st.expiry_bytes_read >= ttl_bytes / 2,
            "{mode:?}: read {} B",
            st.expiry_bytes_read
        );
        let per_head_keys = st.segment_bytes / 200 + 1;
        assert!(
            s.len() <= 2000 + per_head_keys * 64,
            "{mode:?}: {} keys left in the index",
            s.len()
        );
    }
}

/// One model entry: value, expiry (0 = never).
#[derive(Clone)]
struct Entry {
    value: Vec<u8>,
    expiry_ms: u64,
}

/// Random puts with and without TTLs (kept TTLs too), overwrites,
/// deletes, expiry changes and clock advances; after each expiry pass
/// every unexpired key reads its latest value and no expired key is
/// readable. Keys whose expiry falls between the clock readings around a
/// check are dropped from both sides (either answer would be right).
fn model_run(mode: Mode, placement: bool, seed: u64) {
    const KEYS: u64 = 400;
    const ROUNDS: usize = 15;
    const OPS: usize = 400;
    let s = store(mode, placement);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut model: HashMap<u64, Entry> = HashMap::new();
    let mut ver = 0u64;
    let ttls_ms = [200u64, 1000, 5000, 60_000];
    for round in 0..ROUNDS {
        for _ in 0..OPS {
            let i = rng.gen_range(0..KEYS);
            let now = now_ms();
            ver += 1;
            let v = value(i, ver, rng.gen_range(20..1500));
            match rng.gen_range(0..10) {
                0..=2 => {
                    s.put(&key(i), &v).unwrap();
                    model.insert(
                        i,
                        Entry {
                            value: v,
                            expiry_ms: 0,
                        },
                    );
                }
                3..=6 => {
                    let at = now + ttls_ms[rng.gen_range(0..ttls_ms.len())];
                    s.put_with(&key(i), &v, ttl(at)).unwrap();
                    model.insert(
                        i,
                        Entry {
                            value: v,
                            expiry_ms: at,
                        },
                    );
                }
                7 => {
                    // KEEPTTL, only where the old expiry is not about to
                    // pass (the store decides it at its own instant).
                    let keep = match model.get(&i) {
                        None => Some(0),
                        Some(e) if e.expiry_ms == 0 || e.expiry_ms > now + 100 => Some(e.expiry_ms),
                        Some(_) => None,
                    };
                    if let Some(expiry_ms) = keep {
                        let opts = PutOptions {
                            expiry: Expiry::Keep,
                            ..Default::default()
                        };
                        s.put_with(&key(i), &v, opts).unwrap();
                        model.insert(
                            i,
                            Entry {
                                value: v,
                                expiry_ms,
                            },
                        );
                    }
                }
                8 => {
                    s.delete(&key(i)).unwrap();
                    model.remove(&i);
                }
                _ => {
                    // EXPIRE later, or PERSIST, on a key not about to expire.
                    if let Some(e) = model.get_mut(&i) {
                        if e.expiry_ms == 0 || e.expiry_ms > now + 100 {
                            let at = (rng.gen_bool(0.3))
                                .then(|| now + ttls_ms[rng.gen_range(0..ttls_ms.len())]);
                            assert!(s.set_expiry(&key(i), at).unwrap());
                            e.expiry_ms = at.unwrap_or(0);
                        }
                    }
                }
            }
        }
        skew_clock_ms(rng.gen_range(0..3000));
        let before = now_ms();
        s.expire_now();
        let mut gone = Vec::new();
        for i in 0..KEYS {
            let got = s.get(&key(i)).unwrap();
            let after = now_ms();
            match model.get(&i) {
                None => assert_eq!(got, None, "seed {seed} round {round}: key {i} was deleted"),
                Some(e) if e.expiry_ms == 0 || e.expiry_ms > after => assert_eq!(
                    got.as_ref(),
                    Some(&e.value),
                    "seed {seed} round {round}: key {i} (expiry {}, now {after}) lost its latest value",
                    e.expiry_ms
                ),
                Some(e) if e.expiry_ms <= before => {
                    assert_eq!(got, None, "seed {seed} round {round}: key {i} expired");
                    gone.push(i);
                }
                Some(_) => {
                    s.delete(&key(i)).unwrap();
                    gone.push(i);
                }
            }
        }
        for i in gone {
            model.remove(&i);
        }
    }
    assert!(
        s.stats().expired_reclaimed > 0,
        "seed {seed}: the passes unlinked expired objects"
    );
}

#[test]
fn model_with_ttls_overwrites_deletes_and_clock_advances() {
    let _c = CLOCK.lock().unwrap_or_else(|e| e.into_inner());
    for (n, mode) in [Mode::Nibble, Mode::Nibble2].into_iter().enumerate() {
        for placement in [true, false] {
            for seed in 0..2u64 {
                model_run(mode, placement, seed * 10 + n as u64);
            }
        }
    }
}

/// Readers read while writers put keys with short TTLs (and overwrite
/// some without one) and the expiry pass frees segments: every read is a
/// whole value of its key or a miss, and every key last written without a
/// TTL keeps that value.
#[test]
fn readers_racing_bulk_expiry_see_whole_values_or_misses() {
    let _c = CLOCK.lock().unwrap_or_else(|e| e.into_inner());
    let run_ms: u64 = std::env::var("NIBBLE_STRESS_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1500);
    const WRITERS: u64 = 2;
    const KEYS_PER_WRITER: u64 = 3000;
    for mode in [Mode::Nibble, Mode::Nibble2] {
        let s = store(mode, true);
        let stop = AtomicBool::new(false);
        let lasts = std::thread::scope(|sc| {
            for r in 0..2u64 {
                let (s, stop) = (&s, &stop);
                sc.spawn(move || {
                    let mut rng = StdRng::seed_from_u64(100 + r);
                    let mut buf = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        let i = rng.gen_range(0..WRITERS * KEYS_PER_WRITER);
                        if s.get_into(&key(i), &mut buf).unwrap().is_some() {
                            assert!(intact(i, &buf), "{mode:?}: key {i} read {buf:?}");
                        }
                    }
                });
            }
            {
                let (s, stop) = (&s, &stop);
                sc.spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        s.expire_now();
                        std::thread::sleep(Duration::from_millis(3));
                    }
                });
            }
            let writers: Vec<_> = (0..WRITERS)
                .map(|w| {
                    let s = &s;
                    sc.spawn(move || {
                        let mut rng = StdRng::seed_from_u64(w);
                        let mut last: HashMap<u64, Option<Vec<u8>>> = HashMap::new();
                        let mut ver = 0;
                        let end = Instant::now() + Duration::from_millis(run_ms);
                        while Instant::now() < end {
                            let i = w * KEYS_PER_WRITER + rng.gen_range(0..KEYS_PER_WRITER);
                            ver += 1;
                            let v = value(i, ver, rng.gen_range(20..600));
                            if rng.gen_range(0..10) == 0 {
                                s.put(&key(i), &v).unwrap();
                                last.insert(i, Some(v));
                            } else {
                                let at = now_ms() + rng.gen_range(20..300);
                                s.put_with(&key(i), &v, ttl(at)).unwrap();
                                last.insert(i, None);
                            }
                        }
                        last
                    })
                })
                .collect();
            let lasts: Vec<_> = writers.into_iter().map(|h| h.join().unwrap()).collect();
            stop.store(true, Ordering::Relaxed);
            lasts
        });
        for last in lasts {
            for (i, v) in last {
                if let Some(v) = v {
                    assert_eq!(s.get(&key(i)).unwrap(), Some(v), "{mode:?}: key {i} lost");
                }
            }
        }
        // Liveness: once every TTL (at most 300 ms) has passed, the pass
        // frees some segment whole. On a loaded machine the writers may
        // have written too little to close a segment of one expiry window
        // while they ran: then a burst of a quarter of the capacity, all
        // expiring together, closes several.
        std::thread::sleep(Duration::from_millis(350));
        s.expire_now();
        if s.stats().expired_segments == 0 {
            let at = now_ms() + 100;
            let v = vec![b'b'; 1000];
            for i in 0..(CAPACITY_BYTES / 4 / 1000) as u64 {
                s.put_with(format!("burst:{i}").as_bytes(), &v, ttl(at))
                    .unwrap();
            }
            std::thread::sleep(Duration::from_millis(150));
        }
        for _ in 0..100 {
            if s.stats().expired_segments > 0 {
                break;
            }
            s.expire_now();
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            s.stats().expired_segments > 0,
            "{mode:?}: no segment expired whole"
        );
    }
}
