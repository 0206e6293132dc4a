//! Damaged files of a stopped store (issue 25's adversarial run, in
//! process): a flipped byte in a value, random bit flips in the index, the
//! log and the meta segment, truncated, sparse and overlong files. What
//! must hold: no damaged byte is served (a read of a damaged key is an
//! error naming it), no garbage key appears, every intact key reads back
//! its value, and a short file is refused with a message naming it and
//! its sizes, never a SIGBUS.

use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use nibblejmp::{Error, SharedStore};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

mod common;

use common::{quiet, TempDir};

/// The SpaceJMP header page in front of every segment file's data.
const SEG_HEADER_BYTES: u64 = 4096;
/// Keys the damage tests write.
const KEYS: usize = 2000;

fn seg_file(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("seg.{name}"))
}

fn key(i: usize) -> Vec<u8> {
    format!("key:{i:05}").into_bytes()
}

fn value(i: usize) -> Vec<u8> {
    format!("value-{i:05}-{}", "v".repeat(20 + i % 50)).into_bytes()
}

/// A closed store with `KEYS` keys; the model of its contents.
fn filled(tag: &str) -> (TempDir, HashMap<Vec<u8>, Vec<u8>>) {
    let d = TempDir::new(tag);
    let s = SharedStore::create(&d.0, 16 << 20, &quiet()).unwrap();
    let mut m = HashMap::new();
    for i in 0..KEYS {
        s.put(&key(i), &value(i)).unwrap();
        m.insert(key(i), value(i));
    }
    // Some overwrites and deletes, so the log holds dead objects too.
    for i in (0..KEYS).step_by(7) {
        let v = format!("second-{i}").into_bytes();
        s.put(&key(i), &v).unwrap();
        m.insert(key(i), v);
    }
    for i in (0..KEYS).step_by(11) {
        s.delete(&key(i)).unwrap();
        m.remove(&key(i));
    }
    s.close().unwrap();
    (d, m)
}

fn flip_bits(path: &Path, from: u64, to: u64, n: usize, rng: &mut StdRng) {
    let mut b = std::fs::read(path).unwrap();
    for _ in 0..n {
        let at = rng.gen_range(from..to) as usize;
        b[at] ^= 1 << rng.gen_range(0..8);
    }
    std::fs::write(path, b).unwrap();
}

/// Read every model key: none may return another value; returns (intact,
/// reported damaged, absent). Checks that no key outside the model exists.
fn audit(s: &SharedStore, m: &HashMap<Vec<u8>, Vec<u8>>) -> (usize, usize, usize) {
    let (mut ok, mut damaged, mut absent) = (0, 0, 0);
    for (k, v) in m {
        match s.get(k) {
            Ok(Some(got)) => {
                assert_eq!(
                    &got,
                    v,
                    "key {:?} served a wrong value",
                    String::from_utf8_lossy(k)
                );
                ok += 1;
            }
            Ok(None) => absent += 1,
            Err(Error::Damaged { .. }) => damaged += 1,
            Err(e) => panic!("unexpected error {e}"),
        }
    }
    for k in s.keys().unwrap() {
        assert!(
            m.contains_key(&k),
            "garbage key {:?}",
            String::from_utf8_lossy(&k)
        );
    }
    (ok, damaged, absent)
}

#[test]
fn a_flipped_value_byte_is_refused_never_served() {
    let (d, m) = filled("flip1");
    let log = seg_file(&d.0, "log");
    let mut b = std::fs::read(&log).unwrap();
    let victim = value(43);
    let at = b
        .windows(victim.len())
        .position(|w| w == &victim[..])
        .expect("the value is in the log");
    b[at + 8] ^= 0x20;
    std::fs::write(&log, b).unwrap();

    let s = SharedStore::attach(&d.0, &quiet()).unwrap();
    assert!(!s.recovery_report().ran, "a clean shutdown: no log scan");
    let e = s.get(&key(43)).unwrap_err();
    assert!(matches!(e, Error::Damaged { .. }), "{e}");
    assert!(e.to_string().contains("key:00043"), "{e}");
    assert!(s.meta(&key(43)).is_err());
    assert!(s.stats().damaged_objects >= 1);
    let mut others = m.clone();
    others.remove(&key(43));
    assert_eq!(audit(&s, &others), (others.len(), 0, 0));
    // The damaged object is not listed by SCAN either.
    assert!(!s.keys().unwrap().contains(&key(43)));
    s.close().unwrap();
    let clean_copy = TempDir::new("flip1-copy");
    copy_dir(&d.0, &clean_copy.0);

    // A rebuild from the log leaves it out and keeps every other key.
    let s = common::attach_rebuilt(&d.0, quiet());
    let r = s.recovery_report().clone();
    assert_eq!(r.damaged_objects, 1, "{r:?}");
    assert_eq!(s.get(&key(43)).unwrap(), None);
    assert_eq!(audit(&s, &others), (others.len(), 0, 0));
    s.close().unwrap();

    // FLUSHALL removes the damaged entry too (it cannot be named).
    let s = SharedStore::attach(&clean_copy.0, &quiet()).unwrap();
    assert!(!s.recovery_report().ran);
    s.flush().unwrap();
    assert_eq!(s.get(&key(43)).unwrap(), None);
    assert_eq!(s.len(), 0);
    s.close().unwrap();
}

#[test]
fn index_bit_flips_make_attach_rebuild_and_lose_nothing() {
    let (d, m) = filled("flipidx");
    let idx = seg_file(&d.0, "index");
    let len = std::fs::metadata(&idx).unwrap().len();
    let mut rng = StdRng::seed_from_u64(25);
    flip_bits(&idx, SEG_HEADER_BYTES, len, 1000, &mut rng);
    let s = SharedStore::attach(&d.0, &quiet()).unwrap();
    let r = s.recovery_report().clone();
    assert!(r.index_seal_bad && r.rebuilt, "{r:?}");
    assert_eq!(audit(&s, &m), (m.len(), 0, 0), "{r:?}");
    assert_eq!(s.len(), m.len() as u64);
    s.close().unwrap();
    // And the next clean attach trusts the rebuilt index.
    let s = SharedStore::attach(&d.0, &quiet()).unwrap();
    assert!(!s.recovery_report().ran);
    assert_eq!(audit(&s, &m), (m.len(), 0, 0));
    s.close().unwrap();
}

#[test]
fn log_bit_flips_never_serve_a_wrong_value_or_a_garbage_key() {
    for seed in 0..3u64 {
        let (d, m) = filled("fliplog");
        let log = seg_file(&d.0, "log");
        // Flip inside the part of the log that holds objects (the store
        // is mostly empty: aim at the used segments).
        let used = {
            let s = SharedStore::attach(&d.0, &quiet()).unwrap();
            let g = s.geometry();
            let segs = g.log_segments - s.stats().segments_free;
            s.close().unwrap();
            segs * g.seg_bytes
        };
        let b = std::fs::read(&log).unwrap();
        let end = SEG_HEADER_BYTES
            + b[SEG_HEADER_BYTES as usize..]
                .iter()
                .rposition(|&x| x != 0)
                .unwrap_or(0) as u64
            + 1;
        drop(b);
        assert!(end - SEG_HEADER_BYTES <= used + (1 << 20));
        let mut rng = StdRng::seed_from_u64(seed);
        flip_bits(&log, SEG_HEADER_BYTES, end, 1000, &mut rng);

        // Clean attach: the index is trusted, reads check each object.
        let s = SharedStore::attach(&d.0, &quiet()).unwrap();
        let (ok, damaged, absent) = audit(&s, &m);
        assert!(damaged > 0, "1000 flips hit some object");
        assert!(ok > m.len() / 2, "{ok} {damaged} {absent}");
        s.close().unwrap();

        // A rebuild from the damaged log: no wrong value, no garbage key.
        let s = common::attach_rebuilt(&d.0, quiet());
        let r = s.recovery_report().clone();
        let (ok2, damaged2, _) = audit(&s, &m);
        assert_eq!(damaged2, 0, "a rebuilt index names no damaged object");
        assert!(r.damaged_objects > 0, "{r:?}");
        // Keys a read reported damaged are the ones the rebuild lost; the
        // walk gets past damage, so intact keys survive (but for the odd
        // flipped COMMITTED or DEAD bit, which no checksum covers).
        assert!(ok2 + 3 >= ok, "{ok2} {ok} {r:?}");
        s.close().unwrap();
    }
}

#[test]
fn meta_bit_flips_are_refused_or_recovered() {
    let mut rederived = 0;
    for seed in 0..6u64 {
        let (d, m) = filled("flipmeta");
        let meta = seg_file(&d.0, "meta");
        let len = std::fs::metadata(&meta).unwrap().len();
        let mut rng = StdRng::seed_from_u64(seed);
        // Past the geometry words (whose damage is refused, checked below).
        flip_bits(&meta, SEG_HEADER_BYTES + 64, len, 200, &mut rng);
        match SharedStore::attach(&d.0, &quiet()) {
            Ok(s) => {
                rederived += u32::from(s.recovery_report().meta_seal_bad);
                assert_eq!(audit(&s, &m), (m.len(), 0, 0), "seed {seed}");
                s.close().unwrap();
            }
            // A flip in the geometry checksum word is refused, clearly.
            Err(e) => assert!(e.to_string().contains("geometry"), "seed {seed}: {e}"),
        }
    }
    assert!(rederived > 0, "the meta seal path ran");
    // Everything after the meta header (lease, slots, heads, counters,
    // the whole segment table) zeroed: re-derived from the log.
    let (d, m) = filled("zerometa");
    let meta = seg_file(&d.0, "meta");
    let mut b = std::fs::read(&meta).unwrap();
    let meta_header_bytes = 192;
    b[SEG_HEADER_BYTES as usize + meta_header_bytes..].fill(0);
    std::fs::write(&meta, b).unwrap();
    let s = SharedStore::attach(&d.0, &quiet()).unwrap();
    let r = s.recovery_report().clone();
    assert!(r.meta_seal_bad && r.rebuilt, "{r:?}");
    assert_eq!(audit(&s, &m), (m.len(), 0, 0));
    // Writes and compaction work on the re-derived segment table.
    for i in 0..KEYS {
        s.put(&key(i), b"new").unwrap();
    }
    s.compact_now().unwrap();
    assert_eq!(s.get(&key(5)).unwrap().as_deref(), Some(&b"new"[..]));
    assert_eq!(s.len(), KEYS as u64);
    s.close().unwrap();
    let (d, _) = filled("flipgeo");
    let meta = seg_file(&d.0, "meta");
    let mut b = std::fs::read(&meta).unwrap();
    b[SEG_HEADER_BYTES as usize + 24] ^= 1; // seg_bytes
    std::fs::write(&meta, b).unwrap();
    let e = SharedStore::attach(&d.0, &quiet())
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("does not hold a nibblejmp store"), "{e}");
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

#[test]
fn truncated_files_are_refused_with_their_sizes() {
    let (d, m) = filled("trunc");
    for name in ["meta", "index", "log"] {
        let full = std::fs::metadata(seg_file(&d.0, name)).unwrap().len();
        for size in [0, 100, SEG_HEADER_BYTES, full / 2, full - 1] {
            let c = TempDir::new("trunc-copy");
            copy_dir(&d.0, &c.0);
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(seg_file(&c.0, name))
                .unwrap();
            f.set_len(size).unwrap();
            drop(f);
            let e = match SharedStore::attach(&c.0, &quiet()) {
                Ok(_) => panic!("seg.{name} truncated to {size} attached"),
                Err(e) => e.to_string(),
            };
            assert!(
                e.contains(&format!("seg.{name}"))
                    && e.contains(&format!("is {size} bytes"))
                    && e.contains(&full.to_string()),
                "{e}"
            );
        }
    }
    // The original is untouched and still attaches.
    let s = SharedStore::attach(&d.0, &quiet()).unwrap();
    assert_eq!(audit(&s, &m), (m.len(), 0, 0));
    s.close().unwrap();
}

#[test]
fn sparse_and_overlong_files_attach() {
    let (d, m) = filled("sparse");
    // A hole punched in the log's unused tail, and one in the index: the
    // blocks are reserved again at attach (no SIGBUS on a later write).
    let log = seg_file(&d.0, "log");
    let len = std::fs::metadata(&log).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&log).unwrap();
    let hole = 1 << 20;
    // SAFETY: a valid descriptor; punches a page-aligned range in the file.
    let r = unsafe {
        libc::fallocate(
            f.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            (len - hole) as libc::off_t,
            hole as libc::off_t,
        )
    };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
    drop(f);
    let blocks = |p: &Path| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(p).unwrap().blocks() * 512
    };
    assert!(blocks(&log) < len);
    let s = SharedStore::attach(&d.0, &quiet()).unwrap();
    assert!(blocks(&log) >= len, "holes filled at attach");
    assert_eq!(audit(&s, &m), (m.len(), 0, 0));
    s.close().unwrap();
    // Longer than recorded: the extra bytes are ignored.
    let f = std::fs::OpenOptions::new().write(true).open(&log).unwrap();
    f.set_len(len + (1 << 20)).unwrap();
    drop(f);
    let s = SharedStore::attach(&d.0, &quiet()).unwrap();
    assert_eq!(audit(&s, &m), (m.len(), 0, 0));
    s.close().unwrap();
}

#[test]
fn a_store_of_an_older_layout_is_refused() {
    let (d, _) = filled("oldlayout");
    let meta = seg_file(&d.0, "meta");
    let mut b = std::fs::read(&meta).unwrap();
    b[SEG_HEADER_BYTES as usize + 8] = 2; // layout_version 2
    std::fs::write(&meta, b).unwrap();
    let e = SharedStore::attach(&d.0, &quiet()).err().unwrap();
    assert!(
        matches!(
            e,
            Error::WrongVersion {
                found: 2,
                expected: 3,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn compaction_drops_damaged_objects_and_quarantines_unparseable_segments() {
    let d = TempDir::new("compact");
    let s = SharedStore::create(&d.0, 16 << 20, &quiet()).unwrap();
    for i in 0..KEYS {
        s.put(&key(i), &value(i)).unwrap();
    }
    // Filler after them, so the segments holding them are closed.
    let filler = |i: usize| format!("filler:{i}").into_bytes();
    for i in 0..3000 {
        s.put(&filler(i), &[b'f'; 2048]).unwrap();
    }
    s.close().unwrap();
    let log = seg_file(&d.0, "log");
    let mut b = std::fs::read(&log).unwrap();
    let find = |b: &[u8], v: &[u8]| b.windows(v.len()).position(|w| w == v).unwrap();
    // Key 43: a value byte (the object parses, its checksum fails).
    let at = find(&b, &value(43));
    b[at + 8] ^= 0x20;
    // Key 77: its object's magic (the state word's top two bytes, 32
    // bytes of prefix before the key): nothing parses there.
    let at = find(&b, &key(77));
    b[at - 32 + 7] ^= 0xFF;
    std::fs::write(&log, b).unwrap();

    let s = SharedStore::attach(&d.0, &quiet()).unwrap();
    let keep: Vec<usize> = (100..110).chain([43, 77]).collect();
    for i in 0..KEYS {
        if !keep.contains(&i) {
            s.delete(&key(i)).unwrap();
        }
    }
    for i in 0..3000 {
        s.delete(&filler(i)).unwrap();
    }
    let before = s.stats().damaged_objects;
    assert!(s.compact_now().unwrap() > 0);
    // The damaged object was dropped, not moved: the key is gone. The
    // store's own compaction thread may hold key 43's segment in a pass
    // of its own while `compact_now` runs; the key goes when that pass
    // ends, so allow a few more passes.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while matches!(s.get(&key(43)), Err(Error::Damaged { .. }))
        && std::time::Instant::now() < deadline
    {
        s.compact_now().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(s.get(&key(43)).unwrap(), None);
    // The unparseable one is still named by the index: reads report it.
    assert!(matches!(s.get(&key(77)), Err(Error::Damaged { .. })));
    for i in 100..110 {
        assert_eq!(s.get(&key(i)).unwrap(), Some(value(i)));
    }
    let st = s.stats();
    assert!(st.damaged_objects >= before + 2, "{st:?}");
    // Its segment is quarantined (CLOSED, never a victim) until a rebuild.
    assert_eq!(st.segments_quarantined, 1, "{st:?}");
    assert!(s.compact_now().is_ok());
    assert!(matches!(s.get(&key(77)), Err(Error::Damaged { .. })));
    s.close().unwrap();

    let s = common::attach_rebuilt(&d.0, quiet());
    assert_eq!(s.stats().segments_quarantined, 0);
    assert_eq!(s.get(&key(77)).unwrap(), None);
    for i in 100..110 {
        assert_eq!(s.get(&key(i)).unwrap(), Some(value(i)));
    }
    assert!(s.compact_now().is_ok());
    for i in 100..110 {
        assert_eq!(s.get(&key(i)).unwrap(), Some(value(i)));
    }
    assert_eq!(s.len(), 10);
    s.close().unwrap();
}
