//! Single-process behaviour: the API against a `HashMap` model (proptest),
//! close and re-attach, clear errors on bad input, out of memory and
//! recovery after deletes, compaction reclaiming churn.

use std::collections::HashMap;

use nibblejmp::{Error, Options, SharedStore};
use proptest::prelude::*;

mod common;

use common::{attach_rebuilt, quiet, TempDir};

#[test]
fn put_get_delete_close_attach() {
    let d = TempDir::new("basic");
    let s = SharedStore::create(&d.0, 8 << 20, &quiet()).unwrap();
    assert_eq!(s.get(b"a").unwrap(), None);
    s.put(b"a", b"1").unwrap();
    s.put(b"b", b"").unwrap();
    s.put(b"", b"empty key").unwrap();
    s.put(b"a", b"22").unwrap();
    assert_eq!(s.get(b"a").unwrap().as_deref(), Some(&b"22"[..]));
    assert_eq!(s.get(b"b").unwrap().as_deref(), Some(&b""[..]));
    assert_eq!(s.get(b"").unwrap().as_deref(), Some(&b"empty key"[..]));
    assert!(s.delete(b"b").unwrap());
    assert!(!s.delete(b"b").unwrap());
    let mut keys = s.keys().unwrap();
    keys.sort();
    assert_eq!(keys, vec![b"".to_vec(), b"a".to_vec()]);
    s.close().unwrap();
    let s = SharedStore::attach(&d.0, &quiet()).unwrap();
    assert!(!s.recovery_report().ran, "a clean close needs no recovery");
    assert_eq!(s.get(b"a").unwrap().as_deref(), Some(&b"22"[..]));
    assert_eq!(s.get(b"b").unwrap(), None);
    assert!(!s.stats().clean_flag, "in use: not clean");
    s.close().unwrap();
    // A forced rebuild from the log gives the same contents.
    let s = attach_rebuilt(&d.0, quiet());
    assert_eq!(s.recovery_report().objects_indexed, 2);
    assert_eq!(s.get(b"a").unwrap().as_deref(), Some(&b"22"[..]));
    assert_eq!(s.get(b"b").unwrap(), None);
    s.close().unwrap();
}

#[test]
fn errors_are_clear() {
    let d = TempDir::new("errors");
    assert!(matches!(
        SharedStore::attach(&d.0, &quiet()),
        Err(Error::NotFound(_))
    ));
    assert!(matches!(
        SharedStore::create(&d.0, 100_000, &quiet()),
        Err(Error::CapacityTooSmall { .. })
    ));
    assert!(matches!(
        SharedStore::create(
            &d.0,
            8 << 20,
            &Options {
                seg_bytes: Some(1000),
                ..quiet()
            }
        ),
        Err(Error::InvalidArgument(_))
    ));
    let s = SharedStore::create(&d.0, 8 << 20, &quiet()).unwrap();
    let seg = s.geometry().seg_bytes as usize;
    assert!(matches!(
        s.put(b"k", &vec![0u8; seg]),
        Err(Error::ValueTooLarge { .. })
    ));
    assert!(matches!(
        s.put(&vec![1u8; 70_000], b"v"),
        Err(Error::KeyTooLarge { .. })
    ));
    assert!(matches!(
        SharedStore::create(&d.0, 8 << 20, &quiet()),
        Err(Error::Exists(_))
    ));
    s.close().unwrap();
    // A SpaceJMP store without our VAS is not a store.
    let other = TempDir::new("notastore");
    let jmp = spacejmp::Jmp::open(
        spacejmp::Config::with_store(&other.0).window(0x6800_0000_0000, 1 << 30),
    )
    .unwrap();
    drop(jmp);
    assert!(matches!(
        SharedStore::attach(&other.0, &quiet()),
        Err(Error::NotAStore { .. })
    ));
    // A wrong layout version is reported as such.
    let meta = spacejmp::segment::seg_path(&d.0, "meta");
    let mut bytes = std::fs::read(&meta).unwrap();
    let page = 4096;
    bytes[page + 8] = 99; // layout_version, after the magic
    std::fs::write(&meta, &bytes).unwrap();
    assert!(matches!(
        SharedStore::attach(&d.0, &quiet()),
        Err(Error::WrongVersion { found: 99, .. })
    ));
    bytes[page] ^= 0xFF; // the magic
    std::fs::write(&meta, &bytes).unwrap();
    assert!(matches!(
        SharedStore::attach(&d.0, &quiet()),
        Err(Error::NotAStore { .. })
    ));
}

#[test]
fn out_of_memory_then_deletes_make_room() {
    let d = TempDir::new("oom");
    let s = SharedStore::create(&d.0, 4 << 20, &quiet()).unwrap();
    let value = vec![7u8; 1000];
    let mut n = 0u32;
    let err = loop {
        match s.put(format!("key{n}").as_bytes(), &value) {
            Ok(()) => n += 1,
            Err(e) => break e,
        }
        assert!(n < 100_000, "never ran out of memory");
    };
    assert!(matches!(err, Error::OutOfMemory { .. }), "{err}");
    assert!(n > 1000, "only {n} objects fit in 4 MiB");
    let st = s.stats();
    assert!(st.live_bytes <= s.geometry().capacity_bytes);
    // Reads and deletes still work.
    assert_eq!(s.get(b"key0").unwrap().as_deref(), Some(&value[..]));
    for i in (0..n).step_by(2) {
        assert!(s.delete(format!("key{i}").as_bytes()).unwrap());
    }
    // Writes succeed again (compaction runs inline under the lease).
    for i in 0..n / 4 {
        s.put(format!("new{i}").as_bytes(), &value).unwrap();
    }
    for i in (1..n).step_by(2) {
        assert_eq!(
            s.get(format!("key{i}").as_bytes()).unwrap().as_deref(),
            Some(&value[..])
        );
    }
    assert!(s.stats().compactions > 0);
    s.close().unwrap();
}

#[test]
fn churn_is_reclaimed_by_compaction() {
    let d = TempDir::new("churn");
    let s = SharedStore::create(&d.0, 8 << 20, &Options::default()).unwrap();
    let mut model = HashMap::new();
    // Write about 10x the capacity through 500 keys.
    for i in 0..80_000u32 {
        let k = format!("k{}", i % 500);
        let v = vec![(i % 251) as u8; 100 + (i % 900) as usize];
        s.put(k.as_bytes(), &v).unwrap();
        model.insert(k, v);
    }
    for (k, v) in &model {
        assert_eq!(s.get(k.as_bytes()).unwrap().as_ref(), Some(v));
    }
    let st = s.stats();
    assert!(st.compactions > 0, "{st:?}");
    assert!(st.live_bytes <= s.geometry().capacity_bytes);
    s.close().unwrap();
}

#[derive(Clone, Debug)]
enum Op {
    Put(u8, Vec<u8>),
    Get(u8),
    Del(u8),
    Reattach,
    Compact,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..24, proptest::collection::vec(any::<u8>(), 0..300)).prop_map(|(k, v)| Op::Put(k, v)),
        3 => (0u8..24).prop_map(Op::Get),
        2 => (0u8..24).prop_map(Op::Del),
        1 => Just(Op::Reattach),
        1 => Just(Op::Compact),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    #[test]
    fn matches_a_hashmap(ops in proptest::collection::vec(op(), 1..200)) {
        let d = TempDir::new("prop");
        let mut s = SharedStore::create(&d.0, 2 << 20, &quiet()).unwrap();
        let mut model: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
        for op in ops {
            match op {
                Op::Put(k, v) => {
                    let key = vec![b'k', k];
                    s.put(&key, &v).unwrap();
                    model.insert(key, v);
                }
                Op::Get(k) => {
                    let key = vec![b'k', k];
                    prop_assert_eq!(s.get(&key).unwrap(), model.get(&key).cloned());
                }
                Op::Del(k) => {
                    let key = vec![b'k', k];
                    prop_assert_eq!(s.delete(&key).unwrap(), model.remove(&key).is_some());
                }
                Op::Reattach => {
                    s.close().unwrap();
                    s = SharedStore::attach(&d.0, &quiet()).unwrap();
                }
                Op::Compact => {
                    s.compact_now().unwrap();
                }
            }
        }
        let mut keys = s.keys().unwrap();
        keys.sort();
        let mut want: Vec<_> = model.keys().cloned().collect();
        want.sort();
        prop_assert_eq!(keys, want);
        s.close().unwrap();
        // The log alone reproduces the model.
        let s = attach_rebuilt(&d.0, quiet());
        for (k, v) in &model {
            prop_assert_eq!(s.get(k).unwrap(), Some(v.clone()));
        }
        prop_assert_eq!(s.keys().unwrap().len(), model.len());
        s.close().unwrap();
    }
}

#[test]
fn threads_of_one_process_share_the_slots() {
    let d = TempDir::new("threads");
    let s = SharedStore::create(&d.0, 16 << 20, &Options::default()).unwrap();
    // More threads than the process has epoch slots (at most 4).
    std::thread::scope(|sc| {
        for t in 0..6u32 {
            let s = &s;
            sc.spawn(move || {
                for i in 0..3000u32 {
                    let k = format!("t{t}-{}", i % 50);
                    let v = format!("{t}:{i}");
                    s.put(k.as_bytes(), v.as_bytes()).unwrap();
                    assert_eq!(s.get(k.as_bytes()).unwrap().as_deref(), Some(v.as_bytes()));
                    if i % 5 == 0 {
                        assert!(s.delete(k.as_bytes()).unwrap());
                    }
                }
            });
        }
    });
    assert!(s.keys().unwrap().len() <= 6 * 50);
    s.close().unwrap();
}
