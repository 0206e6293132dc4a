//! Clean-restart latency of a shared store: create a store of CAPACITY
//! bytes, fill it, close it (the clean-shutdown seal is written), then time
//! `attach` (which checks the seal: one pass over the index and the meta
//! segment) and the first `get`, then a forced index rebuild (the log walk
//! that recovery runs, checksums included):
//! `cargo run --release -p nibblejmp --example restart -- [CAPACITY_MIB] [KEYS] [VALUE_BYTES]`

use std::time::Instant;

use nibblejmp::{Options, SharedStore};

fn main() -> nibblejmp::Result<()> {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let cap = *args.first().unwrap_or(&1024) << 20;
    let keys = *args.get(1).unwrap_or(&1_000_000);
    let vlen = *args.get(2).unwrap_or(&100) as usize;
    let dir =
        std::path::PathBuf::from(format!("/dev/shm/nibblejmp-restart-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let opts = Options {
        compaction_thread: false,
        ..Options::default()
    };
    let s = SharedStore::create(&dir, cap, &opts)?;
    let value = vec![b'x'; vlen];
    let key = |i: u64| format!("key:{i:012}");
    for i in 0..keys {
        s.put(key(i).as_bytes(), &value)?;
    }
    let g = s.geometry();
    let t = Instant::now();
    s.close()?;
    let close_ms = t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    let s = SharedStore::attach(&dir, &opts)?;
    let attach_ms = t.elapsed().as_secs_f64() * 1e3;
    let got = s.get(key(keys / 2).as_bytes())?;
    let first_ms = t.elapsed().as_secs_f64() * 1e3;
    assert_eq!(got.as_deref(), Some(&value[..]));
    println!(
        "capacity {} MiB, index {} MiB, {keys} keys of {vlen} bytes: close {close_ms:.1} ms, attach {attach_ms:.1} ms, first get at {first_ms:.1} ms, recovery ran: {}",
        cap >> 20,
        (g.index_buckets * 128) >> 20,
        s.recovery_report().ran
    );
    s.close()?;
    // The log scan's cost (every object's checksum included): a forced
    // rebuild, as after a failed seal, and a verification-only recovery
    // as after a crash (the clean flag cleared by hand).
    let t = Instant::now();
    let s = SharedStore::attach(
        &dir,
        &Options {
            rebuild: true,
            ..opts.clone()
        },
    )?;
    let rebuild_ms = t.elapsed().as_secs_f64() * 1e3;
    let indexed = s.recovery_report().objects_indexed;
    s.close()?;
    println!("forced rebuild (verify walk, rebuild, verify walk): {rebuild_ms:.0} ms, {indexed} objects indexed");
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}
