//! Single-thread model tests: the store against a `HashMap`, in both modes,
//! with small segments so heads roll and compaction runs.

use std::collections::HashMap;
use std::time::Duration;

use nibble::{Condition, Config, Error, Expiry, Mode, PutOptions, Store};
use proptest::prelude::*;

fn small_store(mode: Mode) -> Store {
    let mut cfg = Config::new(16 << 20);
    cfg.mode = mode;
    cfg.segment_bytes = Some(128 << 10);
    Store::new(cfg).unwrap()
}

#[derive(Clone, Debug)]
enum Op {
    Put(u8, usize),
    Del(u8),
    Get(u8),
    Add(u8, usize),
    Replace(u8, usize),
    /// A write with client flags (a flags slot in the header).
    PutFlags(u8, usize, u32),
    /// A write that keeps the item's expiry (Redis KEEPTTL).
    PutKeep(u8, usize),
    /// Set an expiry an hour away (`true`) or clear it (`false`).
    Expire(u8, bool),
    Compact,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (any::<u8>(), 0..3000usize).prop_map(|(k, n)| Op::Put(k, n)),
        2 => any::<u8>().prop_map(Op::Del),
        4 => any::<u8>().prop_map(Op::Get),
        1 => (any::<u8>(), 0..300usize).prop_map(|(k, n)| Op::Add(k, n)),
        1 => (any::<u8>(), 0..300usize).prop_map(|(k, n)| Op::Replace(k, n)),
        1 => (any::<u8>(), 0..300usize, 0..3u32).prop_map(|(k, n, f)| Op::PutFlags(k, n, f)),
        1 => (any::<u8>(), 0..300usize).prop_map(|(k, n)| Op::PutKeep(k, n)),
        2 => (any::<u8>(), any::<bool>()).prop_map(|(k, e)| Op::Expire(k, e)),
        1 => Just(Op::Compact),
    ]
}

fn key(k: u8) -> Vec<u8> {
    // Keys of varied lengths, some long enough to cross blocks.
    let mut v = format!("key-{k}").into_bytes();
    v.resize(5 + (k as usize % 7) * 40, b'k');
    v
}

fn value(k: u8, n: usize, salt: usize) -> Vec<u8> {
    (0..n).map(|i| (i + k as usize * 31 + salt) as u8).collect()
}

/// What the model holds per key: the value, the client flags and the
/// expiry. In Nibble mode (every write appends) the object's size follows:
/// a flags slot when the flags are not 0, an expiry slot when it was
/// written with a TTL or given one later (a relocation; clearing the TTL
/// keeps the slot).
#[derive(Clone, Debug, PartialEq)]
struct Item {
    value: Vec<u8>,
    flags: u32,
    expiry_ms: Option<u64>,
    expiry_slot: bool,
}

impl Item {
    fn plain(value: Vec<u8>) -> Item {
        Item {
            value,
            flags: 0,
            expiry_ms: None,
            expiry_slot: false,
        }
    }

    fn object_bytes(&self, key: &[u8]) -> u64 {
        let header = nibble::object::HEADER_MIN_BYTES
            + if self.flags != 0 { 4 } else { 0 }
            + if self.expiry_slot {
                nibble::object::EXPIRY_SLOT_BYTES
            } else {
                0
            };
        (header + key.len() + self.value.len()) as u64
    }
}

/// `put_with` on the store and what it means in the model: the value and
/// flags given, the expiry given or (KEEPTTL) the item's old one.
fn put_modelled(
    s: &Store,
    model: &mut HashMap<Vec<u8>, Item>,
    k: u8,
    v: Vec<u8>,
    opts: PutOptions,
) {
    s.put_with(&key(k), &v, opts).unwrap();
    let expiry_ms = match opts.expiry {
        Expiry::Never => None,
        Expiry::At(t) => Some(t),
        Expiry::Keep => model.get(&key(k)).and_then(|it| it.expiry_ms),
    };
    let item = Item {
        value: v,
        flags: opts.flags,
        expiry_ms,
        expiry_slot: expiry_ms.is_some(),
    };
    model.insert(key(k), item);
}

fn run(mode: Mode, ops: &[Op]) {
    let s = small_store(mode);
    let later = nibble::object::now_ms() + 3_600_000;
    let mut model: HashMap<Vec<u8>, Item> = HashMap::new();
    for (i, op) in ops.iter().enumerate() {
        match *op {
            Op::Put(k, n) => {
                let v = value(k, n, i);
                s.put(&key(k), &v).unwrap();
                model.insert(key(k), Item::plain(v));
            }
            Op::Del(k) => {
                assert_eq!(s.delete(&key(k)).unwrap(), model.remove(&key(k)).is_some());
            }
            Op::Get(k) => {
                assert_eq!(
                    s.get(&key(k)).unwrap(),
                    model.get(&key(k)).map(|it| it.value.clone())
                );
            }
            Op::Add(k, n) => {
                let v = value(k, n, i);
                match s.put_if_absent(&key(k), &v) {
                    Ok(_) => assert!(model.insert(key(k), Item::plain(v)).is_none()),
                    Err(Error::Exists) => assert!(model.contains_key(&key(k))),
                    Err(e) => panic!("{e}"),
                }
            }
            Op::Replace(k, n) => {
                let v = value(k, n, i);
                match s.replace(&key(k), &v) {
                    Ok(_) => assert!(model.insert(key(k), Item::plain(v)).is_some()),
                    Err(Error::NotFound) => assert!(!model.contains_key(&key(k))),
                    Err(e) => panic!("{e}"),
                }
            }
            Op::PutFlags(k, n, flags) => {
                let opts = PutOptions {
                    flags,
                    ..Default::default()
                };
                put_modelled(&s, &mut model, k, value(k, n, i), opts);
            }
            Op::PutKeep(k, n) => {
                let opts = PutOptions {
                    expiry: Expiry::Keep,
                    ..Default::default()
                };
                put_modelled(&s, &mut model, k, value(k, n, i), opts);
            }
            Op::Expire(k, set) => {
                let e = set.then_some(later);
                assert_eq!(
                    s.set_expiry(&key(k), e).unwrap(),
                    model.contains_key(&key(k))
                );
                if let Some(it) = model.get_mut(&key(k)) {
                    it.expiry_ms = e;
                    it.expiry_slot |= e.is_some();
                }
            }
            Op::Compact => s.compact_now(Duration::from_secs(2)),
        }
    }
    for (k, it) in &model {
        assert_eq!(s.get(k).unwrap().as_ref(), Some(&it.value));
        let m = s.meta(k).unwrap().unwrap();
        assert_eq!((m.flags, m.expiry_ms), (it.flags, it.expiry_ms), "{k:?}");
    }
    let st = s.stats();
    assert_eq!(st.items, model.len() as u64);
    let expect_live: u64 = model.iter().map(|(k, it)| it.object_bytes(k)).sum();
    if mode == Mode::Nibble {
        assert_eq!(st.live_bytes, expect_live, "live bytes drifted");
    } else {
        assert!(st.live_bytes >= expect_live, "live bytes below model");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    #[test]
    fn nibble_matches_hashmap(ops in prop::collection::vec(op(), 1..400)) {
        run(Mode::Nibble, &ops);
    }
    #[test]
    fn nibble2_matches_hashmap(ops in prop::collection::vec(op(), 1..400)) {
        run(Mode::Nibble2, &ops);
    }
}

#[test]
fn rejects_bad_sizes_and_small_capacity() {
    let s = small_store(Mode::Nibble);
    assert!(matches!(
        s.put(&vec![1u8; 64 * 1024], b"x"),
        Err(Error::BadKey { .. })
    ));
    let mut cfg = Config::new(16 << 20);
    cfg.max_value_bytes = 1000;
    let s2 = Store::new(cfg).unwrap();
    assert!(matches!(
        s2.put(b"k", &[0; 1001]),
        Err(Error::ValueTooLarge {
            len: 1001,
            max: 1000
        })
    ));
    let e = Store::new(Config::new(1 << 20)).err().unwrap();
    assert!(e.to_string().contains("below the minimum"), "{e}");
}

#[test]
fn large_values_span_blocks_and_segments_of_their_own() {
    let s = small_store(Mode::Nibble);
    let big: Vec<u8> = (0..(3 << 20)).map(|i| (i * 7) as u8).collect();
    s.put(b"big", &big).unwrap();
    s.put(b"small", b"x").unwrap();
    assert_eq!(s.get(b"big").unwrap().unwrap(), big);
    let key = vec![9u8; 65535];
    s.put(&key, b"long key").unwrap();
    assert_eq!(s.get(&key).unwrap().unwrap(), b"long key");
}

#[test]
fn versions_and_cas() {
    for mode in [Mode::Nibble, Mode::Nibble2] {
        let s = small_store(mode);
        let v1 = s.put(b"k", b"one").unwrap();
        let v2 = s.put(b"k", b"two").unwrap();
        assert_ne!(v2, v1);
        assert!(matches!(
            s.compare_and_swap(b"k", b"x", v1),
            Err(Error::VersionMismatch { current }) if current == v2
        ));
        let v3 = s.compare_and_swap(b"k", b"three", v2).unwrap();
        assert_ne!(v3, v2);
        assert_eq!(s.meta(b"k").unwrap().unwrap().version, v3);
        assert!(matches!(
            s.compare_and_swap(b"nope", b"x", 1),
            Err(Error::NotFound)
        ));
        let flagged = PutOptions {
            flags: 42,
            ..Default::default()
        };
        s.put_with(b"f", b"v", flagged).unwrap();
        assert_eq!(s.meta(b"f").unwrap().unwrap().flags, 42);
    }
}

#[test]
fn expiry_hides_at_once_and_compaction_reclaims() {
    for mode in [Mode::Nibble, Mode::Nibble2] {
        let s = small_store(mode);
        let past = nibble::object::now_ms() - 1;
        let opts = PutOptions {
            expiry: Expiry::At(past),
            ..Default::default()
        };
        for i in 0..200u32 {
            s.put_with(format!("e{i}").as_bytes(), &[1; 500], opts)
                .unwrap();
        }
        assert_eq!(s.get(b"e7").unwrap(), None);
        assert!(!s.contains(b"e7").unwrap());
        // An expired key counts as absent for add.
        s.put_if_absent(b"e8", b"fresh").unwrap();
        assert_eq!(s.get(b"e8").unwrap().as_deref(), Some(&b"fresh"[..]));
        let version = s.put(b"keep", b"v").unwrap();
        let later = nibble::object::now_ms() + 3_600_000;
        // The expiry is metadata: set in place, the version stays.
        assert!(s.set_expiry(b"keep", Some(later)).unwrap());
        let m = s.meta(b"keep").unwrap().unwrap();
        assert_eq!((m.expiry_ms, m.version), (Some(later), version));
        assert!(s.set_expiry(b"keep", Some(later + 1)).unwrap());
        assert!(s.set_expiry(b"keep", None).unwrap());
        assert!(s.set_expiry(b"keep", Some(later)).unwrap());
        assert_eq!(s.meta(b"keep").unwrap().unwrap().version, version);
        assert!(!s.set_expiry(b"absent", Some(later)).unwrap());
        s.compact_now(Duration::from_secs(5));
        let st = s.stats();
        assert!(st.expired_reclaimed >= 150, "{st:?}");
        assert_eq!(st.items, 2, "only e8 and keep remain");
        let _ = Condition::Always;
    }
}

#[test]
fn scan_returns_every_key() {
    let s = small_store(Mode::Nibble);
    for i in 0..1000u32 {
        s.put(format!("scan-{i}").as_bytes(), b"v").unwrap();
    }
    let mut seen = std::collections::HashSet::new();
    let mut cursor = 0;
    loop {
        let (next, keys) = s.scan(cursor, 64).unwrap();
        seen.extend(keys);
        if next == 0 {
            break;
        }
        cursor = next;
    }
    assert_eq!(seen.len(), 1000);
}

#[test]
fn set_expiry_on_a_full_store_in_place_or_reported() {
    // An object with an expiry slot takes a new TTL (or none) in place, so
    // that works on a full store (Redis allows EXPIRE over maxmemory). One
    // without the slot is relocated: on a store this full (one 32 KiB
    // object per 64 KiB segment, nothing compaction can merge) the copy
    // may find no room within its share of the reserve; then the call says
    // so and the object keeps its value and its missing TTL.
    let s = Store::new(Config::new(nibble::MIN_CAPACITY_BYTES)).unwrap();
    let v = vec![b'x'; 32 << 10];
    let soon = nibble::object::now_ms() + 50_000;
    let with_ttl = PutOptions {
        expiry: Expiry::At(soon),
        ..Default::default()
    };
    for i in 0..3 {
        s.put_with(format!("t{i}").as_bytes(), &v, with_ttl)
            .unwrap();
    }
    let mut stored = 0u32;
    while s.put(format!("k{stored}").as_bytes(), &v).is_ok() {
        stored += 1;
        assert!(stored < 10_000, "never ran out of memory");
    }
    let later = nibble::object::now_ms() + 100_000;
    let meta_expiry = |k: &str| s.meta(k.as_bytes()).unwrap().unwrap().expiry_ms;
    for i in 0..3 {
        let k = format!("t{i}");
        assert!(s.set_expiry(k.as_bytes(), Some(later)).unwrap(), "{k}");
        assert_eq!(meta_expiry(&k), Some(later));
        assert!(s.set_expiry(k.as_bytes(), None).unwrap(), "{k}");
        assert_eq!(meta_expiry(&k), None);
        assert!(s.set_expiry(k.as_bytes(), Some(later)).unwrap(), "{k}");
    }
    for i in 0..3 {
        let k = format!("k{i}");
        match s.set_expiry(k.as_bytes(), Some(later)) {
            Ok(found) => {
                assert!(found, "{k}");
                assert_eq!(meta_expiry(&k), Some(later));
            }
            Err(Error::OutOfMemory { .. }) => assert_eq!(meta_expiry(&k), None),
            Err(e) => panic!("{k}: {e}"),
        }
        assert_eq!(s.get(k.as_bytes()).unwrap().unwrap(), v);
    }
    assert_eq!(s.get(b"t0").unwrap().unwrap(), v);
}
