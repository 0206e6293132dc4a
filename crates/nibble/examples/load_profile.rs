//! Profile of the YCSB load phase (`memlab ycsb`'s, without the harness):
//! `records` keys of `value` bytes put by `threads` threads into a store of
//! 2.5 × the data, Nibble-2 by default. Prints the wall time, minor page
//! faults per record and the index's size, so faults and index growth can
//! be told apart (`perf record`, `valgrind --tool=callgrind` run it as is).
//! With `gets` > 0, each thread then makes that many GETs of keys drawn
//! uniformly (a xorshift generator), timed apart: the read path's cost
//! per operation (callgrind: `Store::get_into`'s inclusive count ÷ the
//! GETs).
//!
//! `cargo run --release -p nibble --example load_profile -- [records] [value] [threads] [nibble|nibble2] [prefault|-] [gets] [hint|-]`

use std::time::Instant;

fn minflt() -> u64 {
    // SAFETY: getrusage writes one rusage into the zeroed value we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    ru.ru_minflt as u64
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let arg = |i: usize, d: u64| a.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let records = arg(1, 200_000);
    let value = arg(2, 1024) as usize;
    let threads = arg(3, 2) as usize;
    let mode: nibble::Mode = a
        .get(4)
        .map_or("nibble2", |s| s.as_str())
        .parse()
        .unwrap_or_default();
    let capacity = ((records as f64 * 2.5 * (24 + value + 18) as f64) as usize).max(64 << 20);
    let mut cfg = nibble::Config::new(capacity);
    cfg.mode = mode;
    cfg.prefault = a.get(5).is_some_and(|s| s == "prefault");
    let gets = arg(6, 0);
    // `hint`: tell the store the record count (`Config::expected_keys`),
    // as `memlab ycsb` does; `-` or nothing: no hint (the index grows).
    let hint = a.get(7).is_some_and(|s| s == "hint");
    if hint {
        cfg.expected_keys = records as usize;
    }
    let f0 = minflt();
    let t_new = Instant::now();
    let cfg_prefault = cfg.prefault;
    let store = nibble::Store::new(cfg).expect("store");
    let new_s = t_new.elapsed().as_secs_f64();
    let f_new = minflt();
    let val = vec![7u8; value];
    // Keys are made before the clock starts (the barrier), as YCSB's are
    // cheap next to a put.
    let barrier = std::sync::Barrier::new(threads + 1);
    let mut start = Instant::now();
    let mut f1 = f_new;
    std::thread::scope(|s| {
        for t in 0..threads {
            let (store, val, barrier) = (&store, &val, &barrier);
            s.spawn(move || {
                let keys: Vec<String> = (t as u64..records)
                    .step_by(threads)
                    .map(|i| format!("user{}", i.wrapping_mul(0x100000001b3) ^ 0xcbf29ce484222325))
                    .collect();
                barrier.wait();
                for key in &keys {
                    store.put(key.as_bytes(), val).expect("put");
                }
            });
        }
        barrier.wait();
        f1 = minflt();
        start = Instant::now();
    });
    let secs = start.elapsed().as_secs_f64();
    let f2 = minflt();
    let get_start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads as u64 {
            let store = &store;
            s.spawn(move || {
                let mut buf = Vec::with_capacity(value);
                let mut x = 0x9e37_79b9_7f4a_7c15 ^ (t + 1);
                for _ in 0..gets {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let i = x % records;
                    let key = format!("user{}", i.wrapping_mul(0x100000001b3) ^ 0xcbf29ce484222325);
                    let found = store.get_into(key.as_bytes(), &mut buf).expect("get");
                    assert!(found.is_some(), "record {i} missing");
                }
            });
        }
    });
    let get_secs = get_start.elapsed().as_secs_f64();
    let st = store.stats();
    println!(
        "mode {}{}{} records {records} value {value} threads {threads} capacity {} MiB: new {:.1} ms ({} faults), load {:.1} ms = {:.0} k/s, {:.3} faults/record, index {} KiB, {} resizes",
        mode.name(),
        if cfg_prefault { " prefault" } else { "" },
        if hint { " hint" } else { "" },
        capacity >> 20,
        new_s * 1e3,
        f_new - f0,
        secs * 1e3,
        records as f64 / secs / 1e3,
        (f2 - f1) as f64 / records as f64,
        st.index_bytes >> 10,
        st.index.resizes
    );
    if gets > 0 {
        let n = gets * threads as u64;
        println!(
            "gets {n}: {:.1} ms = {:.0} ns per get per thread (key formatting included)",
            get_secs * 1e3,
            get_secs * 1e9 * threads as f64 / n as f64
        );
    }
}
