//! API details a server relies on: conditional delete, the empty key, keys
//! that are prefixes of each other, `get_into` on a miss, `len`.

use nibble::{Condition, Config, Error, Expiry, Mode, PutOptions, Store};

fn store(mode: Mode) -> Store {
    let mut cfg = Config::new(16 << 20);
    cfg.mode = mode;
    Store::new(cfg).unwrap()
}

#[test]
fn conditional_delete() {
    for mode in [Mode::Nibble, Mode::Nibble2] {
        let s = store(mode);
        let v1 = s.put(b"k", b"one").unwrap();
        let v2 = s.put(b"k", b"two").unwrap();
        assert!(matches!(
            s.delete_if(b"k", Condition::IfVersion(v1)),
            Err(Error::VersionMismatch { current }) if current == v2
        ));
        assert_eq!(s.get(b"k").unwrap().as_deref(), Some(&b"two"[..]));
        assert!(matches!(
            s.delete_if(b"k", Condition::IfAbsent),
            Err(Error::Exists)
        ));
        s.delete_if(b"k", Condition::IfVersion(v2)).unwrap();
        assert_eq!(s.get(b"k").unwrap(), None);
        assert!(matches!(
            s.delete_if(b"k", Condition::Always),
            Err(Error::NotFound)
        ));
        // An expired item counts as absent, and is removed.
        let past = PutOptions {
            expiry: Expiry::At(1),
            ..Default::default()
        };
        s.put_with(b"e", b"x", past).unwrap();
        assert!(matches!(
            s.delete_if(b"e", Condition::IfPresent),
            Err(Error::NotFound)
        ));
        assert_eq!(s.len(), 0);
    }
}

#[test]
fn empty_and_prefix_keys() {
    for mode in [Mode::Nibble, Mode::Nibble2] {
        let s = store(mode);
        s.put(b"", b"empty").unwrap();
        for k in [&b"a"[..], b"ab", b"abc"] {
            s.put(k, k).unwrap();
        }
        assert_eq!(s.get(b"").unwrap().as_deref(), Some(&b"empty"[..]));
        assert!(s.delete(b"ab").unwrap());
        assert_eq!(s.get(b"a").unwrap().as_deref(), Some(&b"a"[..]));
        assert_eq!(s.get(b"abc").unwrap().as_deref(), Some(&b"abc"[..]));
        assert_eq!(s.get(b"ab").unwrap(), None);
        assert_eq!(s.len(), 3);
        assert!(!s.is_empty());
        let long = vec![b'x'; nibble::MAX_KEY_BYTES];
        s.put(&long, b"v").unwrap();
        assert_eq!(s.get(&long).unwrap().as_deref(), Some(&b"v"[..]));
        let too_long = vec![b'x'; nibble::MAX_KEY_BYTES + 1];
        assert!(matches!(s.put(&too_long, b"v"), Err(Error::BadKey { .. })));
    }
}

#[test]
fn get_into_clears_the_buffer_on_a_miss() {
    let s = store(Mode::Nibble);
    let mut buf = b"stale".to_vec();
    assert!(s.get_into(b"nope", &mut buf).unwrap().is_none());
    assert!(buf.is_empty());
    let past = PutOptions {
        expiry: Expiry::At(1),
        ..Default::default()
    };
    s.put_with(b"e", b"expired value", past).unwrap();
    buf.extend_from_slice(b"stale");
    assert!(s.get_into(b"e", &mut buf).unwrap().is_none());
    assert!(buf.is_empty(), "an expired value leaked: {buf:?}");
}

/// Objects unlinked by an overwrite or a delete carry the dead mark, so
/// compaction passes them over without an index probe, and what stays live
/// survives it intact; versions stay below the mark's value.
#[test]
fn compaction_skips_marked_dead_objects() {
    for mode in [Mode::Nibble, Mode::Nibble2] {
        let s = store(mode);
        let value = |i: u32, round: u32| format!("{i}-{round}-{}", "x".repeat(200)).into_bytes();
        for round in 0..4u32 {
            for i in 0..2000u32 {
                // Nibble-2 overwrites same-size values in place; a longer
                // value every round makes it append (and unlink) too.
                let mut v = value(i, round);
                v.extend(std::iter::repeat_n(b'y', round as usize));
                s.put(format!("k{i}").as_bytes(), &v).unwrap();
            }
        }
        for i in (0..2000u32).step_by(2) {
            assert!(s.delete(format!("k{i}").as_bytes()).unwrap());
        }
        s.compact_now(std::time::Duration::from_secs(5));
        let st = s.stats();
        // 3 overwritten versions of each key and the deleted half's last.
        assert!(st.dead_skipped >= 6000, "{mode:?}: {st:?}");
        for i in 0..2000u32 {
            let got = s.get(format!("k{i}").as_bytes()).unwrap();
            if i % 2 == 0 {
                assert_eq!(got, None);
            } else {
                let mut v = value(i, 3);
                v.extend(std::iter::repeat_n(b'y', 3));
                assert_eq!(got, Some(v), "{mode:?} k{i}");
                let m = s.meta(format!("k{i}").as_bytes()).unwrap().unwrap();
                assert!(m.version < nibble::object::DEAD_VERSION);
            }
        }
    }
}

/// `scan` skips expired items; `scan_with_expired` returns them too, so a
/// flush can delete them and `len` drops to 0.
#[test]
fn scan_with_expired_sees_expired_items() {
    for mode in [Mode::Nibble, Mode::Nibble2] {
        let s = store(mode);
        let past = PutOptions {
            expiry: Expiry::At(1),
            ..Default::default()
        };
        s.put_with(b"gone", b"x", past).unwrap();
        s.put(b"live", b"y").unwrap();
        let (next, keys) = s.scan(0, 1 << 20).unwrap();
        assert_eq!((next, keys), (0, vec![b"live".to_vec()]));
        let mut all = s.scan_with_expired(0, 1 << 20).unwrap().1;
        all.sort();
        assert_eq!(all, vec![b"gone".to_vec(), b"live".to_vec()]);
        assert_eq!(s.len(), 2, "the expired item is still indexed");
        for k in &all {
            s.delete(k).unwrap();
        }
        assert_eq!(s.len(), 0);
    }
}
