//! Per-operation time of `get_into` and `put` on a shared store, single
//! thread, keys formatted beforehand and one reused buffer, best of
//! several runs (the spread of a shared machine shows in the worst):
//! `cargo run --release -p nibblejmp --example get_cost -- [KEYS] [VALUE_BYTES] [RUNS]`

use std::time::Instant;

use nibblejmp::{Options, SharedStore};

/// Operations per timed run.
const OPS_PER_RUN: usize = 1_000_000;

fn main() -> nibblejmp::Result<()> {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let n = *args.first().unwrap_or(&100_000) as usize;
    let vlen = *args.get(1).unwrap_or(&4) as usize;
    let runs = *args.get(2).unwrap_or(&7) as usize;
    let dir = std::path::PathBuf::from(format!(
        "/dev/shm/nibblejmp-get-cost-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let cap = (n as u64 * (vlen as u64 + 64) * 4).max(64 << 20);
    let opts = Options {
        compaction_thread: false,
        ..Options::default()
    };
    let s = SharedStore::create(&dir, cap, &opts)?;
    let value = vec![b'x'; vlen];
    let keys: Vec<Vec<u8>> = (0..n)
        .map(|i| format!("key:{i:012}").into_bytes())
        .collect();
    for k in &keys {
        s.put(k, &value)?;
    }
    let mut order: Vec<usize> = (0..OPS_PER_RUN).map(|i| (i * 7919) % n).collect();
    order.rotate_left(n / 3);
    let mut buf = Vec::with_capacity(vlen);
    for (name, get) in [("get_into", true), ("put", false)] {
        let mut ns = Vec::new();
        for _ in 0..runs {
            let t = Instant::now();
            for &i in &order {
                if get {
                    std::hint::black_box(s.get_into(&keys[i], &mut buf)?);
                } else {
                    s.put(&keys[i], &value)?;
                }
            }
            ns.push(t.elapsed().as_secs_f64() * 1e9 / OPS_PER_RUN as f64);
            if !get {
                s.compact_now()?;
            }
        }
        ns.sort_by(f64::total_cmp);
        println!(
            "{name}: best {:.0} ns, median {:.0} ns, worst {:.0} ns per op ({n} keys, {vlen}-byte values, {runs} runs of {OPS_PER_RUN})",
            ns[0],
            ns[ns.len() / 2],
            ns[ns.len() - 1]
        );
    }
    s.close()?;
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}
