//! What the object checksum adds to a GET or SET: the time of
//! `layout::obj_crc` (CRC-32C over key, value and 18 header bytes) for a
//! 16-byte key and several value sizes, best of several runs, as a
//! micro benchmark (the throughput example's whole operation is ~1 µs and
//! too noisy on a shared machine to show a few ns):
//! `cargo run --release -p nibblejmp --example checksum_cost`

use std::time::Instant;

use nibblejmp::layout::obj_crc;

/// Checksums per timed run.
const ITERS: u64 = 200_000;
/// Timed runs per size (the best is reported).
const RUNS: usize = 7;

fn main() {
    let key = [b'k'; 16];
    let header = [7u8; nibble::object::WIDE_HEADER_BYTES];
    println!("value bytes | ns per checksum | GB/s");
    for vlen in [0usize, 64, 256, 1024, 4096, 65536] {
        let value = vec![b'v'; vlen];
        let mut best = f64::MAX;
        for _ in 0..RUNS {
            let t = Instant::now();
            let mut acc = 0u32;
            for i in 0..ITERS {
                let k = std::hint::black_box(&key);
                acc ^= obj_crc(&header, k, std::hint::black_box(&value)) ^ i as u32;
            }
            std::hint::black_box(acc);
            best = best.min(t.elapsed().as_secs_f64() * 1e9 / ITERS as f64);
        }
        let bytes = (key.len() + vlen + 18) as f64;
        println!("{vlen:>11} | {best:>15.1} | {:>5.1}", bytes / best);
    }
}
