//! Restart after a power cut: a child process creates a store of CAPACITY
//! bytes in DIR, fills it with KEYS keys of VALUE_BYTES bytes (some
//! overwritten, so the log holds dead copies too) and exits without
//! closing it (the clean flag stays cleared); the boot marker is then
//! rewritten to name another boot, so the next attach takes the power-cut
//! path: segment states re-derived from the log, the index rebuilt from
//! it, then verified. The parent times that attach RUNS times (the store
//! is re-marked unclean between runs by the same child-exit trick on a
//! copy-free path: a child attaches and exits without closing).
//! `cargo run --release -p nibblejmp --example power_restart -- [DIR] [CAPACITY_MIB] [KEYS] [VALUE_BYTES] [RUNS]`
//! (`KEEP=1` keeps DIR; KEYS = 0 then recovers it again without filling).
//! With `CKPT=1` the child fills with durability and checkpoints on, takes
//! a checkpoint after the first pass of puts and does the overwrites
//! after it, so the attach recovers from the checkpoint and walks only
//! the segments written since (`store/checkpoint.rs`).

use std::time::Instant;

use nibblejmp::{Options, SharedStore};

/// Leave the store attached and die without running destructors (as a
/// power cut or SIGKILL would).
fn die_attached(s: SharedStore) -> ! {
    std::mem::forget(s);
    // SAFETY: `_exit` ends the process at once; nothing after it runs.
    unsafe { libc::_exit(0) }
}

/// Run `f` in a forked child and wait for it.
fn in_child(f: impl FnOnce()) {
    // SAFETY: the process is single-threaded here (no store attached in
    // the parent), so the child may run arbitrary code after fork.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        f();
        // SAFETY: as in `die_attached`.
        unsafe { libc::_exit(0) }
    }
    let mut st = 0;
    // SAFETY: `pid` is our child; `st` is a valid out-pointer.
    unsafe { libc::waitpid(pid, &mut st, 0) };
}

/// `LOG=1`: recovery's debug lines (phase times) on stderr.
struct StderrLog;

impl log::Log for StderrLog {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, r: &log::Record<'_>) {
        eprintln!("{} {}", r.level(), r.args());
    }
    fn flush(&self) {}
}

fn main() {
    if std::env::var_os("LOG").is_some() {
        let _ = log::set_logger(&StderrLog);
        log::set_max_level(log::LevelFilter::Debug);
    }
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let dir = std::path::PathBuf::from(
        argv.first()
            .cloned()
            .unwrap_or_else(|| "/var/tmp/nibblejmp-power".into()),
    );
    let num = |i: usize, d: u64| argv.get(i).and_then(|a| a.parse().ok()).unwrap_or(d);
    let cap = num(1, 1024) << 20;
    let keys = num(2, 519_000);
    let vlen = num(3, 1000) as usize;
    let runs = num(4, 3);
    let opts = Options {
        compaction_thread: false,
        ..Options::default()
    };
    // KEYS = 0: recover the store left in DIR by an earlier run with
    // KEEP=1 (to profile the recovery alone).
    let fill = keys > 0;
    let (d2, o2) = (dir.clone(), opts.clone());
    in_child(move || {
        if !fill {
            return;
        }
        let _ = std::fs::remove_dir_all(&d2);
        let s = SharedStore::create(&d2, cap, &o2).expect("create");
        let ckpt = std::env::var_os("CKPT").is_some();
        if ckpt {
            s.set_durable(true).expect("durable");
            s.set_checkpoint_interval(Some(std::time::Duration::from_secs(1 << 20)))
                .expect("checkpoints");
        }
        let value = vec![b'v'; vlen];
        for i in 0..keys {
            if let Err(e) = s.put(format!("key:{i:012}").as_bytes(), &value) {
                eprintln!("stopped filling at {i} keys: {e}");
                break;
            }
        }
        if ckpt {
            let t = Instant::now();
            s.checkpoint_now().expect("checkpoint");
            let st = s.checkpoint_stats();
            println!(
                "checkpoint: {:.0} ms, {} keys, {} bytes",
                t.elapsed().as_secs_f64() * 1e3,
                st.last_keys,
                st.last_bytes
            );
        }
        for i in 0..keys / 10 {
            if s.put(format!("key:{i:012}").as_bytes(), &value).is_err() {
                break;
            }
        }
        die_attached(s)
    });
    let mut times = Vec::new();
    for run in 0..runs {
        std::fs::write(dir.join("boot_id"), "an-earlier-boot\n").expect("boot marker");
        let t = Instant::now();
        let s = SharedStore::attach(&dir, &opts).expect("attach");
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let r = s.recovery_report().clone();
        println!(
            "run {run}: power-cut attach {ms:.0} ms, {} objects indexed, {} items, meta re-derived: {}, rebuilt: {}, checkpoint epoch {} ({} keys from it, {} of {} segments walked{})",
            r.objects_indexed,
            s.len(),
            r.meta_rederived,
            r.rebuilt,
            r.checkpoint_epoch,
            r.checkpoint_keys,
            r.segments_walked,
            s.geometry().log_segments,
            r.checkpoint_fallback
                .as_deref()
                .map(|w| format!("; not used: {w}"))
                .unwrap_or_default()
        );
        times.push(ms);
        // Leave it unclean again for the next run.
        drop(s.close());
        let (d3, o3) = (dir.clone(), opts.clone());
        in_child(move || die_attached(SharedStore::attach(&d3, &o3).expect("attach")));
    }
    times.sort_by(f64::total_cmp);
    println!(
        "median of {runs}: {:.0} ms [{:.0}, {:.0}]",
        times[times.len() / 2],
        times[0],
        times[times.len() - 1]
    );
    if std::env::var_os("KEEP").is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
}
