//! The parallel power-cut recovery (`recovery.rs`: re-derive, rebuild and
//! verify walks shared among threads) against the serial walks in log
//! order (`Options::recovery_threads = Some(1)`), the reference: stores
//! with overwrites, deletes and damaged or torn (zeroed) log pages, each
//! recovered twice from identical copies, must come back with the same
//! key -> value map and the same report figures. Some stores also have
//! every replaced or deleted copy revived (its DEAD bit cleared, as when a
//! power cut loses the kills), so several live versions of a key meet in
//! the rebuild and the newest must win. Without damage both must also
//! agree with a model of the writes.

use std::collections::BTreeMap;
use std::path::Path;

use nibblejmp::layout::{OBJ_COMMITTED, OBJ_DEAD, OBJ_MAGIC, OBJ_MAGIC_MASK};
use nibblejmp::{Options, SharedStore};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

mod common;

use common::{quiet, TempDir};

/// Clear the clean flag and name another boot in the boot marker: the
/// next attach takes the power-cut path (segment table re-derived from
/// the log, index rebuilt).
fn as_after_power_cut(dir: &Path) {
    let meta = spacejmp::segment::seg_path(dir, "meta");
    let mut mb = std::fs::read(&meta).unwrap();
    let clean_off = 4096 + 8 * 8; // header page + MetaHeader::clean
    mb[clean_off..clean_off + 8].copy_from_slice(&0u64.to_le_bytes());
    std::fs::write(&meta, &mb).unwrap();
    std::fs::write(dir.join("boot_id"), "an-earlier-boot\n").unwrap();
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

/// Recover the store in `dir` with `threads` recovery threads; its
/// key -> value map (a damaged key reads as `None`) and report.
fn recover(
    dir: &Path,
    threads: usize,
) -> (
    BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    nibblejmp::RecoveryReport,
) {
    let s = SharedStore::attach(
        dir,
        &Options {
            recovery_threads: Some(threads),
            ..quiet()
        },
    )
    .unwrap();
    let r = s.recovery_report().clone();
    assert!(r.ran && r.rebuilt && r.meta_rederived, "{r:?}");
    let mut m = BTreeMap::new();
    for k in s.keys().unwrap() {
        let v = s.get(&k).ok().flatten();
        m.insert(k, v);
    }
    assert_eq!(s.len(), m.len() as u64);
    s.close().unwrap();
    (m, r)
}

/// Clear the DEAD bit of every committed object in the log file (a word
/// of a value that happens to look like a state word may be changed too:
/// that object then fails its checksum, the same way in both copies).
fn revive_dead_copies(dir: &Path) {
    let log = spacejmp::segment::seg_path(dir, "log");
    let mut b = std::fs::read(&log).unwrap();
    for w in b.chunks_exact_mut(8) {
        let v = u64::from_le_bytes(w.try_into().unwrap());
        if v & OBJ_MAGIC_MASK == OBJ_MAGIC && v & OBJ_COMMITTED != 0 && v & OBJ_DEAD != 0 {
            w.copy_from_slice(&(v & !OBJ_DEAD).to_le_bytes());
        }
    }
    std::fs::write(&log, &b).unwrap();
}

/// A directory under /var/tmp (a disk file system where /dev/shm is
/// tmpfs: punching the index's pages out and reading the log ahead go
/// through the disk file system's paths), removed on drop.
struct DiskDir(std::path::PathBuf);

impl DiskDir {
    fn new(tag: &str) -> DiskDir {
        let p = std::path::PathBuf::from(format!(
            "/var/tmp/nibblejmp-test-{}-{tag}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&p);
        DiskDir(p)
    }
}

impl Drop for DiskDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn one_case(seed: u64, damage: bool, revive: bool) {
    one_case_in(seed, damage, revive, None);
}

/// [`one_case`]; the parallel recovery runs on a copy in `disk` when
/// given.
fn one_case_in(seed: u64, damage: bool, revive: bool, disk: Option<&Path>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let d = TempDir::new("par-rec");
    let opts = Options {
        seg_bytes: Some(64 << 10),
        ..quiet()
    };
    let s = SharedStore::create(&d.0, 16 << 20, &opts).unwrap();
    let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    for i in 0..6000u32 {
        let k = format!("k{}", rng.gen_range(0..400u32)).into_bytes();
        if rng.gen_ratio(1, 8) {
            s.delete(&k).unwrap();
            model.remove(&k);
        } else {
            let len = rng.gen_range(1..1500usize);
            let v: Vec<u8> = (0..len).map(|j| (i as usize + j) as u8).collect();
            s.put(&k, &v).unwrap();
            model.insert(k, v);
        }
    }
    s.close().unwrap();
    as_after_power_cut(&d.0);
    if revive {
        revive_dead_copies(&d.0);
    }
    if damage {
        let log = spacejmp::segment::seg_path(&d.0, "log");
        let mut b = std::fs::read(&log).unwrap();
        // Torn pages (never written: zeros) and flipped bits, in the part
        // of the log the writes used.
        let used = (b.len() / 2).max(8192);
        for _ in 0..4 {
            let p = 4096 * rng.gen_range(1..used / 4096);
            b[p..p + 4096].fill(0);
        }
        for _ in 0..8 {
            let o = rng.gen_range(4096..used);
            b[o] ^= 1 << rng.gen_range(0..8);
        }
        std::fs::write(&log, &b).unwrap();
    }
    let d2 = TempDir::new("par-rec-copy");
    let copy = disk.unwrap_or(&d2.0);
    let _ = std::fs::remove_dir_all(copy);
    copy_dir(&d.0, copy);
    let (serial, rs) = recover(&d.0, 1);
    let (parallel, rp) = recover(copy, 4);
    assert_eq!(serial, parallel, "seed {seed} damage {damage}");
    assert_eq!(rs, rp, "seed {seed} damage {damage}");
    if revive {
        assert!(rs.duplicates > 0, "seed {seed}: {rs:?}");
    }
    if !damage && !revive {
        let want: BTreeMap<_, _> = model.into_iter().map(|(k, v)| (k, Some(v))).collect();
        assert_eq!(serial, want, "seed {seed}");
    } else if !damage {
        // Deleted keys may come back (an older copy revived), but every
        // key written last by a put reads its newest value.
        for (k, v) in model {
            assert_eq!(serial.get(&k), Some(&Some(v)), "seed {seed}");
        }
    }
}

#[test]
fn parallel_recovery_equals_the_serial_walk() {
    for seed in 0..4 {
        for (damage, revive) in [(false, false), (true, false), (false, true), (true, true)] {
            one_case(seed, damage, revive);
        }
    }
}

/// The same on a disk file system: the fused re-derive and rebuild, the
/// index emptied by punching holes in its file and the log read ahead
/// must give what the serial walk gives on tmpfs.
#[test]
fn parallel_recovery_on_a_disk_directory_equals_the_serial_walk() {
    let d = DiskDir::new("par-rec-disk");
    for seed in 10..12 {
        for (damage, revive) in [(false, false), (true, true)] {
            one_case_in(seed, damage, revive, Some(&d.0));
        }
    }
}
