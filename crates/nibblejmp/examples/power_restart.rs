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

fn main() {
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
        let value = vec![b'v'; vlen];
        for i in 0..keys {
            if let Err(e) = s.put(format!("key:{i:012}").as_bytes(), &value) {
                eprintln!("stopped filling at {i} keys: {e}");
                break;
            }
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
            "run {run}: power-cut attach {ms:.0} ms, {} objects indexed, {} items, meta re-derived: {}, rebuilt: {}",
            r.objects_indexed,
            s.len(),
            r.meta_rederived,
            r.rebuilt
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
