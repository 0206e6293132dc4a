//! `Store::read_modify_write`: the one-lookup read, change and in-place
//! write of an item under its bucket lock, in Nibble-2 and (read only,
//! the caller appends) Nibble.
//!
//! Checked here: against a model, every read-modify-write sees the value
//! last stored and leaves the value it asked for (in place, or appended
//! by the caller's conditional `put_with`), keeps flags and TTL, and
//! gives a version above the old one; under concurrency, counters bumped
//! by several threads through it lose no update, and readers copying the
//! same items meanwhile (while compaction relocates them) never see a torn
//! value or a counter going backwards.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nibble::{Condition, Config, Error, Expiry, ItemMeta, Mode, PutOptions, Store};

/// A store small enough that heads roll and compaction runs.
fn small_store(mode: Mode) -> Store {
    let mut cfg = Config::new(24 << 20);
    cfg.mode = mode;
    cfg.segment_bytes = Some(256 << 10);
    cfg.compaction_trigger_permille = 600;
    Store::new(cfg).unwrap()
}

/// The fallback of a write `read_modify_write` did not do in place:
/// `put_with` conditioned on what it read, flags and TTL kept.
fn append_rest(
    s: &Store,
    key: &[u8],
    old: Option<ItemMeta>,
    value: &[u8],
    flags: u32,
) -> Result<u64, Error> {
    let opts = PutOptions {
        condition: old.map_or(Condition::IfAbsent, |m| Condition::IfVersion(m.version)),
        expiry: Expiry::Keep,
        flags: old.map_or(flags, |m| m.flags),
    };
    s.put_with(key, value, opts)
}

fn hour_from_now_ms() -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    now.as_millis() as u64 + 3_600_000
}

/// Random puts, deletes, TTLs and read-modify-writes (grow, shrink, same
/// size, no write) against a map.
#[test]
fn read_modify_write_matches_a_model() {
    for mode in [Mode::Nibble2, Mode::Nibble] {
        let s = small_store(mode);
        let mut model: HashMap<Vec<u8>, (Vec<u8>, u64, u32)> = HashMap::new();
        let mut x = 0x9e37_79b9_u64;
        let mut in_place = 0u64;
        let mut buf = Vec::new();
        for i in 0..40_000u64 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let r = x >> 33;
            let key = format!("k{}", r % 64).into_bytes();
            let op = (r >> 8) % 10;
            match op {
                0 => {
                    let v = vec![b'p'; (r >> 12) as usize % 200];
                    let flags = (r >> 20) as u32 % 3;
                    let ver = s
                        .put_with(
                            &key,
                            &v,
                            PutOptions {
                                flags,
                                ..Default::default()
                            },
                        )
                        .unwrap();
                    model.insert(key, (v, ver, flags));
                }
                1 => {
                    assert_eq!(s.delete(&key).unwrap(), model.remove(&key).is_some());
                }
                2 => {
                    // A TTL an hour away: kept by every write below.
                    let present = s.set_expiry(&key, Some(hour_from_now_ms())).unwrap();
                    assert_eq!(present, model.contains_key(&key));
                }
                _ => {
                    let want = model.get(&key).cloned();
                    let ttl_before = s.meta(&key).unwrap().and_then(|m| m.expiry_ms);
                    let grow = (r >> 12) % 4;
                    let rmw = s
                        .read_modify_write(&key, &mut buf, |old, b| {
                            match (&old, &want) {
                                (None, None) => {}
                                (Some(m), Some((v, ver, flags))) => {
                                    assert_eq!(&b[..], &v[..], "step {i}");
                                    assert_eq!(m.version, *ver);
                                    assert_eq!(m.flags, *flags);
                                }
                                _ => panic!("step {i}: saw {old:?}, model {want:?}"),
                            }
                            match grow {
                                0 => return (None, false),
                                1 => b.push(i as u8),
                                2 => {
                                    b.pop();
                                }
                                _ => {
                                    if let Some(c) = b.first_mut() {
                                        *c = c.wrapping_add(1);
                                    } else {
                                        b.push(1);
                                    }
                                }
                            }
                            (Some(b.clone()), true)
                        })
                        .unwrap();
                    let Some(new) = rmw.out else {
                        assert_eq!(rmw.written, None);
                        continue;
                    };
                    let ver = match rmw.written {
                        Some(v) => {
                            in_place += 1;
                            v
                        }
                        None => append_rest(&s, &key, rmw.old, &new, 0).unwrap(),
                    };
                    if let Some((_, old_ver, _)) = &want {
                        assert!(ver != *old_ver);
                    }
                    let flags = want.as_ref().map_or(0, |w| w.2);
                    let m = s.meta(&key).unwrap().unwrap();
                    assert_eq!((m.version, m.flags), (ver, flags));
                    assert_eq!(m.expiry_ms, ttl_before);
                    model.insert(key, (new, ver, flags));
                }
            }
        }
        for (k, (v, ver, flags)) in &model {
            let mut b = Vec::new();
            let m = s.get_into(k, &mut b).unwrap().unwrap();
            assert_eq!((&b, m.version, m.flags), (v, *ver, *flags));
        }
        match mode {
            Mode::Nibble2 => assert!(in_place > 10_000, "{in_place} in place"),
            Mode::Nibble => assert_eq!(in_place, 0),
        }
    }
}

/// A counter value of fixed size: the count, then bytes derived from
/// it, then a checksum, so a torn copy shows.
fn counter(n: u64) -> Vec<u8> {
    let mut v = n.to_le_bytes().to_vec();
    let mut sum = n;
    for i in 0..48u64 {
        let b = (n.wrapping_mul(13).wrapping_add(i * 7)) as u8;
        sum = sum.wrapping_mul(31).wrapping_add(b as u64);
        v.push(b);
    }
    v.extend_from_slice(&sum.to_le_bytes());
    v
}

fn count_of(v: &[u8]) -> Option<u64> {
    if v.len() != 64 {
        return None;
    }
    let n = u64::from_le_bytes(v[..8].try_into().ok()?);
    (counter(n) == v).then_some(n)
}

/// Bump `key`'s counter by one, in place where the store can, else by a
/// conditional append, retried on a lost race.
fn bump(s: &Store, key: &[u8], buf: &mut Vec<u8>) {
    loop {
        let rmw = s
            .read_modify_write(key, buf, |old, b| {
                let n = old.map_or(Some(0), |_| count_of(b)).expect("torn counter");
                *b = counter(n + 1);
                ((), true)
            })
            .unwrap();
        if rmw.written.is_some() {
            return;
        }
        match append_rest(s, key, rmw.old, buf, 0) {
            Ok(_) => return,
            Err(Error::VersionMismatch { .. } | Error::Exists | Error::NotFound) => continue,
            Err(e) => panic!("{e:?}"),
        }
    }
}

/// Three threads bump the same counters through `read_modify_write`;
/// two readers copy them with `get_into` and check each copy's checksum
/// and that no counter goes backwards; a filler appends garbage so that
/// compaction relocates the counters meanwhile. No bump may be lost.
fn counters_under_concurrency(mode: Mode) {
    const KEYS: u64 = 32;
    let s = Arc::new(small_store(mode));
    let stop = Arc::new(AtomicBool::new(false));
    let deadline = Instant::now() + Duration::from_millis(600);
    let mut writers = Vec::new();
    for w in 0..3u64 {
        let s = s.clone();
        writers.push(std::thread::spawn(move || {
            let mut buf = Vec::new();
            let mut n = 0u64;
            let mut x = w + 1;
            while Instant::now() < deadline {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                bump(&s, format!("c{}", (x >> 33) % KEYS).as_bytes(), &mut buf);
                n += 1;
            }
            n
        }));
    }
    let mut others = Vec::new();
    for r in 0..2u64 {
        let (s, stop) = (s.clone(), stop.clone());
        others.push(std::thread::spawn(move || {
            let mut seen = vec![0u64; KEYS as usize];
            let mut buf = Vec::new();
            let mut i = r;
            while !stop.load(Ordering::Relaxed) {
                let k = (i % KEYS) as usize;
                i += 1;
                if s.get_into(format!("c{k}").as_bytes(), &mut buf)
                    .unwrap()
                    .is_some()
                {
                    let n = count_of(&buf).expect("torn read");
                    assert!(n >= seen[k], "counter c{k} went back: {n} < {}", seen[k]);
                    seen[k] = n;
                }
            }
        }));
    }
    {
        let (s, stop) = (s.clone(), stop.clone());
        others.push(std::thread::spawn(move || {
            let v = vec![7u8; 900];
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                s.put(format!("f{}", i % 4000).as_bytes(), &v).unwrap();
                i += 1;
            }
        }));
    }
    let total: u64 = writers.into_iter().map(|h| h.join().unwrap()).sum();
    stop.store(true, Ordering::Relaxed);
    for h in others {
        h.join().unwrap();
    }
    let mut buf = Vec::new();
    let mut sum = 0;
    for k in 0..KEYS {
        if s.get_into(format!("c{k}").as_bytes(), &mut buf)
            .unwrap()
            .is_some()
        {
            sum += count_of(&buf).unwrap();
        }
    }
    assert_eq!(sum, total, "bumps lost");
    assert!(total > 1000, "only {total} bumps");
}

#[test]
fn rmw_counters_nibble2() {
    counters_under_concurrency(Mode::Nibble2);
}

#[test]
fn rmw_counters_nibble() {
    counters_under_concurrency(Mode::Nibble);
}

/// An oversized key is refused, as by a put.
#[test]
fn rmw_bad_key() {
    let s = small_store(Mode::Nibble2);
    let key = vec![b'k'; nibble::MAX_KEY_BYTES + 1];
    let r = s.read_modify_write(&key, &mut Vec::new(), |_, _| ((), true));
    assert!(matches!(r, Err(Error::BadKey { .. })));
}
