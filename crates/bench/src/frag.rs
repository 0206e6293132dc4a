//! `memlab frag`: memory bloat under a destructive allocation pattern
//! (dissertation §5.2, Fig. 14; the pattern is RAMCloud's, Rumble et al.
//! FAST '14, ref. [151]).
//!
//! ```text
//!  live ▲
//!    T ─┤   ╱▔▔▔▔╲              ╱▔▔▔  (or an insert fails: completed = false)
//!       │  ╱ size A╲  delete   ╱ size B
//!       │ ╱         ╲  90 %   ╱
//!  0.1T ┤╱           ╲_______╱
//!       └──────────────────────────────▶ time          then: RSS of the process
//! ```
//!
//! For each size pair (A, B): insert objects of A bytes until the live data
//! (the sum of key + value sizes stored) reaches the target T; delete 90 %
//! of them, chosen at random (a hash of the object's id decides, visited in
//! a scrambled order); then insert objects of B bytes until live data is
//! back at T or an insert fails. Then read VmRSS: bloat = RSS / live data.
//! An object of "size S" is a 16-byte key and an (S - 16)-byte value, so
//! live bytes are what a client stored, with no store overhead.
//!
//! Each (system, pair) runs in a fresh process (module `child`), so the RSS
//! is that of the store alone plus the process's fixed few MiB
//! (`rss_base_bytes`: RSS before the system was built, the same for every
//! system; `rss_empty_bytes`: RSS with the empty store built). `bloat` is
//! the whole process's RSS / live data, the primary figure;
//! `bloat_store` = (RSS - `rss_base_bytes`) / live data is the system's
//! own share, without the benchmark's code and heap. The benchmark keeps
//! no per-object state of its own: which objects to delete comes from a
//! hash of the id, so nothing but the store grows with the data.
//!
//! Nibble variants get a capacity of 1.5 × T. Capacity is a limit, not a
//! footprint: the index, block metadata and a 1 % compaction reserve come
//! out of it, and only what is touched counts in RSS. When an insert fails
//! with out-of-memory, the store is compacted (`compact_now`) and the
//! insert retried once; if it fails again the phase stops and the row says
//! `completed = false` and why. Small objects barely fit: Nibble's object
//! header is 8 bytes, which for 64-byte objects with 16-byte keys is 12.5 %
//! more than the client's data, and the index, sized for the most keys
//! the store has held, adds 8.5 bytes per slot.
//!
//! Before RSS is read every system gets the idle-time cleanup a long-running
//! service would do (`Kv::trim`): glibc `malloc_trim(0)`, jemalloc
//! `arena.<all>.purge`, mimalloc `mi_collect(true)`, and for Nibble a
//! compaction pass plus `release_memory` (what its compaction workers do by
//! themselves after the 1 s decay time). `bloat_untrimmed` is the figure
//! before that cleanup.
//!
//! Default pairs (bytes): 64→128, 256→512, 1000→1024, 1024→256,
//! 1024→4096, 4096→10240, 10240→102400, 102400→10240 — from 64 B to 100 KiB,
//! growing (the new objects do not fit the holes the old ones left) and
//! shrinking (they fit, but a non-copying allocator keeps whole pages alive
//! for a few survivors).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::child::{self, Job};
use crate::error::{Context, Result};
use crate::kv::{Kv, KvError, System};
use crate::report::{Reporter, Row};
use crate::util::{self, Spread, Watchdog};

/// Key bytes of every object.
pub const KEY_BYTES: usize = 16;
/// Nibble capacity = this × the target.
pub const CAPACITY_FACTOR: f64 = 1.5;
/// Share of the first-size objects deleted, per mille.
pub const DELETE_PERMILLE: u64 = 900;
/// The default size pairs.
pub const DEFAULT_PAIRS: [(usize, usize); 8] = [
    (64, 128),
    (256, 512),
    (1000, 1024),
    (1024, 256),
    (1024, 4096),
    (4096, 10240),
    (10240, 102_400),
    (102_400, 10240),
];

/// One child's work: one system, one pair.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct FragJob {
    pub system: System,
    pub size_a: usize,
    pub size_b: usize,
    pub target_bytes: u64,
    pub capacity: usize,
    pub compact_timeout_ms: u64,
    pub seed: u64,
}

/// Nibble's own figures at the end.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct NibbleFigures {
    pub live_bytes: u64,
    pub capacity_bytes: u64,
    pub pool_bytes: u64,
    pub index_bytes: u64,
    /// Blocks holding log data (heads, closed and retired segments), bytes.
    pub log_bytes: u64,
    pub segments_compacted: u64,
    pub bytes_relocated: u64,
}

/// What one cell measured.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct FragCell {
    pub live_bytes: u64,
    pub rss_bytes: u64,
    /// RSS before the system under test was built: the benchmark
    /// process's own code, libraries and heap, the same for every system.
    #[serde(default)]
    pub rss_base_bytes: u64,
    pub rss_empty_bytes: u64,
    /// The file-backed part of `rss_bytes` (code and libraries).
    #[serde(default)]
    pub rss_file_bytes: u64,
    pub rss_after_a_bytes: u64,
    /// RSS before the systems' idle cleanup (`Kv::trim`).
    pub rss_untrimmed_bytes: u64,
    pub completed: bool,
    /// Why a phase stopped early.
    pub stop: Option<String>,
    /// The same, short: `A 40% index; B 75% index`.
    pub stop_short: Option<String>,
    pub objects_a: u64,
    pub deleted: u64,
    pub objects_b: u64,
    pub forced_compactions: u64,
    pub secs: f64,
    pub nibble: Option<NibbleFigures>,
}

/// The 16-byte key of object `id`: `f` and 15 hex digits.
fn key_of(id: u64, buf: &mut [u8; KEY_BYTES]) -> &[u8] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    buf[0] = b'f';
    for i in 0..KEY_BYTES - 1 {
        buf[KEY_BYTES - 1 - i] = HEX[((id >> (4 * i)) & 15) as usize];
    }
    &buf[..]
}

/// splitmix64: decides which objects are deleted.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// A stride coprime to `n`: `i -> (i * stride + off) mod n` visits `0..n`
/// once each, in a scrambled order, with no table.
fn stride_for(n: u64) -> u64 {
    if n <= 1 {
        return 1;
    }
    let mut s = ((n as f64 * 0.618_033_988_7) as u64) | 1;
    while gcd(s, n) != 1 {
        s += 2;
    }
    s % n
}

struct Inserter<'a> {
    kv: &'a dyn Kv,
    timeout: Duration,
    forced: u64,
}

impl Inserter<'_> {
    /// Insert; on out-of-memory in a Nibble store, compact once and retry once.
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), KvError> {
        match self.kv.put(key, value) {
            Err(KvError::OutOfMemory(m)) => {
                let Some(store) = self.kv.nibble() else {
                    return Err(KvError::OutOfMemory(m));
                };
                self.forced += 1;
                store.compact_now(self.timeout);
                self.kv.put(key, value).map_err(|e| {
                    KvError::Other(format!("{e} (again after compact_now; first: {m})"))
                })
            }
            r => r,
        }
    }
}

/// Run one cell (in the child).
pub fn run_job(job: &FragJob, emit: &mut dyn FnMut(FragCell)) -> Result<()> {
    let what = format!("frag {} {}->{}", job.system, job.size_a, job.size_b);
    for s in [job.size_a, job.size_b] {
        if s <= KEY_BYTES + 8 {
            return Err(format!(
                "{what}: object size {s} must exceed {} bytes",
                KEY_BYTES + 8
            )
            .into());
        }
    }
    let _wd = Watchdog::arm(
        Duration::from_secs(1200) + Duration::from_millis(job.compact_timeout_ms * 4),
        what.clone(),
    );
    let t0 = Instant::now();
    let rss_base = util::rss_bytes().unwrap_or(0);
    let kv = job.system.build(job.capacity)?;
    let kv: &dyn Kv = &*kv;
    let rss_empty = util::rss_bytes().unwrap_or(0);
    let mut ins = Inserter {
        kv,
        timeout: Duration::from_millis(job.compact_timeout_ms),
        forced: 0,
    };
    let target = job.target_bytes;
    let mut kbuf = [0u8; KEY_BYTES];
    let mut val = crate::ycsb::filler_value(job.size_a.max(job.size_b) - KEY_BYTES, job.seed);
    let mut live = 0u64;
    let mut stop: Option<String> = None;
    let mut short: Vec<String> = Vec::new();
    let shorten = |phase: &str, live: u64, e: &str| {
        let what = if e.contains("(index)") {
            "index full"
        } else if e.contains("(log)") {
            "log full"
        } else {
            "error"
        };
        format!("{phase} {:.0}% {what}", 100.0 * live as f64 / target as f64)
    };
    // Phase A.
    let (va, vb) = (job.size_a - KEY_BYTES, job.size_b - KEY_BYTES);
    let mut id = 0u64;
    while live < target {
        val[..8].copy_from_slice(&id.to_le_bytes());
        if let Err(e) = ins.put(key_of(id, &mut kbuf), &val[..va]) {
            short.push(shorten("A", live, &e.to_string()));
            stop = Some(format!(
                "size-A insert {} failed at {:.1}% of the target: {e}",
                id + 1,
                100.0 * live as f64 / target as f64
            ));
            break;
        }
        live += job.size_a as u64;
        id += 1;
    }
    let objects_a = id;
    let rss_after_a = util::rss_bytes().unwrap_or(0);
    // Delete 90 %, chosen by hash, visited in a scrambled order.
    let (stride, off) = (stride_for(objects_a), mix(job.seed) % objects_a.max(1));
    let mut deleted = 0u64;
    for i in 0..objects_a {
        let id = ((i as u128 * stride as u128 + off as u128) % objects_a as u128) as u64;
        if mix(id ^ job.seed.rotate_left(32)) % 1000 >= DELETE_PERMILLE {
            continue;
        }
        match kv.delete(key_of(id, &mut kbuf)) {
            Ok(true) => {
                live -= job.size_a as u64;
                deleted += 1;
            }
            Ok(false) => {
                return Err(
                    format!("{what}: object {id} of size A was not found for delete").into(),
                )
            }
            Err(e) => return Err(e).with_context(|| format!("{what}: delete of object {id}")),
        }
    }
    // Phase B.
    let mut id = objects_a;
    while live < target {
        val[..8].copy_from_slice(&id.to_le_bytes());
        if let Err(e) = ins.put(key_of(id, &mut kbuf), &val[..vb]) {
            short.push(shorten("B", live, &e.to_string()));
            let msg = format!(
                "size-B insert {} failed at {:.1}% of the target: {e}",
                id - objects_a + 1,
                100.0 * live as f64 / target as f64
            );
            stop = Some(match stop {
                Some(a) => format!("{a}; {msg}"),
                None => msg,
            });
            break;
        }
        live += job.size_b as u64;
        id += 1;
    }
    let rss_untrimmed = util::rss_bytes().unwrap_or(0);
    kv.trim();
    let rss = util::rss_bytes().ok_or_else(|| format!("{what}: cannot read VmRSS"))?;
    let nibble = kv.nibble().map(|s| {
        let st = s.stats();
        NibbleFigures {
            live_bytes: st.live_bytes,
            capacity_bytes: st.capacity_bytes,
            pool_bytes: st.pool_bytes,
            index_bytes: st.index_bytes,
            log_bytes: st.blocks_in_use * nibble::memory::BLOCK_BYTES as u64,
            segments_compacted: st.segments_compacted,
            bytes_relocated: st.bytes_relocated,
        }
    });
    emit(FragCell {
        live_bytes: live,
        rss_bytes: rss,
        rss_base_bytes: rss_base,
        rss_file_bytes: util::rss_file_bytes().unwrap_or(0),
        rss_empty_bytes: rss_empty,
        rss_after_a_bytes: rss_after_a,
        rss_untrimmed_bytes: rss_untrimmed,
        completed: stop.is_none() && live >= target,
        stop,
        stop_short: (!short.is_empty()).then(|| short.join("; ")),
        objects_a,
        deleted,
        objects_b: id - objects_a,
        forced_compactions: ins.forced,
        secs: t0.elapsed().as_secs_f64(),
        nibble,
    });
    Ok(())
}

/// `memlab frag`, resolved.
pub struct FragOpts {
    pub systems: Vec<System>,
    pub pairs: Vec<(usize, usize)>,
    pub target_bytes: u64,
    pub compact_timeout: Duration,
    pub repeat: usize,
    /// Cells run at once (separate processes).
    pub jobs: usize,
}

/// `1024` → `1K`, `102400` → `100K`, `1000` → `1000`.
pub fn short_size(b: usize) -> String {
    if b >= 1024 && b.is_multiple_of(1024) {
        format!("{}K", b / 1024)
    } else {
        b.to_string()
    }
}

pub fn run(o: &FragOpts, rep: &mut Reporter) -> std::io::Result<()> {
    const BENCH: &str = "frag";
    let (systems, skipped) = child::available(&o.systems);
    for n in &skipped {
        rep.note(BENCH, n);
        eprintln!("memlab: note: {n}");
    }
    let capacity = (o.target_bytes as f64 * CAPACITY_FACTOR) as usize;
    rep.note(
        BENCH,
        &format!(
            "Fig. 14: insert objects of size_a until live data (key + value bytes) reaches {:.0} MiB, delete 90% at \
             random, insert objects of size_b until live is back at the target or an insert fails. Object = 16 B key + \
             (size - 16) B value. Each (system, pair, run) in a fresh process, {} at a time (secs: wall time of a cell, under that load); rss_bytes = VmRSS at the end (the \
             process's own ~few MiB included); bloat = rss / live, median of {} runs [min, max]; bloat_store = \
             (rss - rss_base_bytes) / live, where rss_base_bytes is the process's RSS before the system was built. Nibble capacity \
             {:.0} MiB (1.5 x target); on out-of-memory: compact_now, retry once, else stop (completed = NO). \
             nibble_live_bytes: the store's own count (8 B object headers included; 10-24 B with a TTL, flags, capacity slack or long lengths).",
            o.target_bytes as f64 / (1u64 << 20) as f64,
            o.jobs,
            o.repeat,
            capacity as f64 / (1u64 << 20) as f64
        ),
    );
    let total = (o.repeat * o.pairs.len() * systems.len()) as u64;
    util::prime_memory((2 * o.target_bytes as usize).min(4 << 30));
    let pb = rep.start_progress(total, "memlab frag");
    // (pair index, system index) -> cells of the runs
    let mut cells: Vec<Vec<Vec<FragCell>>> = vec![vec![Vec::new(); systems.len()]; o.pairs.len()];
    let mut todo = Vec::new();
    for r in 0..o.repeat {
        for (pi, &(a, b)) in o.pairs.iter().enumerate() {
            for (si, &system) in systems.iter().enumerate() {
                let job = Job::Frag(FragJob {
                    system,
                    size_a: a,
                    size_b: b,
                    target_bytes: o.target_bytes,
                    capacity,
                    compact_timeout_ms: o.compact_timeout.as_millis() as u64,
                    seed: 1 + r as u64,
                });
                todo.push((r, pi, si, job));
            }
        }
    }
    // Cells are independent processes and RSS is per process, so up to
    // `jobs` of them run at once.
    let next = AtomicUsize::new(0);
    let (tx, rx) = mpsc::channel();
    thread::scope(|s| {
        for _ in 0..o.jobs.max(1) {
            let (todo, next, tx, pb) = (&todo, &next, tx.clone(), &pb);
            s.spawn(move || loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some((r, pi, si, job)) = todo.get(i) else {
                    break;
                };
                if let Job::Frag(j) = job {
                    pb.set_message(format!(
                        "{} {}->{} run {}",
                        j.system,
                        j.size_a,
                        j.size_b,
                        r + 1
                    ));
                }
                let mut got = Vec::new();
                let res = child::run_child(job, 0, pb, |c: FragCell| got.push(c));
                pb.inc(1);
                let _ = tx.send((*r, *pi, *si, got, res));
            });
        }
    });
    drop(tx);
    for (r, pi, si, got, res) in rx {
        cells[pi][si].extend(got);
        if let Err(e) = res {
            let (a, b) = o.pairs[pi];
            rep.error(format!(
                "{BENCH} {} {a}->{b} run {}: {e}",
                systems[si],
                r + 1
            ));
        }
    }
    // Distinct stop messages and who stopped with them.
    let mut stops: Vec<(String, Vec<String>)> = Vec::new();
    for (pi, &(a, b)) in o.pairs.iter().enumerate() {
        for (si, &system) in systems.iter().enumerate() {
            let runs = &cells[pi][si];
            if runs.is_empty() {
                continue;
            }
            let bloat = Spread::of(
                &runs
                    .iter()
                    .map(|c| c.rss_bytes as f64 / c.live_bytes.max(1) as f64)
                    .collect::<Vec<_>>(),
            );
            let med = |f: &dyn Fn(&FragCell) -> f64| {
                Spread::of(&runs.iter().map(f).collect::<Vec<_>>()).median
            };
            let completed = runs.iter().all(|c| c.completed);
            let mut row = Row::new(BENCH, system.name(), 1)
                .set("pair", format!("{}->{}", short_size(a), short_size(b)))
                .set("pair_index", pi)
                .set("size_a", a)
                .set("size_b", b)
                .set_f("live_bytes", med(&|c| c.live_bytes as f64), 0)
                .set_f("rss_bytes", med(&|c| c.rss_bytes as f64), 0)
                .set_spread("bloat", &bloat, 3)
                .set_f(
                    "bloat_untrimmed",
                    med(&|c| c.rss_untrimmed_bytes as f64 / c.live_bytes.max(1) as f64),
                    3,
                )
                .set("completed", completed)
                .set_f(
                    "bloat_store",
                    med(&|c| {
                        c.rss_bytes.saturating_sub(c.rss_base_bytes) as f64
                            / c.live_bytes.max(1) as f64
                    }),
                    3,
                )
                .set_f("rss_base_bytes", med(&|c| c.rss_base_bytes as f64), 0)
                .set_f("rss_empty_bytes", med(&|c| c.rss_empty_bytes as f64), 0)
                .set_f("rss_file_bytes", med(&|c| c.rss_file_bytes as f64), 0)
                .set_f("secs", med(&|c| c.secs), 1);
            match runs.iter().find_map(|c| c.nibble.as_ref()) {
                Some(n) => {
                    row = row
                        .set_f(
                            "nibble_live_bytes",
                            med(&|c| c.nibble.as_ref().map_or(f64::NAN, |n| n.live_bytes as f64)),
                            0,
                        )
                        .set_f(
                            "nibble_index_bytes",
                            med(&|c| c.nibble.as_ref().map_or(f64::NAN, |n| n.index_bytes as f64)),
                            0,
                        )
                        .set_f(
                            "nibble_log_bytes",
                            med(&|c| c.nibble.as_ref().map_or(f64::NAN, |n| n.log_bytes as f64)),
                            0,
                        )
                        .set("capacity_bytes", n.capacity_bytes)
                        .set(
                            "forced_compactions",
                            runs.iter().map(|c| c.forced_compactions).max().unwrap_or(0),
                        );
                }
                None => {
                    row = row
                        .set("nibble_live_bytes", serde_json::Value::Null)
                        .set("nibble_index_bytes", serde_json::Value::Null)
                        .set("nibble_log_bytes", serde_json::Value::Null)
                        .set("capacity_bytes", serde_json::Value::Null)
                        .set("forced_compactions", serde_json::Value::Null);
                }
            }
            if let Some(c) = runs.iter().find(|c| c.stop.is_some()) {
                row = row.set("stop", c.stop_short.clone());
                let full = c.stop.clone().unwrap_or_default();
                match stops.iter_mut().find(|(m, _)| *m == full) {
                    Some((_, who)) => who.push(format!("{system} {a}->{b}")),
                    None => stops.push((full, vec![format!("{system} {a}->{b}")])),
                }
            }
            rep.emit(row)?;
        }
    }
    for (msg, who) in stops {
        rep.note(BENCH, &format!("stopped early: {}: {msg}", who.join(", ")));
    }
    rep.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_16_bytes_and_distinct() {
        let mut b = [0u8; KEY_BYTES];
        assert_eq!(key_of(0x1f, &mut b), b"f00000000000001f");
        let k1 = key_of(1, &mut b).to_vec();
        assert_ne!(k1, key_of(2, &mut b));
    }

    #[test]
    fn stride_visits_everything_once() {
        for n in [1u64, 2, 10, 97, 1000, 4096] {
            let s = stride_for(n);
            let mut seen = vec![false; n as usize];
            for i in 0..n {
                let id = (i * s + 3) % n;
                assert!(!seen[id as usize], "n={n}");
                seen[id as usize] = true;
            }
        }
    }

    #[test]
    fn small_cells_complete() {
        for sys in ["hashmap-glibc", "dashmap-glibc", "nibble"] {
            let job = FragJob {
                system: sys.parse().unwrap(),
                size_a: 1024,
                size_b: 4096,
                target_bytes: 8 << 20,
                capacity: 16 << 20,
                compact_timeout_ms: 5000,
                seed: 1,
            };
            let mut got = Vec::new();
            run_job(&job, &mut |c| got.push(c)).unwrap();
            let c = &got[0];
            assert!(c.completed, "{sys}: {:?}", c.stop);
            assert!(c.live_bytes >= 8 << 20);
            let d = c.deleted as f64 / c.objects_a as f64;
            assert!((0.85..0.95).contains(&d), "{d}");
            assert!(c.rss_bytes > 0);
        }
    }
}
