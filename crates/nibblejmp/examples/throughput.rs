//! Single-process GET and SET throughput on a shared store (a quick check,
//! not the `memlab shared` benchmark):
//! `cargo run --release -p nibblejmp --example throughput -- [KEYS] [VALUE_BYTES] [SECONDS]`

use std::time::{Duration, Instant};

use nibblejmp::{Options, SharedStore};

fn main() -> nibblejmp::Result<()> {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let keys = *args.first().unwrap_or(&100_000);
    let vlen = *args.get(1).unwrap_or(&64) as usize;
    let secs = *args.get(2).unwrap_or(&2);
    let dir = std::path::PathBuf::from(format!(
        "/dev/shm/nibblejmp-throughput-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let cap = (keys * (vlen as u64 + 64) * 4).max(64 << 20);
    let s = SharedStore::create(&dir, cap, &Options::default())?;
    let value = vec![b'x'; vlen];
    let key = |i: u64| format!("key:{i:012}");
    for i in 0..keys {
        s.put(key(i).as_bytes(), &value)?;
    }
    let mut x = 88172645463325252u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % keys
    };
    for (name, is_get) in [("GET", true), ("SET", false)] {
        let t0 = Instant::now();
        let mut n = 0u64;
        while t0.elapsed() < Duration::from_secs(secs) {
            for _ in 0..1000 {
                let k = key(next());
                if is_get {
                    std::hint::black_box(s.get(k.as_bytes())?);
                } else {
                    s.put(k.as_bytes(), &value)?;
                }
            }
            n += 1000;
        }
        let dt = t0.elapsed().as_secs_f64();
        println!(
            "{name}: {:.0} ops/s ({:.0} ns/op), {keys} keys, {vlen}-byte values",
            n as f64 / dt,
            dt * 1e9 / n as f64
        );
    }
    println!("{:?}", s.stats());
    s.close()?;
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}
