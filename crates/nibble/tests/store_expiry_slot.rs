//! The optional expiry slot (`crates/nibble/src/object.rs`): setting a TTL
//! on an object appended without one relocates it. On a full store the
//! relocation may use half the compaction reserve and then waits for
//! compaction; it never loses the object or its TTL silently. Readers
//! racing relocations see whole values and the key never disappears.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nibble::object::now_ms;
use nibble::{Config, Error, Expiry, Mode, PutOptions, Store};

/// A self-checking value: `len` bytes derived from `key` and `seq`, with
/// both in the first 16 bytes.
fn encode(key: u64, seq: u64, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len.max(16));
    v.extend_from_slice(&key.to_le_bytes());
    v.extend_from_slice(&seq.to_le_bytes());
    let mut x = key.wrapping_mul(31).wrapping_add(seq);
    while v.len() < len {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        v.push((x >> 56) as u8);
    }
    v
}

/// Whether `v` is a whole value of `key` (not torn between two writes).
fn whole(key: u64, v: &[u8]) -> bool {
    v.len() >= 16
        && u64::from_le_bytes(v[..8].try_into().unwrap()) == key
        && encode(
            key,
            u64::from_le_bytes(v[8..16].try_into().unwrap()),
            v.len(),
        ) == v
}

/// Fill a store with objects without a TTL until it refuses a write, then
/// EXPIRE some: each call sets the TTL (a relocation, on a full log into at
/// most half the compaction reserve) or reports `OutOfMemory` and
/// leaves the object and its missing TTL as they were. Once deletes leave room, every EXPIRE
/// succeeds. Nothing is lost, and PERSIST needs no space.
#[test]
fn expire_on_a_full_store_relocates_or_reports() {
    for mode in [Mode::Nibble, Mode::Nibble2] {
        let mut cfg = Config::new(16 << 20);
        cfg.mode = mode;
        let s = Store::new(cfg).unwrap();
        let mut n = 0u64;
        let t0 = Instant::now();
        loop {
            match s.put(format!("fill-{n}").as_bytes(), &encode(n, 1, 1000)) {
                Ok(_) => n += 1,
                Err(Error::OutOfMemory { .. }) => break,
                Err(e) => panic!("{e}"),
            }
            assert!(t0.elapsed() < Duration::from_secs(30), "never ran out");
        }
        let later = now_ms() + 3_600_000;
        let mut set = vec![false; n as usize];
        let expire = |i: u64, set: &mut Vec<bool>| match s
            .set_expiry(format!("fill-{i}").as_bytes(), Some(later + i))
        {
            Ok(found) => {
                assert!(found, "{mode:?} key {i}");
                set[i as usize] = true;
                true
            }
            Err(Error::OutOfMemory { .. }) => false,
            Err(e) => panic!("{e}"),
        };
        // Full: the log's segments are all but full of live objects.
        let full_set = (0..200).filter(|&i| expire(i, &mut set)).count();
        // Room made by deletes: every EXPIRE relocates.
        let mut deleted = vec![false; n as usize];
        for i in (200..n).filter(|i| i.is_multiple_of(4)) {
            assert!(s.delete(format!("fill-{i}").as_bytes()).unwrap());
            deleted[i as usize] = true;
        }
        let mut refused = 0;
        for i in (200..n).filter(|&i| !deleted[i as usize]) {
            if !expire(i, &mut set) {
                refused += 1;
            }
        }
        eprintln!(
            "{mode:?}: {n} objects; full store: {full_set} of 200 TTLs set; \
             after deletes: {refused} refused"
        );
        assert_eq!(refused, 0, "{mode:?}: EXPIRE refused with room to compact");
        for i in (0..n).filter(|&i| !deleted[i as usize]) {
            let k = format!("fill-{i}");
            let v = s.get(k.as_bytes()).unwrap().expect("no object is lost");
            assert!(whole(i, &v), "{mode:?} key {i}");
            let m = s.meta(k.as_bytes()).unwrap().unwrap();
            let want = set[i as usize].then_some(later + i);
            assert_eq!(m.expiry_ms, want, "{mode:?} key {i}: TTL as reported");
        }
        // PERSIST writes 0 into the slot in place: it works however full.
        for i in (0..n).filter(|&i| set[i as usize]).take(100) {
            let k = format!("fill-{i}");
            assert!(s.set_expiry(k.as_bytes(), None).unwrap());
            assert_eq!(s.meta(k.as_bytes()).unwrap().unwrap().expiry_ms, None);
        }
        let kept = deleted.iter().filter(|&&d| !d).count() as u64;
        assert_eq!(s.stats().items, kept);
    }
}

/// SET KEEPTTL over a key whose TTL was set after a slotless append: the
/// new object carries the slot and the TTL.
#[test]
fn keepttl_keeps_a_ttl_given_by_relocation() {
    for mode in [Mode::Nibble, Mode::Nibble2] {
        let mut cfg = Config::new(16 << 20);
        cfg.mode = mode;
        let s = Store::new(cfg).unwrap();
        let t = now_ms() + 60_000;
        s.put(b"k", b"value-1").unwrap();
        assert!(s.set_expiry(b"k", Some(t)).unwrap());
        let keep = PutOptions {
            expiry: Expiry::Keep,
            ..Default::default()
        };
        for v in [&b"value-2"[..], b"a longer value 3", b"v4"] {
            s.put_with(b"k", v, keep).unwrap();
            assert_eq!(s.get(b"k").unwrap().as_deref(), Some(v));
            assert_eq!(s.meta(b"k").unwrap().unwrap().expiry_ms, Some(t));
        }
        s.put(b"k", b"plain").unwrap();
        assert_eq!(s.meta(b"k").unwrap().unwrap().expiry_ms, None);
        s.put_with(b"k", b"kept none", keep).unwrap();
        assert_eq!(s.meta(b"k").unwrap().unwrap().expiry_ms, None);
    }
}

fn run_ms() -> u64 {
    std::env::var("NIBBLE_STRESS_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1500)
}

/// One writer rewrites keys without a TTL and then sets and clears their
/// TTLs (a relocation, then an in-place write) while readers copy them and
/// compaction moves them: every read is a whole value, no key is ever
/// missing, and the writer always reads back the TTL it set.
fn relocations_under_readers(mode: Mode) {
    const KEYS: u64 = 300;
    let mut cfg = Config::new(24 << 20);
    cfg.mode = mode;
    cfg.segment_bytes = Some(256 << 10);
    cfg.compaction_trigger_permille = 600;
    let s = Arc::new(Store::new(cfg).unwrap());
    let len = |k: u64, seq: u64| 16 + ((k * 131 + seq * 17) % 3000) as usize;
    for k in 0..KEYS {
        s.put(format!("k{k}").as_bytes(), &encode(k, 0, len(k, 0)))
            .unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|r| {
            let (s, stop) = (s.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let mut reads = 0u64;
                let mut k = r;
                while !stop.load(Ordering::Relaxed) {
                    k = (k + 7) % KEYS;
                    let m = s
                        .get_into(format!("k{k}").as_bytes(), &mut buf)
                        .unwrap()
                        .unwrap_or_else(|| panic!("key {k} missing during a relocation"));
                    assert!(whole(k, &buf), "torn value of key {k}");
                    assert_eq!(m.value_len, buf.len());
                    reads += 1;
                }
                reads
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_millis(run_ms());
    let mut seq = 0u64;
    let mut relocations = 0u64;
    while Instant::now() < deadline {
        seq += 1;
        for k in 0..KEYS {
            let key = format!("k{k}");
            let key = key.as_bytes();
            if (k + seq).is_multiple_of(3) {
                s.put(key, &encode(k, seq, len(k, seq))).unwrap();
            }
            let t = now_ms() + 3_600_000 + seq;
            assert!(s.set_expiry(key, Some(t)).unwrap());
            assert_eq!(s.meta(key).unwrap().unwrap().expiry_ms, Some(t), "TTL lost");
            if (k + seq).is_multiple_of(2) {
                assert!(s.set_expiry(key, None).unwrap());
                assert_eq!(s.meta(key).unwrap().unwrap().expiry_ms, None);
            }
            relocations += 1;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let reads: u64 = readers.into_iter().map(|h| h.join().unwrap()).sum();
    eprintln!("{mode:?}: {relocations} expiry writes, {reads} reads");
    assert!(reads > 0);
    assert_eq!(s.stats().items, KEYS);
}

#[test]
fn relocations_under_readers_nibble() {
    relocations_under_readers(Mode::Nibble);
}

#[test]
fn relocations_under_readers_nibble2() {
    relocations_under_readers(Mode::Nibble2);
}
