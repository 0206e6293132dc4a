//! `memlab churn`: a Postmark-like trace with heavy object churn, weak
//! scaling (dissertation §5.3, Figs. 15-17).
//!
//! The dissertation replays a trace of Postmark running on TableFS: 2 M
//! files of 500-4096 bytes, transactions that read, append to, create and
//! delete them; after a setup burst, a steady 10 % of operations insert new
//! objects and 10 % delete objects, and at the end Postmark deletes
//! everything. We do not have the trace, so we generate one with those
//! characteristics, independently per thread (weak scaling: each thread has
//! its own key range and a fixed amount of work, so more threads mean more
//! total work and no sharing, as in Fig. 16):
//!
//! ```text
//!  create   F files, size uniform in [500, 4096] B            (setup)
//!  N transactions, each one of:
//!    10 %  insert a new file (size uniform in [500, 4096] B)
//!    10 %  delete a random live file
//!    40 %  read a random live file (copy out, check)
//!    40 %  append: read a random live file, add 64-512 B, write it back
//!          (files stop growing at 64 KiB)
//!  delete every remaining file                                (cleanup)
//! ```
//!
//! Keys are `pm<thread>.<file id>` (20 bytes); every value carries its file
//! id in bytes 0..8 and every read checks it and the length. Reported:
//! `time_s`, the time to completion of the slowest thread (all start
//! together), and `ops_per_sec` = all operations of all threads (creates,
//! transactions, cleanup deletes) / `time_s`; `weak_scaling` = time_s at 1
//! thread / time_s (1.0 is perfect weak scaling).
//!
//! Nibble capacity: 6 × the expected live data (3.5 KiB per file: the mean
//! size plus the expected appends), at least 64 MiB — about 17 % utilization,
//! as in §5.3.

use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::child::{self, Job};
use crate::error::{Context, Result};
use crate::kv::{Kv, System};
use crate::report::{Checks, Reporter, Row};
use crate::util::{self, join_all, Rng, Spread, Watchdog};

/// File sizes at creation, bytes (inclusive).
pub const FILE_MIN: u64 = 500;
pub const FILE_MAX: u64 = 4096;
/// Bytes added by one append (inclusive).
pub const APPEND_MIN: u64 = 64;
pub const APPEND_MAX: u64 = 512;
/// Files stop growing here.
pub const FILE_CAP: usize = 64 << 10;
/// Expected live bytes per file, for sizing Nibble.
pub const EXPECTED_FILE_BYTES: usize = 3584;
/// Nibble capacity = this × expected live data.
pub const CAPACITY_FACTOR: usize = 6;
const KEY_BYTES: usize = 20;

/// One child's work: one system, one thread count.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct ChurnJob {
    pub system: System,
    pub threads: usize,
    pub files_per_thread: u64,
    pub ops_per_thread: u64,
    pub capacity: usize,
    pub seed: u64,
}

/// What one run measured.
#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub struct ChurnCell {
    pub threads: usize,
    pub ops: u64,
    pub secs: f64,
    pub inserts: u64,
    pub deletes: u64,
    pub reads: u64,
    pub appends: u64,
    #[serde(flatten)]
    pub checks: Checks,
    pub segments_compacted: Option<u64>,
    pub bytes_relocated: Option<u64>,
}

fn key_of(t: usize, id: u64, buf: &mut [u8; KEY_BYTES]) -> &[u8] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    buf[..2].copy_from_slice(b"pm");
    for i in 0..3 {
        buf[4 - i] = b'0' + ((t / 10usize.pow(i as u32)) % 10) as u8;
    }
    buf[5] = b'.';
    for i in 0..14 {
        buf[KEY_BYTES - 1 - i] = HEX[((id >> (4 * i)) & 15) as usize];
    }
    &buf[..]
}

struct ThreadOut {
    cell: ChurnCell,
    start: Instant,
    end: Instant,
}

fn worker(
    kv: &dyn Kv,
    job: &ChurnJob,
    t: usize,
    cpu: usize,
    barrier: &Barrier,
) -> Result<ThreadOut> {
    let pinned = util::pin_to(cpu);
    barrier.wait();
    pinned?;
    let mut rng = Rng::new(job.seed.wrapping_mul(7919).wrapping_add(t as u64 + 1));
    let filler = crate::ycsb::filler_value(FILE_CAP + APPEND_MAX as usize, job.seed + t as u64);
    let mut kbuf = [0u8; KEY_BYTES];
    let mut buf: Vec<u8> = Vec::with_capacity(FILE_CAP);
    let mut val: Vec<u8> = Vec::with_capacity(FILE_CAP);
    let mut files: Vec<(u64, u32)> = Vec::with_capacity(job.files_per_thread as usize * 2);
    let mut c = ChurnCell::default();
    let mut next_id = 0u64;
    let start = Instant::now();
    let mut create = |rng: &mut Rng, files: &mut Vec<(u64, u32)>, c: &mut ChurnCell| {
        let size = rng.range(FILE_MIN, FILE_MAX + 1) as usize;
        val.clear();
        val.extend_from_slice(&next_id.to_le_bytes());
        val.extend_from_slice(&filler[8..size]);
        match kv.put(key_of(t, next_id, &mut kbuf), &val) {
            Ok(()) => files.push((next_id, size as u32)),
            Err(e) => {
                c.checks.put_failed(|| format!("insert: {e}"));
            }
        }
        next_id += 1;
        c.inserts += 1;
        c.ops += 1;
    };
    for _ in 0..job.files_per_thread {
        create(&mut rng, &mut files, &mut c);
    }
    for _ in 0..job.ops_per_thread {
        let r = rng.range(0, 100);
        if r < 10 || files.is_empty() {
            create(&mut rng, &mut files, &mut c);
            continue;
        }
        let i = rng.range(0, files.len() as u64) as usize;
        let (id, size) = files[i];
        let mut k2 = [0u8; KEY_BYTES];
        let key = key_of(t, id, &mut k2);
        c.ops += 1;
        if r < 20 {
            files.swap_remove(i);
            c.deletes += 1;
            match kv.delete(key) {
                Ok(true) => {}
                Ok(false) => c.checks.misses += 1,
                Err(e) => return Err(e).context("delete"),
            }
            continue;
        }
        let found = kv.get_into(key, &mut buf).context("get")?;
        if !found {
            c.checks.misses += 1;
            continue;
        }
        if buf.len() != size as usize || buf[..8] != id.to_le_bytes() {
            c.checks.bad_values += 1;
            continue;
        }
        if r < 60 {
            c.reads += 1;
            continue;
        }
        c.appends += 1;
        let add = (rng.range(APPEND_MIN, APPEND_MAX + 1) as usize)
            .min(FILE_CAP - buf.len().min(FILE_CAP));
        let at = buf.len();
        buf.extend_from_slice(&filler[at..at + add]);
        match kv.put(key, &buf) {
            Ok(()) => files[i].1 = buf.len() as u32,
            Err(e) => {
                c.checks.put_failed(|| format!("append: {e}"));
            }
        }
    }
    for (id, _) in files.drain(..) {
        c.ops += 1;
        c.deletes += 1;
        match kv.delete(key_of(t, id, &mut kbuf)) {
            Ok(true) => {}
            Ok(false) => c.checks.misses += 1,
            Err(e) => return Err(e).context("cleanup delete"),
        }
    }
    Ok(ThreadOut {
        cell: c,
        start,
        end: Instant::now(),
    })
}

/// Run one job (in the child).
pub fn run_job(job: &ChurnJob, emit: &mut dyn FnMut(ChurnCell)) -> Result<()> {
    let what = format!("churn {} threads={}", job.system, job.threads);
    let _wd = Watchdog::arm(
        Duration::from_secs(300)
            + Duration::from_micros(50 * (job.ops_per_thread + job.files_per_thread)),
        what.clone(),
    );
    let cpus = util::online_cpus();
    let kv = job.system.build(job.capacity)?;
    let kv: &dyn Kv = &*kv;
    let barrier = &Barrier::new(job.threads);
    let outs = thread::scope(|s| {
        let handles = (0..job.threads)
            .map(|t| {
                let cpu = cpus[t % cpus.len()];
                s.spawn(move || worker(kv, job, t, cpu, barrier))
            })
            .collect();
        join_all(handles)
    })
    .context(&what)?;
    let start = outs.iter().map(|o| o.start).min();
    let end = outs.iter().map(|o| o.end).max();
    let mut total = ChurnCell {
        threads: job.threads,
        secs: match (start, end) {
            (Some(a), Some(b)) => (b - a).as_secs_f64(),
            _ => 0.0,
        },
        ..Default::default()
    };
    for o in outs {
        let c = o.cell;
        total.ops += c.ops;
        total.inserts += c.inserts;
        total.deletes += c.deletes;
        total.reads += c.reads;
        total.appends += c.appends;
        total.checks.add(c.checks);
    }
    if let Some(s) = kv.nibble() {
        let st = s.stats();
        total.segments_compacted = Some(st.segments_compacted);
        total.bytes_relocated = Some(st.bytes_relocated);
    }
    emit(total);
    Ok(())
}

/// `memlab churn`, resolved.
pub struct ChurnOpts {
    pub systems: Vec<System>,
    pub threads: Vec<usize>,
    pub files_per_thread: u64,
    pub ops_per_thread: u64,
    pub repeat: usize,
}

/// Nibble capacity for `threads` threads of `files` files each.
pub fn capacity_for(threads: usize, files: u64) -> usize {
    (CAPACITY_FACTOR * threads * files as usize * EXPECTED_FILE_BYTES)
        .max(crate::ycsb::MIN_CAPACITY)
}

pub fn run(o: &ChurnOpts, rep: &mut Reporter) -> std::io::Result<()> {
    const BENCH: &str = "churn";
    let (systems, skipped) = child::available(&o.systems);
    for n in &skipped {
        rep.note(BENCH, n);
        eprintln!("memlab: note: {n}");
    }
    rep.note(
        BENCH,
        &format!(
            "Postmark-like trace, weak scaling: per thread, its own keys: create {} files (500-4096 B), {} \
             transactions (10% create, 10% delete, 40% read, 40% append 64-512 B = read + write back), delete the \
             rest. time_s: start to the last thread's end, median of {} runs [min, max]; ops_per_sec = all ops / \
             time_s; weak_scaling = time_s(1 thread) / time_s. Nibble capacity 6 x expected live data (~17% \
             utilization). Each (system, threads, run) in a fresh process.",
            o.files_per_thread, o.ops_per_thread, o.repeat
        ),
    );
    let total = (o.repeat * o.threads.len() * systems.len()) as u64;
    let pb = rep.start_progress(total, "memlab churn");
    // [threads index][system index] -> runs
    let mut cells: Vec<Vec<Vec<ChurnCell>>> =
        vec![vec![Vec::new(); systems.len()]; o.threads.len()];
    for r in 0..o.repeat {
        for (ti, &threads) in o.threads.iter().enumerate() {
            for (si, &system) in systems.iter().enumerate() {
                pb.set_message(format!("{system} t={threads} run {}", r + 1));
                let job = Job::Churn(ChurnJob {
                    system,
                    threads,
                    files_per_thread: o.files_per_thread,
                    ops_per_thread: o.ops_per_thread,
                    capacity: capacity_for(threads, o.files_per_thread),
                    seed: 1 + r as u64,
                });
                let prime = capacity_for(threads, o.files_per_thread).min(4 << 30);
                let res = child::run_child(&job, prime, &pb, |c: ChurnCell| cells[ti][si].push(c));
                pb.inc(1);
                if let Err(e) = res {
                    rep.error(format!(
                        "{BENCH} {system} threads={threads} run {}: {e}",
                        r + 1
                    ));
                }
            }
        }
    }
    let one = o.threads.iter().position(|&t| t == 1);
    for (ti, &threads) in o.threads.iter().enumerate() {
        for (si, &system) in systems.iter().enumerate() {
            let runs = &cells[ti][si];
            if runs.is_empty() {
                continue;
            }
            for (r, c) in runs.iter().enumerate() {
                let what = format!("{BENCH} {system} threads={threads} run {}", r + 1);
                c.checks.report(rep, &what, "operations on live files");
            }
            let time = Spread::of(&runs.iter().map(|c| c.secs).collect::<Vec<_>>());
            let ops = Spread::of(
                &runs
                    .iter()
                    .map(|c| c.ops as f64 / c.secs.max(1e-9))
                    .collect::<Vec<_>>(),
            );
            let mut row = Row::new(BENCH, system.name(), threads)
                .set_spread("time_s", &time, 3)
                .set_spread("ops_per_sec", &ops, 0)
                .set("ops", runs[0].ops);
            if let Some(one) = one {
                let base = &cells[one][si];
                if !base.is_empty() {
                    let b = Spread::of(&base.iter().map(|c| c.secs).collect::<Vec<_>>()).median;
                    row = row.set_f("weak_scaling", b / time.median, 3);
                }
            }
            row = row
                .set("segments_compacted", runs[0].segments_compacted)
                .set("bytes_relocated", runs[0].bytes_relocated);
            rep.emit(row)?;
        }
    }
    rep.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_fixed_width() {
        let mut b = [0u8; KEY_BYTES];
        assert_eq!(key_of(7, 0xabc, &mut b), b"pm007.00000000000abc");
    }

    #[test]
    fn small_trace_on_every_kind() {
        for sys in ["hashmap-glibc", "dashmap-glibc", "nibble", "nibble2"] {
            let job = ChurnJob {
                system: sys.parse().unwrap(),
                threads: 2,
                files_per_thread: 500,
                ops_per_thread: 5000,
                capacity: capacity_for(2, 500),
                seed: 1,
            };
            let mut got = Vec::new();
            run_job(&job, &mut |c| got.push(c)).unwrap();
            let c = &got[0];
            let k = &c.checks;
            assert_eq!((k.misses, k.bad_values, k.put_errors), (0, 0, 0), "{sys}");
            assert!(c.ops >= 2 * 5500);
            assert!(c.appends > 0 && c.reads > 0 && c.deletes > 0);
        }
    }
}
