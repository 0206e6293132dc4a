//! Fuzzy checkpoints and power cuts (`store/checkpoint.rs`,
//! `recovery/ckpt.rs`).
//!
//! A child process runs a small store that compacts, with durability on,
//! the power-loss test layer (`store/durability.rs`: a durable image that
//! only completed flushes update) and a checkpoint every 60 ms. Two
//! writers each own 150 keys and go through them in rounds: in round `r`
//! each key is deleted (one in four, by a hash) or set to a value naming
//! the round (an overwrite when it exists). After a round a writer flushes
//! and then appends "writer round" to an acknowledgement file: that round
//! is acknowledged, as `appendfsync always` acknowledges a write after a
//! flush covers it. The parent SIGKILLs the child at a random moment
//! (checkpoints run a tenth of the time or more, so some cuts land in
//! one), replaces the store's files with the image (in odd rounds plus a
//! random half of the pages written since: the kernel's write-back), marks
//! another boot and attaches. Then every key holds the outcome of its
//! writer's last acknowledged round or of the round after (never an older
//! value, never a deleted key back), the item count is exact, and the
//! restart used the checkpoint. The last cut also damages the checkpoint
//! file: the full pass runs and the same holds.
//!
//! `CKPT_CUT_SEED=N` replays a run; `CKPT_CUT_ROUNDS=N` cuts N times
//! instead of 4.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use nibblejmp::{Options, SharedStore};

mod common;

const WRITERS: u64 = 2;
const KEYS: u64 = 150;
const MAX_X: u64 = 3000;
const CAPACITY_BYTES: u64 = 16 << 20;
const CHECKPOINT_MS: u64 = 60;

/// The test's directory (removed when dropped): the store, the power
/// image and the writers' acknowledgements.
struct Dirs {
    base: PathBuf,
    _dir: common::TempDir,
}

impl Dirs {
    fn new(tag: &str) -> Dirs {
        let dir = common::TempDir::new(&format!("ckpt-{tag}"));
        std::fs::create_dir_all(&dir.0).unwrap();
        Dirs {
            base: dir.0.clone(),
            _dir: dir,
        }
    }
    fn store(&self) -> PathBuf {
        self.base.join("store")
    }
    fn image(&self) -> PathBuf {
        self.base.join("image")
    }
    fn acks(&self) -> PathBuf {
        self.base.join("acks")
    }
}

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn key(w: u64, n: u64) -> String {
    format!("w{w}:k{n}")
}

/// Round `r`'s outcome for key `n` of writer `w`: `None` = deleted.
fn outcome(w: u64, n: u64, r: u64) -> Option<String> {
    let h = (w * 1_000_003 + n * 7919 + r * 104_729).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 60;
    (!h.is_multiple_of(4)).then(|| {
        let len = (r * 7919 + n * 31) % MAX_X;
        format!("{w}:{n}:{r}:{}", "x".repeat(len as usize))
    })
}

fn child_opts() -> Options {
    Options {
        oom_wait: Duration::from_secs(5),
        ..Options::default()
    }
}

/// The child: run the writers until killed.
#[test]
fn child() {
    let Ok(dir) = std::env::var("NJ_CKPT_DIR") else {
        return;
    };
    let dirs = PathBuf::from(dir);
    if std::env::var("NJ_CKPT_ROLE").as_deref() == Ok("tomb") {
        return tomb_child(&dirs);
    }
    let base: u64 = std::env::var("NJ_CKPT_BASE").unwrap().parse().unwrap();
    let store = dirs.join("store");
    let s = if base == 0 {
        SharedStore::create(&store, CAPACITY_BYTES, &child_opts()).unwrap()
    } else {
        SharedStore::attach(&store, &child_opts()).unwrap()
    };
    s.set_durable(true).unwrap();
    let _ = std::fs::remove_dir_all(dirs.join("image"));
    s.keep_power_image(&dirs.join("image")).unwrap();
    if std::env::var_os("NJ_NO_CKPT").is_none() {
        s.set_checkpoint_interval(Some(Duration::from_millis(CHECKPOINT_MS)))
            .unwrap();
    }
    // Ready: the image exists.
    std::fs::write(dirs.join("ready"), b"1").unwrap();
    std::thread::scope(|sc| {
        for w in 0..WRITERS {
            let (s, dirs) = (&s, &dirs);
            sc.spawn(move || {
                let mut acks = std::fs::OpenOptions::new()
                    .append(true)
                    .create(true)
                    .open(dirs.join("acks"))
                    .unwrap();
                for r in base.. {
                    for n in 0..KEYS {
                        let k = key(w, n);
                        match outcome(w, n, r) {
                            Some(v) => s.put(k.as_bytes(), v.as_bytes()).unwrap(),
                            None => {
                                s.delete(k.as_bytes()).unwrap();
                            }
                        }
                    }
                    s.flush_to_disk().unwrap();
                    acks.write_all(format!("{w} {r}\n").as_bytes()).unwrap();
                }
            });
        }
    });
}

fn spawn_child(d: &Dirs, base: u64) -> Child {
    let _ = std::fs::remove_file(d.base.join("ready"));
    let _ = std::fs::remove_file(d.acks());
    Command::new(std::env::current_exe().unwrap())
        .args(["child", "--exact", "--nocapture", "--test-threads=1"])
        .env("NJ_CKPT_DIR", &d.base)
        .env("NJ_CKPT_BASE", base.to_string())
        .spawn()
        .unwrap()
}

/// The power cut (see the module doc): the image's last complete
/// generation over the store's files, plus, with `writeback`, a random
/// half of the pages that differ.
fn cut(d: &Dirs, mut writeback: Option<&mut Rng>) -> usize {
    nibblejmp::testing::apply_power_cut(&d.store(), &d.image(), || {
        writeback
            .as_deref_mut()
            .is_some_and(|rng| rng.below(2) == 0)
    })
    .unwrap()
}

/// Last acknowledged round per writer.
fn acked(d: &Dirs) -> HashMap<u64, u64> {
    let mut m = HashMap::new();
    for l in std::fs::read_to_string(d.acks())
        .unwrap_or_default()
        .lines()
    {
        let mut it = l.split(' ');
        let (Some(w), Some(r)) = (it.next(), it.next()) else {
            continue;
        };
        let (w, r): (u64, u64) = (w.parse().unwrap(), r.parse().unwrap());
        let e = m.entry(w).or_insert(r);
        *e = (*e).max(r);
    }
    m
}

/// Check the recovered store; returns the keys present.
fn check(
    s: &SharedStore,
    acks: &HashMap<u64, u64>,
    base: u64,
    prev: &mut HashMap<String, Option<String>>,
) -> u64 {
    let mut present = 0;
    for w in 0..WRITERS {
        for n in 0..KEYS {
            let k = key(w, n);
            let got = s
                .get(k.as_bytes())
                .unwrap()
                .map(|v| String::from_utf8(v).unwrap());
            let allowed = match acks.get(&w) {
                Some(&r) => vec![outcome(w, n, r), outcome(w, n, r + 1)],
                None => vec![prev.get(&k).cloned().flatten(), outcome(w, n, base)],
            };
            assert!(
                allowed.contains(&got),
                "{k}: got {:?}, allowed {:?} (last acknowledged round {:?})",
                got.as_deref().map(|v| &v[..v.len().min(24)]),
                allowed
                    .iter()
                    .map(|a| a.as_deref().map(|v| &v[..v.len().min(24)]))
                    .collect::<Vec<_>>(),
                acks.get(&w)
            );
            present += u64::from(got.is_some());
            prev.insert(k, got);
        }
    }
    assert_eq!(s.len(), present, "the item count is not exact");
    present
}

#[test]
fn power_cuts_with_checkpoints_lose_no_acknowledged_write() {
    let seed = std::env::var("CKPT_CUT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    let rounds: u64 = std::env::var("CKPT_CUT_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4);
    println!("seed {seed} (CKPT_CUT_SEED={seed} replays it)");
    let mut rng = Rng(seed);
    let d = Dirs::new("cuts");
    let mut prev = HashMap::new();
    let mut used_checkpoint = 0;
    for round in 0..rounds {
        let base = round * 1_000_000;
        let mut c = spawn_child(&d, base);
        while !d.base.join("ready").exists() {
            assert!(c.try_wait().unwrap().is_none(), "the child died");
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(250 + rng.below(700)));
        // SAFETY: kill on our own child's pid.
        unsafe { libc::kill(c.id() as i32, libc::SIGKILL) };
        let _ = c.wait();
        let acks = acked(&d);
        let pages = cut(&d, (round % 2 == 1).then_some(&mut rng));
        let last = round + 1 == rounds;
        // A damaged checkpoint: the full pass. (A delete that found the
        // small log full may have removed the file: the full pass too.)
        let mut damaged = false;
        if last {
            let p = d.store().join("checkpoint");
            if let Ok(mut b) = std::fs::read(&p) {
                let i = rng.below(b.len() as u64) as usize;
                b[i] ^= 0x10;
                std::fs::write(&p, b).unwrap();
                damaged = true;
            }
        }
        let s = SharedStore::attach(d.store(), &common::quiet()).unwrap();
        let r = s.recovery_report().clone();
        println!("round {round}: {r:?}");
        let keys = check(&s, &acks, base, &mut prev);
        println!(
            "round {round}: acknowledged rounds {acks:?}, {keys} keys, {pages} unflushed pages kept; checkpoint epoch {}, {} keys from it, {} segments walked, {} tombstones applied, fallback {:?}",
            r.checkpoint_epoch, r.checkpoint_keys, r.segments_walked, r.tombstones_applied, r.checkpoint_fallback
        );
        assert!(r.meta_rederived, "{r:?}");
        if last {
            assert_eq!(r.checkpoint_epoch, 0, "{r:?}");
            assert_eq!(r.checkpoint_fallback.is_some(), damaged, "{r:?}");
        } else if r.checkpoint_epoch > 0 {
            used_checkpoint += 1;
        }
        s.close().unwrap();
    }
    // A delete that finds the small log full writes no tombstone and
    // removes the checkpoint (`store/checkpoint.rs`), so not every
    // restart has one; most do.
    assert!(
        used_checkpoint * 2 >= rounds - 1,
        "only {used_checkpoint} of {rounds} restarts used a checkpoint"
    );
}

/// The child of [`deletes_then_compaction_then_cut`]: fill, checkpoint,
/// delete every other key, churn until compaction has moved the segments
/// holding the tombstones, flush, and die attached.
fn tomb_child(dirs: &Path) {
    let s = SharedStore::create(dirs.join("store"), CAPACITY_BYTES, &child_opts()).unwrap();
    s.set_durable(true).unwrap();
    s.keep_power_image(&dirs.join("image")).unwrap();
    let ck = std::env::var_os("NJ_NO_CKPT").is_none();
    if ck {
        // One checkpoint only (the one taken below), so the deletes'
        // tombstones stay needed through the compaction.
        s.set_checkpoint_on_log_written(false);
        s.set_checkpoint_interval(Some(Duration::from_secs(3600)))
            .unwrap();
    }
    let v = vec![b'v'; 2000];
    for i in 0..2000u32 {
        s.put(format!("k{i}").as_bytes(), &v).unwrap();
    }
    if ck {
        s.checkpoint_now().unwrap();
    }
    for i in (0..2000u32).step_by(2) {
        assert!(s.delete(format!("k{i}").as_bytes()).unwrap());
    }
    // Churn: overwrites of another 1000 keys, enough for compaction to
    // move the segments holding tombstones, not enough to reuse every
    // segment (so the checkpoint's records are used).
    for round in 0..2u8 {
        for i in 2000..3000u32 {
            s.put(format!("k{i}").as_bytes(), &[round; 1500]).unwrap();
        }
    }
    s.compact_now().unwrap();
    s.flush_to_disk().unwrap();
    let st = s.checkpoint_stats();
    assert!(!ck || st.tombstones >= 1000, "{st:?}");
    assert!(!ck || st.tombstones_kept > 0, "{st:?}");
    std::fs::write(dirs.join("ready"), b"1").unwrap();
    std::mem::forget(s);
    // SAFETY: `_exit` ends the process at once (a power cut: the store is
    // left attached); nothing after it runs.
    unsafe { libc::_exit(0) }
}

/// Tombstones survive compaction while the completed checkpoint needs
/// them, and a checkpoint recovery after deletes and compaction is exact.
#[test]
fn deletes_then_compaction_then_cut() {
    let d = Dirs::new("tomb");
    let mut c = Command::new(std::env::current_exe().unwrap())
        .args(["child", "--exact", "--nocapture", "--test-threads=1"])
        .env("NJ_CKPT_DIR", &d.base)
        .env("NJ_CKPT_ROLE", "tomb")
        .spawn()
        .unwrap();
    c.wait().unwrap();
    assert!(d.base.join("ready").exists(), "the child failed");
    cut(&d, None);
    let s = SharedStore::attach(d.store(), &common::quiet()).unwrap();
    let r = s.recovery_report().clone();
    println!("{r:?}");
    assert!(r.checkpoint_epoch > 0, "{r:?}");
    // Most runs load keys from the checkpoint's records; when the child's
    // compaction thread happened to move every segment after the
    // checkpoint, all of them are walked instead (`checkpoint_keys` 0):
    // the checks below hold either way.
    assert_eq!(r.damaged_objects, 0, "{r:?}");
    for i in 0..2000u32 {
        let got = s.get(format!("k{i}").as_bytes()).unwrap();
        assert_eq!(got.is_some(), i % 2 == 1, "k{i}: {r:?}");
    }
    for i in 2000..3000u32 {
        assert_eq!(
            s.get(format!("k{i}").as_bytes()).unwrap().as_deref(),
            Some(&[1u8; 1500][..])
        );
    }
    assert_eq!(s.len(), 2000);
    s.close().unwrap();
}
