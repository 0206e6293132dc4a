//! `memlab buddy`: the physical-frame allocators of the `buddy` crate, side
//! by side (distributed, global-lock, linux-pcp), in three workloads.
//!
//! * **local** — every thread pinned to its own CPU allocates and frees on
//!   that CPU's heap: batches of [`LOCAL_BATCH`] blocks allocated, then freed
//!   newest first. This is the common case the distributed design optimizes:
//!   heaps private to a CPU should scale, one global lock should not.
//!   Throughput counts `ops = allocs + frees`; latency of single calls is
//!   sampled about once every [`SAMPLE_EVERY`] ops with `rdtsc`.
//!
//! * **imbalance** — producer/consumer pairs: the producer, on an even CPU,
//!   allocates on its heap and sends the blocks over a bounded channel to
//!   the consumer on the next CPU, which frees them on *its* heap. Frames
//!   drain out of one heap and pile up in another, so the distributed
//!   allocator must borrow, forward frees and send frames home (§4.1.2-3 of
//!   the fos thesis). A time series samples `stats()` every
//!   [`SERIES_INTERVAL`]; at the end everything is freed, the allocator is
//!   quiesced and must be fully coalesced.
//!
//! * **exhaustion** — all threads allocate until `OutOfMemory`. Every frame
//!   of the pool must have been handed out exactly once (no premature OOM,
//!   no duplicates), the failing call must come back in bounded time, and
//!   after every block is freed — by a *different* thread than the one that
//!   got it, on its own heap — and a quiesce, the pool must be whole again.
//!
//! The allocators manage frame numbers only; no memory is mapped, so what
//! is measured is the allocator's bookkeeping and synchronization. Runs of
//! the systems are interleaved (`for rep { for system { run } }`) so that
//! the ratios compare runs made under the same conditions.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use buddy::{AllocError, AllocatorKind, BuddyConfig, FrameAllocator, FrameNo, Stats};
use hdrhistogram::Histogram;
use indicatif::ProgressBar;
use topology::{rdtsc, tsc_to_ns};

use crate::error::{Context, Result};
use crate::report::{Reporter, Row};
use crate::util::{self, join_all, new_hist, Rng, Spread, Watchdog};

mod exhaustion;
mod imbalance;
mod local;

use exhaustion::*;
use imbalance::*;
use local::*;

/// Blocks allocated, then freed, per round of the local workload.
pub const LOCAL_BATCH: usize = 64;
/// Mean interval, in ops, between latency samples (jittered uniformly in
/// `[1, 2 * SAMPLE_EVERY)` so it does not alias with the batch).
pub const SAMPLE_EVERY: u64 = 64;
/// Frames in the local workload's pool, at least (1 GiB).
const LOCAL_MIN_POOL_FRAMES: u64 = 1 << 18;
/// Imbalance: frames per producer/consumer pair (256 MiB).
const IMBALANCE_POOL_FRAMES_PER_PAIR: u64 = 1 << 16;
/// Imbalance: blocks per channel message.
const IMBALANCE_BATCH: usize = 32;
/// Imbalance: channel bound, in batches. Kept the same for every order: a
/// shallow channel makes the producer park on every send, and the run then
/// measures futex wake-ups instead of the allocator.
const IMBALANCE_CHANNEL_BATCHES: usize = 32;
/// Imbalance: frames' worth of blocks the consumer keeps before freeing the
/// oldest, one configuration each. A small live set: frames drain back home
/// through the consumer's heap (returns). Half the pool (the producer's
/// whole share with 2 heaps): the producer's heap runs dry and must borrow.
pub const IMBALANCE_QUEUE_FRAMES: [u64; 2] = [4096, 32768];
/// Imbalance: time-series sampling interval.
pub const SERIES_INTERVAL: Duration = Duration::from_millis(100);
/// Exhaustion: pool size (64 MiB).
const EXHAUSTION_POOL_FRAMES: u64 = 1 << 14;
/// A run taking this much longer than planned is declared hung.
const HANG_GRACE: Duration = Duration::from_secs(60);

/// The workloads, selectable with `--workload`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Workload {
    /// Per-CPU alloc/free throughput and latency.
    Local,
    /// Producer/consumer across CPUs; rebalancing time series.
    Imbalance,
    /// Allocate until out of memory; free everything; check the pool.
    Exhaustion,
}

/// Everything `memlab buddy` needs, resolved from the command line.
pub struct BuddyOpts {
    pub workloads: Vec<Workload>,
    pub allocators: Vec<AllocatorKind>,
    pub threads: Vec<usize>,
    /// Block sizes of the local workload, in frames (powers of two).
    pub sizes: Vec<u64>,
    pub repeat: usize,
    pub quick: bool,
    /// Overrides the measured duration of local and imbalance runs.
    pub duration: Option<Duration>,
}

impl BuddyOpts {
    fn local_warmup(&self) -> Duration {
        Duration::from_millis(if self.quick { 30 } else { 100 })
    }
    fn local_duration(&self) -> Duration {
        self.duration
            .unwrap_or(Duration::from_millis(if self.quick { 250 } else { 1000 }))
    }
    fn imbalance_duration(&self) -> Duration {
        self.duration
            .unwrap_or(Duration::from_millis(if self.quick { 1000 } else { 2000 }))
    }
    fn imbalance_orders(&self) -> Vec<u32> {
        if self.quick {
            vec![0]
        } else {
            vec![0, 3]
        }
    }
    /// Imbalance uses pairs: the even thread counts of the list (at least 2).
    fn imbalance_threads(&self) -> Vec<usize> {
        let mut v: Vec<usize> = self
            .threads
            .iter()
            .copied()
            .filter(|t| t % 2 == 0)
            .collect();
        if v.is_empty() {
            v.push(2);
        }
        v
    }
}

/// Run the selected workloads; rows go to `rep`.
pub fn run(opts: &BuddyOpts, rep: &mut Reporter) -> std::io::Result<()> {
    let cpus = util::online_cpus();
    let n_alloc = opts.allocators.len() as u64;
    let r = opts.repeat as u64;
    let mut total = 0;
    for w in &opts.workloads {
        total += match w {
            Workload::Local => opts.sizes.len() as u64 * opts.threads.len() as u64 * n_alloc * r,
            Workload::Imbalance => {
                opts.imbalance_orders().len() as u64
                    * IMBALANCE_QUEUE_FRAMES.len() as u64
                    * opts.imbalance_threads().len() as u64
                    * n_alloc
                    * r
            }
            Workload::Exhaustion => 2 * opts.threads.len() as u64 * n_alloc * r,
        };
    }
    let pb = rep.start_progress(total, "memlab buddy");
    for w in &opts.workloads {
        match w {
            Workload::Local => local(opts, &cpus, rep, &pb)?,
            Workload::Imbalance => imbalance(opts, &cpus, rep, &pb)?,
            Workload::Exhaustion => exhaustion(opts, &cpus, rep, &pb)?,
        }
        rep.flush()?;
    }
    rep.end_progress();
    Ok(())
}

fn build(kind: AllocatorKind, frames: u64, heaps: usize) -> Result<Box<dyn FrameAllocator>> {
    let cfg = BuddyConfig {
        check_frees: false,
        heaps: Some(heaps),
        ..Default::default()
    };
    buddy::new_allocator(kind, frames, &cfg)
        .with_context(|| format!("cannot build {kind} over {frames} frames with {heaps} heaps"))
}

fn order_of(frames: u64) -> u32 {
    frames.trailing_zeros()
}

const PHASE_WARMUP: u8 = 0;
const PHASE_MEASURE: u8 = 1;
const PHASE_STOP: u8 = 2;

/// Times about one call in [`SAMPLE_EVERY`] into a histogram of TSC ticks.
struct Sampler {
    countdown: u64,
    rng: Rng,
    hist: Histogram<u64>,
}

impl Sampler {
    fn new(seed: u64) -> Result<Sampler> {
        let mut rng = Rng::new(seed);
        Ok(Sampler {
            countdown: rng.range(1, 2 * SAMPLE_EVERY),
            rng,
            hist: new_hist()?,
        })
    }

    #[inline(always)]
    fn call<T>(&mut self, f: impl FnOnce() -> T) -> T {
        self.countdown -= 1;
        if self.countdown != 0 {
            return f();
        }
        self.countdown = self.rng.range(1, 2 * SAMPLE_EVERY);
        let t0 = rdtsc();
        let r = f();
        let t1 = rdtsc();
        self.hist.saturating_record(t1.wrapping_sub(t0).max(1));
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_pool_sizes() {
        assert_eq!(local_pool_frames(0, 1), 1 << 18);
        assert_eq!(local_pool_frames(3, 2), 1 << 18);
        assert_eq!(local_pool_frames(9, 2), 1 << 20);
    }

    #[test]
    fn check_whole_reports_lost_and_split_frames() {
        let mut s = Stats {
            total_frames: 16,
            free_frames: 16,
            max_order: 3,
            free_blocks_by_order: vec![0, 0, 0, 2],
            ..Default::default()
        };
        assert!(check_whole(&s).is_ok());
        s.free_frames = 15;
        let e = check_whole(&s).unwrap_err().to_string();
        assert!(e.contains("1 frames lost"), "{e}");
        s.free_frames = 16;
        s.distributed_fragmentation_frames = 8;
        s.free_blocks_by_order = vec![0, 0, 2, 1];
        let e = check_whole(&s).unwrap_err().to_string();
        assert!(
            e.contains("not fully coalesced") && e.contains("expected 2"),
            "{e}"
        );
    }

    #[test]
    fn imbalance_smoke_all_allocators() {
        let cpus = util::online_cpus();
        for kind in AllocatorKind::ALL {
            let run =
                imbalance_run(kind, 2, 0, 4096, Duration::from_millis(200), &cpus).expect("run");
            assert_eq!(run.samples.len(), 2, "{kind}");
            assert!(run.mean_ops_per_sec > 0.0);
            check_whole(&run.fin).expect("whole");
        }
    }

    #[test]
    fn exhaustion_smoke_all_allocators() {
        for kind in AllocatorKind::ALL {
            let run = exhaustion_run(kind, 1, 0, &[topology::current_cpu()]).expect("run");
            assert_eq!(run.allocated_frames, EXHAUSTION_POOL_FRAMES, "{kind}");
            assert_eq!(run.duplicates, 0);
            check_whole(&run.fin).expect("whole");
        }
    }
}
