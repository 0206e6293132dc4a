//! The server-facing operations (`put_with` with conditions, expiry and
//! flags; `get_into`, `meta`, `delete_if`, `set_expiry`, `scan`, `len`,
//! `flush`) against a model, with close / re-attach and an index rebuild
//! from the log in the mix: metadata (version, flags, expiry) must survive
//! both, versions must grow per key, and expired items must be invisible
//! at once and reclaimed by compaction.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use nibblejmp::{Condition, Error, Expiry, Options, PutOptions, SharedStore};
use proptest::prelude::*;

mod common;

use common::{attach_rebuilt, quiet, TempDir};

fn now_ms() -> u64 {
    nibble::object::now_ms()
}

/// An expiry far in the future or already past (so the test does not
/// depend on timing).
#[derive(Clone, Copy, Debug)]
enum When {
    Future,
    Past,
}

impl When {
    fn at(self) -> u64 {
        match self {
            When::Future => now_ms() + 3_600_000,
            When::Past => now_ms() - 1_000,
        }
    }
}

#[derive(Clone, Debug)]
enum CondKind {
    Always,
    IfAbsent,
    IfPresent,
    /// The model's current version (must succeed if live).
    IfVersionRight,
    /// A wrong version.
    IfVersionWrong,
}

#[derive(Clone, Debug)]
enum ExpKind {
    Never,
    At(When),
    Keep,
}

#[derive(Clone, Debug)]
enum Op {
    Put {
        k: u8,
        v: Vec<u8>,
        cond: CondKind,
        exp: ExpKind,
        flags: u32,
    },
    Get(u8),
    Delete(u8),
    DeleteIf(u8, CondKind),
    SetExpiry(u8, Option<When>),
    ScanAll(usize),
    Reattach,
    Compact,
}

fn cond_kind() -> impl Strategy<Value = CondKind> {
    prop_oneof![
        Just(CondKind::Always),
        Just(CondKind::IfAbsent),
        Just(CondKind::IfPresent),
        Just(CondKind::IfVersionRight),
        Just(CondKind::IfVersionWrong),
    ]
}

fn when() -> impl Strategy<Value = When> {
    prop_oneof![3 => Just(When::Future), 1 => Just(When::Past)]
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0u8..12;
    prop_oneof![
        8 => (key.clone(), prop::collection::vec(any::<u8>(), 0..300), cond_kind(),
              prop_oneof![Just(ExpKind::Never), when().prop_map(ExpKind::At), Just(ExpKind::Keep)],
              prop_oneof![Just(0u32), any::<u32>()])
            .prop_map(|(k, v, cond, exp, flags)| Op::Put { k, v, cond, exp, flags }),
        4 => key.clone().prop_map(Op::Get),
        2 => key.clone().prop_map(Op::Delete),
        2 => (key.clone(), cond_kind()).prop_map(|(k, c)| Op::DeleteIf(k, c)),
        2 => (key, prop::option::of(when())).prop_map(|(k, w)| Op::SetExpiry(k, w)),
        1 => (1usize..20).prop_map(Op::ScanAll),
        1 => Just(Op::Reattach),
        1 => Just(Op::Compact),
    ]
}

/// What the model knows of an indexed key (live or expired, not yet
/// removed).
#[derive(Clone, Debug)]
struct Item {
    value: Vec<u8>,
    version: u64,
    flags: u32,
    expiry: Option<u64>,
}

impl Item {
    fn live(&self) -> bool {
        self.expiry.is_none_or(|t| t > now_ms())
    }
}

fn key(k: u8) -> Vec<u8> {
    format!("key-{k}").into_bytes()
}

/// Check every key of the model against the store (values and metadata).
fn check_all(s: &SharedStore, model: &BTreeMap<u8, Item>) {
    let mut buf = Vec::new();
    for k in 0..12u8 {
        let got = s.get_into(&key(k), &mut buf).unwrap();
        match model.get(&k).filter(|i| i.live()) {
            Some(i) => {
                let m = got.unwrap_or_else(|| panic!("key {k} missing"));
                assert_eq!(buf, i.value, "key {k}");
                assert_eq!(m.version, i.version, "key {k} version");
                assert_eq!(m.flags, i.flags, "key {k} flags");
                assert_eq!(m.expiry_ms, i.expiry, "key {k} expiry");
                assert_eq!(m.value_len, i.value.len());
                assert_eq!(s.meta(&key(k)).unwrap(), Some(m));
            }
            None => {
                assert_eq!(got, None, "key {k} should be absent");
                assert!(buf.is_empty());
                assert_eq!(s.meta(&key(k)).unwrap(), None);
            }
        }
    }
}

fn resolve_cond(c: &CondKind, cur: Option<&Item>) -> Condition {
    match c {
        CondKind::Always => Condition::Always,
        CondKind::IfAbsent => Condition::IfAbsent,
        CondKind::IfPresent => Condition::IfPresent,
        CondKind::IfVersionRight => Condition::IfVersion(cur.map_or(12345, |i| i.version)),
        CondKind::IfVersionWrong => Condition::IfVersion(cur.map_or(1, |i| i.version + 7)),
    }
}

/// The expected outcome of a condition on the live item.
fn expect_cond(c: Condition, live: Option<&Item>) -> Result<(), &'static str> {
    match (c, live) {
        (Condition::Always, _) | (Condition::IfAbsent, None) | (Condition::IfPresent, Some(_)) => {
            Ok(())
        }
        (Condition::IfAbsent, Some(_)) => Err("exists"),
        (Condition::IfPresent | Condition::IfVersion(_), None) => Err("notfound"),
        (Condition::IfVersion(v), Some(i)) if i.version == v => Ok(()),
        (Condition::IfVersion(_), Some(_)) => Err("mismatch"),
    }
}

fn err_kind(e: &Error) -> &'static str {
    match e {
        Error::KeyExists => "exists",
        Error::KeyNotFound => "notfound",
        Error::VersionMismatch { .. } => "mismatch",
        e => panic!("unexpected error {e}"),
    }
}

fn run(ops: Vec<Op>) {
    let d = TempDir::new("ops");
    let mut s = SharedStore::create(&d.0, 8 << 20, &quiet()).unwrap();
    // Indexed items (live or expired-but-not-removed), and the last
    // version each key ever had (versions never go back).
    let mut model: BTreeMap<u8, Item> = BTreeMap::new();
    let mut last_version: BTreeMap<u8, u64> = BTreeMap::new();
    for op in ops {
        match op {
            Op::Put {
                k,
                v,
                cond,
                exp,
                flags,
            } => {
                let live = model.get(&k).filter(|i| i.live()).cloned();
                let c = resolve_cond(&cond, live.as_ref());
                let (expiry, want_exp) = match exp {
                    ExpKind::Never => (Expiry::Never, None),
                    ExpKind::At(w) => {
                        let t = w.at();
                        (Expiry::At(t), Some(t))
                    }
                    ExpKind::Keep => (Expiry::Keep, live.as_ref().and_then(|i| i.expiry)),
                };
                let r = s.put_with(
                    &key(k),
                    &v,
                    PutOptions {
                        condition: c,
                        expiry,
                        flags,
                    },
                );
                match (r, expect_cond(c, live.as_ref())) {
                    (Ok(ver), Ok(())) => {
                        if let Some(&last) = last_version.get(&k) {
                            assert!(ver > last, "version {ver} not above {last}");
                        }
                        last_version.insert(k, ver);
                        model.insert(
                            k,
                            Item {
                                value: v,
                                version: ver,
                                flags,
                                expiry: want_exp,
                            },
                        );
                    }
                    (Err(e), Err(want)) => {
                        assert_eq!(err_kind(&e), want);
                        if let (Error::VersionMismatch { current }, Some(i)) = (&e, &live) {
                            assert_eq!(*current, i.version);
                        }
                    }
                    (r, want) => panic!("put {k} {c:?}: got {r:?}, expected {want:?}"),
                }
            }
            Op::Get(k) => {
                let got = s.get(&key(k)).unwrap();
                let want = model.get(&k).filter(|i| i.live()).map(|i| i.value.clone());
                assert_eq!(got, want, "get {k}");
            }
            Op::Delete(k) => {
                let live = model.get(&k).is_some_and(|i| i.live());
                assert_eq!(s.delete(&key(k)).unwrap(), live, "delete {k}");
                model.remove(&k);
            }
            Op::DeleteIf(k, cond) => {
                let live = model.get(&k).filter(|i| i.live()).cloned();
                let c = resolve_cond(&cond, live.as_ref());
                let r = s.delete_if(&key(k), c);
                match (r, expect_cond(c, live.as_ref())) {
                    (Ok(()), Ok(())) => {
                        model.remove(&k);
                    }
                    (Err(e), Err(want)) => {
                        assert_eq!(err_kind(&e), want, "delete_if {k} {c:?}");
                        // An expired item is removed either way.
                        if live.is_none() {
                            model.remove(&k);
                        }
                    }
                    // Condition met on a live item except it is absent:
                    (Err(Error::KeyNotFound), Ok(())) if live.is_none() => {
                        model.remove(&k);
                    }
                    (r, want) => panic!("delete_if {k} {c:?}: got {r:?}, expected {want:?}"),
                }
            }
            Op::SetExpiry(k, w) => {
                let t = w.map(When::at);
                let live = model.get(&k).is_some_and(|i| i.live());
                assert_eq!(s.set_expiry(&key(k), t).unwrap(), live, "set_expiry {k}");
                if live {
                    let i = model.get_mut(&k).unwrap();
                    i.expiry = t;
                }
            }
            Op::ScanAll(count) => {
                let seen = walk(&s, count);
                let want: BTreeSet<Vec<u8>> = model
                    .iter()
                    .filter(|(_, i)| i.live())
                    .map(|(k, _)| key(*k))
                    .collect();
                assert_eq!(seen, want);
            }
            Op::Reattach => {
                s.close().unwrap();
                s = SharedStore::attach(&d.0, &quiet()).unwrap();
            }
            Op::Compact => {
                s.compact_now().unwrap();
            }
        }
        let live = model.values().filter(|i| i.live()).count() as u64;
        let len = s.len();
        assert!(
            (live..=model.len() as u64).contains(&len),
            "len {len} outside {live}..={}",
            model.len()
        );
    }
    check_all(&s, &model);
    s.close().unwrap();
    // An index rebuilt from the log serves the same items, metadata
    // included (the log's headers keep version, flags and expiry).
    let s = attach_rebuilt(&d.0, quiet());
    check_all(&s, &model);
    assert_eq!(
        s.flush().unwrap(),
        model.values().filter(|i| i.live()).count() as u64
    );
    assert_eq!(walk(&s, 100), BTreeSet::new());
    assert_eq!(s.len(), 0);
    s.close().unwrap();
}

/// Every key of a full cursor walk.
fn walk(s: &SharedStore, count: usize) -> BTreeSet<Vec<u8>> {
    let mut seen = BTreeSet::new();
    let mut cursor = 0;
    loop {
        let (next, keys) = s.scan(cursor, count).unwrap();
        for k in keys {
            assert!(seen.insert(k), "a key twice in one quiet walk");
        }
        if next == 0 {
            return seen;
        }
        cursor = next;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn ops_match_a_model(ops in prop::collection::vec(op(), 1..120)) {
        run(ops);
    }
}

#[test]
fn cas_loop_from_threads_loses_no_increment() {
    // The server's INCR: read value and version, write IfVersion, retry.
    let d = TempDir::new("cas");
    let s = SharedStore::create(&d.0, 8 << 20, &quiet()).unwrap();
    const THREADS: u64 = 3;
    const INCRS_PER_THREAD: u64 = 400;
    std::thread::scope(|sc| {
        for _ in 0..THREADS {
            sc.spawn(|| {
                let mut buf = Vec::new();
                for _ in 0..INCRS_PER_THREAD {
                    loop {
                        let m = s.get_into(b"ctr", &mut buf).unwrap();
                        let n: u64 = if m.is_some() {
                            std::str::from_utf8(&buf).unwrap().parse().unwrap()
                        } else {
                            0
                        };
                        let cond =
                            m.map_or(Condition::IfAbsent, |m| Condition::IfVersion(m.version));
                        let opts = PutOptions {
                            condition: cond,
                            expiry: Expiry::Keep,
                            flags: 0,
                        };
                        match s.put_with(b"ctr", (n + 1).to_string().as_bytes(), opts) {
                            Ok(_) => break,
                            Err(Error::VersionMismatch { .. } | Error::KeyExists) => continue,
                            Err(e) => panic!("{e}"),
                        }
                    }
                }
            });
        }
    });
    assert_eq!(
        s.get(b"ctr").unwrap().as_deref(),
        Some((THREADS * INCRS_PER_THREAD).to_string().as_bytes())
    );
    s.close().unwrap();
}

#[test]
fn expired_items_vanish_at_once_and_compaction_reclaims_them() {
    let d = TempDir::new("expiry");
    let s = SharedStore::create(&d.0, 16 << 20, &quiet()).unwrap();
    let value = vec![7u8; 1000];
    const KEYS: usize = 3000;
    let at = now_ms() + 300;
    for i in 0..KEYS {
        let opts = PutOptions {
            expiry: Expiry::At(at),
            ..PutOptions::default()
        };
        s.put_with(format!("t{i}").as_bytes(), &value, opts)
            .unwrap();
    }
    s.put(b"stays", b"here").unwrap();
    assert_eq!(s.len(), KEYS as u64 + 1);
    let live_before = s.stats().live_bytes;
    std::thread::sleep(Duration::from_millis(400));
    // Invisible at once, before any compaction.
    assert_eq!(s.get(b"t0").unwrap(), None);
    assert_eq!(s.meta(b"t1").unwrap(), None);
    assert!(!s.set_expiry(b"t2", None).unwrap());
    let (next, keys) = s.scan(0, 100_000).unwrap();
    assert_eq!((next, keys), (0, vec![b"stays".to_vec()]));
    // Fill a head's segment so the expired ones are all in closed segments,
    // then compact: the expired objects are dropped, not moved.
    let n = s.compact_now().unwrap();
    assert!(n > 0, "segments with expired objects must be compacted");
    let st = s.stats();
    assert!(
        st.expired_reclaimed as usize > KEYS / 2,
        "reclaimed {} of {KEYS}",
        st.expired_reclaimed
    );
    assert!(
        st.live_bytes < live_before / 2,
        "{} vs {live_before}",
        st.live_bytes
    );
    assert!(s.len() < KEYS as u64 / 2);
    assert_eq!(s.get(b"stays").unwrap().as_deref(), Some(&b"here"[..]));
    s.close().unwrap();
}

/// Mark the store unclean, as the death of its last process leaves it.
fn mark_unclean(dir: &std::path::Path) {
    let meta = spacejmp::segment::seg_path(dir, "meta");
    let mut mb = std::fs::read(&meta).unwrap();
    let clean_off = 4096 + 8 * 8; // header page + MetaHeader::clean
    mb[clean_off..clean_off + 8].copy_from_slice(&0u64.to_le_bytes());
    std::fs::write(&meta, &mb).unwrap();
}

#[test]
fn recovery_and_rebuild_keep_metadata_and_recount() {
    let d = TempDir::new("meta");
    let s = SharedStore::create(&d.0, 8 << 20, &quiet()).unwrap();
    let at = now_ms() + 3_600_000;
    let v1 = s
        .put_with(
            b"a",
            b"1",
            PutOptions {
                expiry: Expiry::At(at),
                flags: 42,
                ..PutOptions::default()
            },
        )
        .unwrap();
    assert!(s.set_expiry(b"a", Some(at + 1)).unwrap());
    let v2 = s.put_with(b"b", b"2", PutOptions::default()).unwrap();
    s.put(b"c", b"3").unwrap();
    assert!(s.delete(b"c").unwrap());
    s.close().unwrap();
    for rebuild in [false, true] {
        mark_unclean(&d.0);
        let s = SharedStore::attach(&d.0, &Options { rebuild, ..quiet() }).unwrap();
        let r = s.recovery_report();
        assert!(r.ran && r.unclean && r.rebuilt == rebuild, "{r:?}");
        let m = s.meta(b"a").unwrap().unwrap();
        assert_eq!((m.version, m.flags, m.expiry_ms), (v1, 42, Some(at + 1)));
        assert_eq!(s.meta(b"b").unwrap().unwrap().version, v2);
        assert_eq!(s.get(b"c").unwrap(), None);
        assert_eq!(s.len(), 2);
        s.close().unwrap();
    }
    // A later write of the key gets a larger version than before.
    let s = SharedStore::attach(&d.0, &quiet()).unwrap();
    let v3 = s.put_with(b"a", b"x", PutOptions::default()).unwrap();
    assert!(v3 > v1);
    s.close().unwrap();
}

#[test]
fn recovery_catches_an_entry_that_names_nothing() {
    let d = TempDir::new("badentry");
    let s = SharedStore::create(&d.0, 8 << 20, &quiet()).unwrap();
    for i in 0..200 {
        s.put(format!("k{i}").as_bytes(), b"v").unwrap();
    }
    s.close().unwrap();
    // Plant an entry in an empty slot that names no live object, and mark
    // the store unclean as a crash would leave it.
    let idx = spacejmp::segment::seg_path(&d.0, "index");
    let mut bytes = std::fs::read(&idx).unwrap();
    let page = 4096; // the SpaceJMP header page
    let slot = (0..bytes.len().saturating_sub(page) / 128)
        .flat_map(|b| (1..16).map(move |e| page + b * 128 + e * 8))
        .find(|&o| bytes[o..o + 8] == [0; 8])
        .expect("an empty index entry");
    bytes[slot..slot + 8].copy_from_slice(&((0x1234u64 << 48) | 4097).to_le_bytes());
    std::fs::write(&idx, &bytes).unwrap();
    mark_unclean(&d.0);
    let s = SharedStore::attach(&d.0, &quiet()).unwrap();
    let r = s.recovery_report().clone();
    assert!(r.ran && r.unclean && r.rebuilt, "{r:?}");
    assert_eq!(r.bad_entries, 1, "{r:?}");
    assert_eq!(r.unindexed_objects, 0, "{r:?}");
    assert_eq!(s.len(), 200);
    assert_eq!(walk(&s, 50).len(), 200);
    for i in 0..200 {
        assert_eq!(
            s.get(format!("k{i}").as_bytes()).unwrap().as_deref(),
            Some(&b"v"[..])
        );
    }
    s.close().unwrap();
}

#[test]
fn expiry_changes_work_in_a_full_store_and_never_tear() {
    let d = TempDir::new("fullexp");
    let s = SharedStore::create(&d.0, 8 << 20, &quiet()).unwrap();
    let value = vec![1u8; 2000];
    let mut n = 0;
    loop {
        match s.put(format!("k{n}").as_bytes(), &value) {
            Ok(()) => n += 1,
            Err(Error::OutOfMemory { .. }) => break,
            Err(e) => panic!("{e}"),
        }
    }
    assert!(n > 100);
    // Full: an expiry change needs no space (one store in the header).
    let v = s.meta(b"k1").unwrap().unwrap().version;
    let at = now_ms() + 1_000_000;
    assert!(s.set_expiry(b"k1", Some(at)).unwrap());
    let m = s.meta(b"k1").unwrap().unwrap();
    assert_eq!((m.version, m.expiry_ms), (v, Some(at)));
    assert!(s.set_expiry(b"k1", None).unwrap());
    assert_eq!(s.meta(b"k1").unwrap().unwrap().expiry_ms, None);
    // A reader racing expiry changes sees one of the values written, never
    // a mix, and the version never moves.
    let (t1, t2) = (now_ms() + 0x1_0000_0000, now_ms() + 0xFF_0000_FFFF);
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|sc| {
        let stop = &stop;
        let s = &s;
        sc.spawn(move || {
            for i in 0..20_000 {
                let t = if i % 2 == 0 { t1 } else { t2 };
                assert!(s.set_expiry(b"k2", Some(t)).unwrap());
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        });
        let v2 = s.meta(b"k2").unwrap().unwrap().version;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let m = s.meta(b"k2").unwrap().unwrap();
            assert_eq!(m.version, v2);
            assert!(
                m.expiry_ms.is_none() || m.expiry_ms == Some(t1) || m.expiry_ms == Some(t2),
                "torn expiry {:?}",
                m.expiry_ms
            );
        }
    });
    s.close().unwrap();
}
