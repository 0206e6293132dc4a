//! Every row of the crash table, deterministically: a child process runs
//! up to a named [`CrashPoint`] and SIGKILLs itself there (holding whatever
//! locks it holds at that point); the parent, attached throughout, checks
//! what the table promises:
//!
//! 1. a read right after the death returns at once, with the value the
//!    table says is visible;
//! 2. a write to the same key gets through (breaking the dead holder's
//!    lock) within a second;
//! 3. after the parent closes, an index rebuilt from the log alone has the
//!    same contents, with no duplicate live copies (the dead holder's
//!    update was rolled forward or back in the log too).

mod common;

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use nibblejmp::testing::{crash_at, CrashPoint};
use nibblejmp::{Options, SharedStore};

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn opts() -> Options {
    Options {
        compaction_thread: false,
        ..Options::default()
    }
}

/// The expiry the `expiry-stored` child sets (year 2096).
const EXPIRY_AT_MS: u64 = 4_000_000_000_000;

const POINTS: [(&str, CrashPoint); 9] = [
    ("append-mid-copy", CrashPoint::AppendMidCopy),
    ("segment-claimed", CrashPoint::SegmentClaimed),
    ("put-appended", CrashPoint::PutAppended),
    ("put-entry-stored", CrashPoint::PutEntryStored),
    ("put-committed", CrashPoint::PutCommitted),
    ("delete-entry-cleared", CrashPoint::DeleteEntryCleared),
    ("move-copied", CrashPoint::MoveCopied),
    ("move-entry-stored", CrashPoint::MoveEntryStored),
    ("expiry-stored", CrashPoint::ExpiryStored),
];

/// Baseline contents the child writes before crashing.
fn baseline() -> HashMap<Vec<u8>, Vec<u8>> {
    (0..200u32)
        .map(|i| {
            (
                format!("base{i}").into_bytes(),
                format!("value{i}").into_bytes(),
            )
        })
        .collect()
}

#[test]
fn child() {
    let Ok(name) = std::env::var("NJ_CRASH") else {
        return;
    };
    let dir = PathBuf::from(std::env::var("NJ_DIR").unwrap());
    let p = POINTS.iter().find(|(n, _)| *n == name).unwrap().1;
    let s = SharedStore::attach(&dir, &opts()).unwrap();
    for (k, v) in baseline() {
        s.put(&k, &v).unwrap();
    }
    for i in 0..100u32 {
        s.delete(format!("base{}", 100 + i).as_bytes()).unwrap();
    }
    s.put(b"victim", b"old").unwrap();
    crash_at(p);
    match p {
        CrashPoint::DeleteEntryCleared => {
            s.delete(b"victim").unwrap();
        }
        CrashPoint::ExpiryStored => {
            s.set_expiry(b"victim", Some(EXPIRY_AT_MS)).unwrap();
        }
        CrashPoint::MoveCopied | CrashPoint::MoveEntryStored => {
            // Roll the heads over a few segments so there is something to
            // compact, then compact (with the crash point armed).
            crash_at(CrashPoint::Never);
            for i in 0..600u32 {
                s.put(format!("fill{}", i % 10).as_bytes(), &[2u8; 500])
                    .unwrap();
            }
            crash_at(p);
            s.compact_now().unwrap();
        }
        CrashPoint::SegmentClaimed => {
            // Fill until a head rolls to a new segment.
            for i in 0..100_000u32 {
                s.put(format!("fill{i}").as_bytes(), &[1u8; 500]).unwrap();
                s.delete(format!("fill{i}").as_bytes()).unwrap();
            }
        }
        _ => s.put(b"victim", b"new").unwrap(),
    }
    panic!("crash point {name} not reached");
}

fn run_point(name: &str, p: CrashPoint) {
    let d = TempDir(PathBuf::from(format!(
        "/dev/shm/nibblejmp-cp-{}-{name}",
        std::process::id()
    )));
    let _ = std::fs::remove_dir_all(&d.0);
    let parent = SharedStore::create(&d.0, 4 << 20, &opts()).unwrap();
    let st = Command::new(std::env::current_exe().unwrap())
        .args(["child", "--exact", "--nocapture", "--test-threads=1"])
        .env("NJ_CRASH", name)
        .env("NJ_DIR", &d.0)
        .status()
        .unwrap();
    assert!(!st.success(), "{name}: child survived");
    // 1. Reads do not wait for the dead holder.
    let t0 = Instant::now();
    let seen = parent.get(b"victim").unwrap();
    assert!(
        t0.elapsed() < Duration::from_millis(100),
        "{name}: read waited"
    );
    let expect: Option<&[u8]> = match p {
        CrashPoint::PutEntryStored | CrashPoint::PutCommitted => Some(b"new"),
        CrashPoint::DeleteEntryCleared => None,
        _ => Some(b"old"),
    };
    assert_eq!(seen.as_deref(), expect, "{name}: visible value");
    if p == CrashPoint::ExpiryStored {
        // One atomic store: it happened, whole.
        let m = parent.meta(b"victim").unwrap().unwrap();
        assert_eq!(m.expiry_ms, Some(EXPIRY_AT_MS), "{name}");
    }
    let mut model = baseline();
    for i in 0..100u32 {
        model.remove(format!("base{}", 100 + i).as_bytes());
    }
    for (k, v) in &model {
        assert_eq!(parent.get(k).unwrap().as_ref(), Some(v), "{name}");
    }
    // 2. Writers get through.
    let t0 = Instant::now();
    let key_after: &[u8] = if p == CrashPoint::DeleteEntryCleared || name.ends_with("stored") {
        // Leave the victim as the dead process left it, so the rebuild
        // checks the roll-forward; write a neighbour instead.
        b"other"
    } else {
        b"victim"
    };
    parent.put(key_after, b"after").unwrap();
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "{name}: write waited {:?}",
        t0.elapsed()
    );
    let reclaimed = parent.reclaim_dead();
    let st = parent.stats();
    assert!(st.slots_reclaimed >= 1 || reclaimed >= 1, "{name}: {st:?}");
    if p != CrashPoint::PutAppended
        && p != CrashPoint::SegmentClaimed
        && p != CrashPoint::AppendMidCopy
    {
        assert!(
            st.broken_locks >= 1,
            "{name}: the dead holder's bucket lock was never broken: {st:?}"
        );
    }
    if matches!(p, CrashPoint::MoveCopied | CrashPoint::MoveEntryStored) {
        // The dead compactor's lease is taken over.
        assert!(parent.compact_now().is_ok(), "{name}: lease not taken over");
        assert!(parent.stats().lease_takeovers >= 1);
    }
    if p == CrashPoint::SegmentClaimed {
        let st = parent.stats();
        assert!(
            st.segments_open <= st.geometry.unwrap().heads,
            "{name}: orphan open segment: {st:?}"
        );
    }
    let mut want = model.clone();
    match key_after {
        b"victim" => {
            want.insert(b"victim".to_vec(), b"after".to_vec());
        }
        _ => {
            want.insert(b"other".to_vec(), b"after".to_vec());
            if let Some(v) = expect {
                want.insert(b"victim".to_vec(), v.to_vec());
            }
        }
    }
    check(&parent, &want, name);
    parent.close().unwrap();
    // 3. The log agrees.
    let s = common::attach_rebuilt(&d.0, opts());
    let r = s.recovery_report().clone();
    assert_eq!(r.duplicates, 0, "{name}: {r:?}");
    assert_eq!(r.damaged_segments, 0, "{name}: {r:?}");
    check(&s, &want, name);
    if p == CrashPoint::ExpiryStored {
        let m = s.meta(b"victim").unwrap().unwrap();
        assert_eq!(m.expiry_ms, Some(EXPIRY_AT_MS), "{name}: after the rebuild");
    }
    s.close().unwrap();
}

fn check(s: &SharedStore, want: &HashMap<Vec<u8>, Vec<u8>>, name: &str) {
    for (k, v) in want {
        assert_eq!(
            s.get(k).unwrap().as_ref(),
            Some(v),
            "{name}: {}",
            String::from_utf8_lossy(k)
        );
    }
    let mut keys = s.keys().unwrap();
    keys.retain(|k| !k.starts_with(b"fill"));
    assert_eq!(keys.len(), want.len(), "{name}: key count");
}

#[test]
fn every_crash_point() {
    for (name, p) in POINTS {
        run_point(name, p);
    }
}
