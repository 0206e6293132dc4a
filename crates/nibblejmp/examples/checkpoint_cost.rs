//! What checkpoints cost writers: WRITERS threads SET random keys of
//! VALUE_BYTES bytes (a tenth of them DEL) into a store of CAPACITY MiB in
//! DIR for SECS seconds, with durability on and a flusher thread flushing
//! every second (`appendfsync everysec`), with and without a checkpoint
//! every CKPT_SECS, alternating ROUNDS times; prints operations per second
//! of each and the checkpoint counters.
//! `cargo run --release -p nibblejmp --example checkpoint_cost -- [DIR] [CAPACITY_MIB] [KEYS] [VALUE_BYTES] [SECS] [CKPT_SECS] [ROUNDS] [WRITERS]`

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use nibblejmp::{Options, SharedStore};

fn run(
    dir: &std::path::Path,
    cap: u64,
    keys: u64,
    vlen: usize,
    secs: u64,
    ckpt: Option<Duration>,
    writers: u64,
) -> (f64, String) {
    let _ = std::fs::remove_dir_all(dir);
    let s = SharedStore::create(dir, cap, &Options::default()).expect("create");
    s.set_durable(true).expect("durable");
    let value = vec![b'v'; vlen];
    for i in 0..keys {
        s.put(format!("key:{i:012}").as_bytes(), &value)
            .expect("fill");
    }
    s.flush_to_disk().expect("flush");
    if ckpt.is_some() {
        s.set_checkpoint_interval(ckpt).expect("checkpoints");
    }
    let stop = AtomicBool::new(false);
    let ops = AtomicU64::new(0);
    let t = Instant::now();
    std::thread::scope(|sc| {
        sc.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_secs(1));
                s.flush_to_disk().expect("flush");
            }
        });
        for w in 0..writers {
            let (s, stop, ops, value) = (&s, &stop, &ops, &value);
            sc.spawn(move || {
                let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (w + 1);
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..256 {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let k = format!("key:{:012}", x % keys);
                        if x.is_multiple_of(10) {
                            s.delete(k.as_bytes()).expect("del");
                        } else {
                            s.put(k.as_bytes(), value).expect("set");
                        }
                    }
                    n += 256;
                }
                ops.fetch_add(n, Ordering::Relaxed);
            });
        }
        std::thread::sleep(Duration::from_secs(secs));
        stop.store(true, Ordering::Relaxed);
    });
    let rate = ops.load(Ordering::Relaxed) as f64 / t.elapsed().as_secs_f64();
    let st = s.checkpoint_stats();
    drop(s.close());
    let _ = std::fs::remove_dir_all(dir);
    (rate, format!("{st:?}"))
}

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let dir = std::path::PathBuf::from(
        argv.first()
            .cloned()
            .unwrap_or_else(|| "/var/tmp/nibblejmp-ckpt-cost".into()),
    );
    let num = |i: usize, d: u64| argv.get(i).and_then(|a| a.parse().ok()).unwrap_or(d);
    let (cap, keys, vlen, secs, every, rounds, writers) = (
        num(1, 1024) << 20,
        num(2, 500_000),
        num(3, 100) as usize,
        num(4, 10),
        num(5, 2),
        num(6, 3),
        num(7, 2),
    );
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for r in 0..rounds {
        let (a, _) = run(&dir, cap, keys, vlen, secs, None, writers);
        let (b, st) = run(
            &dir,
            cap,
            keys,
            vlen,
            secs,
            Some(Duration::from_secs(every)),
            writers,
        );
        println!("round {r}: without checkpoints {a:.0} ops/s, with one every {every} s {b:.0} ops/s ({:.3}x); {st}", b / a);
        off.push(a);
        on.push(b);
    }
    off.sort_by(f64::total_cmp);
    on.sort_by(f64::total_cmp);
    let (a, b) = (off[off.len() / 2], on[on.len() / 2]);
    println!(
        "median: without {a:.0} ops/s, with {b:.0} ops/s: {:.3}x",
        b / a
    );
}
