//! `mapbench` (RadixVM §5, Figures 9-11: local, pipeline, global) and
//! `faultbench` (Bonsai §7.3, Figures 16-18) as library functions, for
//! `memlab mapbench` / `memlab faultbench` and the examples.
//!
//! Every design runs over every MMU backend: rows over the software MMU
//! say `tlb: "simulated"` (system `design-sw`), rows over the
//! userfaultfd MMU `tlb: "real"` (system `design-uffd`: real faults, the
//! kernel's page table and TLB shootdowns), rows over the per-core MMU
//! `tlb: "real"` (system `design-percore`: a forked worker process per
//! thread, each with its own page table, running the same per-thread body
//! with shared-memory barriers and queues; only inside the
//! `radixvm-percore` binary). `mapbench` also runs the same
//! workload with the process's own `mmap`/`munmap` and real stores
//! (`native-linux`, `tlb: "real"`), in the same run, as the yardstick.
//! Shootdown figures are the design's requests (`messages_per_iter`: one
//! message per remote target; user-level on every backend). The kernel's
//! own TLB-shootdown IPIs are counted system-wide from /proc/interrupts
//! as `kernel_tlb_ipis_per_iter`.
//!
//! mapbench workloads (region size in pages, per thread):
//! * `local` — each thread maps its own region at a fixed address,
//!   writes every page, unmaps it. One iteration = map+touch+unmap.
//! * `pipeline` — each thread maps and writes a region, hands it to the
//!   next thread (a ring), and writes and unmaps the region handed to it.
//! * `global` — rounds: each thread maps its slice of one shared region;
//!   all threads write every page of the whole region in random order;
//!   each unmaps its slice. One iteration = one thread's share of a round.
//!
//! faultbench: one thread spends a given fraction of each
//! [`FAULT_PERIOD_US`] in mmap/munmap of its own page while the others
//! take soft page faults on a segment (frames exist, as page-cache pages
//! do): they read every page of their region, then drop their own
//! translations the way page reclaim would (page-table clear and a local
//! TLB flush, no address-space lock) and start over. The figure is the
//! mean cost of one faulting access.
//!
//! Each cell runs `runs` times; rows report the median and the spread
//! ((max - min) / median, percent). Threads are pinned to the allowed
//! CPUs in turn; on a 2-core machine rows above 2 threads measure
//! time-sharing, not scaling.

mod fault;

pub use fault::faultbench;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};

use crate::mmu::uffd::UffdError;
use crate::space::stats_of;
use crate::{
    new_space_on, Access, AddressSpace, Backend, Backing, Cpu, Design, Frames, MapAt, Prot,
    Segment, Stats, PAGE_SIZE_BYTES,
};

/// Fixed addresses used by the benchmarks start here.
pub const BENCH_BASE_BYTES: u64 = 1 << 32;
/// Gap between threads' fixed regions, so they never share a radix leaf.
pub const REGION_STRIDE_BYTES: u64 = 1 << 30;
/// faultbench: the mapper's duty-cycle period.
pub const FAULT_PERIOD_US: u64 = 200;
/// faultbench: pages per faulting thread's region.
pub const FAULT_REGION_PAGES: u64 = 256;
/// Frame pool per run (RadixVM's frames come back only epochs after
/// munmap, so the pool must hold what is in flight meanwhile).
pub const POOL_BYTES: usize = 1 << 30;

/// A system under test (serialized as its name).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum System {
    /// One of the designs over one of the MMU backends.
    Design(Design, Backend),
    /// The process's own mmap/munmap and real page faults.
    Native,
}

impl System {
    /// Every design over the software MMU, then over userfaultfd, then
    /// native.
    pub const ALL: [System; 7] = [
        System::Design(Design::RadixVm, Backend::Software),
        System::Design(Design::Bonsai, Backend::Software),
        System::Design(Design::Linux, Backend::Software),
        System::Design(Design::RadixVm, Backend::Userfaultfd),
        System::Design(Design::Bonsai, Backend::Userfaultfd),
        System::Design(Design::Linux, Backend::Userfaultfd),
        System::Native,
    ];

    /// Every design on the per-core backend (runs only in the
    /// `radixvm-percore` binary; `memlab` runs them there).
    pub const PERCORE: [System; 3] = [
        System::Design(Design::RadixVm, Backend::Percore),
        System::Design(Design::Bonsai, Backend::Percore),
        System::Design(Design::Linux, Backend::Percore),
    ];

    /// Name in output: `design-backend` or `native-linux`.
    pub fn name(self) -> String {
        match self {
            System::Design(d, b) => format!("{}-{}", d.name(), b.name()),
            System::Native => "native-linux".into(),
        }
    }

    /// `"simulated"` (software MMU) or `"real"`.
    pub fn tlb(self) -> &'static str {
        match self {
            System::Design(_, b) => b.tlb(),
            System::Native => "real",
        }
    }

    /// The backend, for designs.
    pub fn backend(self) -> Option<Backend> {
        match self {
            System::Design(_, b) => Some(b),
            System::Native => None,
        }
    }
}

impl From<System> for String {
    fn from(s: System) -> String {
        s.name()
    }
}

impl TryFrom<String> for System {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl std::str::FromStr for System {
    type Err = String;
    /// `native-linux`, `design-backend` (`radixvm-uffd`), or a design
    /// alone (software MMU).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "native-linux" {
            return Ok(System::Native);
        }
        match s.rsplit_once('-') {
            Some((d, b)) => Ok(System::Design(d.parse()?, b.parse()?)),
            None => Ok(System::Design(s.parse()?, Backend::Software)),
        }
    }
}

/// Whether the userfaultfd backend works here: `Err` holds the reason
/// (printed by the benchmarks, which then skip its rows).
pub fn uffd_available() -> Result<(), String> {
    let frames = Frames::new(1 << 20).map_err(|e| e.to_string())?;
    match new_space_on(Design::Linux, Backend::Userfaultfd, &frames) {
        Ok(_) => Ok(()),
        Err(e @ UffdError::Unavailable(_)) => Err(e.to_string()),
        Err(e) => panic!("{e}"),
    }
}

/// `systems` without those whose backend does not work here (the
/// userfaultfd one where the kernel offers none, the per-core one outside
/// the `radixvm-percore` binary); `note` gets each reason once.
pub fn usable_systems(systems: &[System], mut note: impl FnMut(&str)) -> Vec<System> {
    let mut out = systems.to_vec();
    type Check = fn() -> Result<(), String>;
    let checks: [(Backend, &str, Check); 2] = [
        (Backend::Userfaultfd, "userfaultfd", uffd_available),
        (Backend::Percore, "per-core", crate::percore::available),
    ];
    for (backend, name, check) in checks {
        if !out.iter().any(|s| s.backend() == Some(backend)) {
            continue;
        }
        if let Err(why) = check() {
            note(&format!("skipping the {name} rows: {why}"));
            out.retain(|s| s.backend() != Some(backend));
        }
    }
    out
}

/// TLB-shootdown interrupts received, all CPUs (the `TLB:` line of
/// /proc/interrupts), or `None` where unreadable. System-wide: other
/// processes' shootdowns count too.
pub fn kernel_tlb_shootdowns() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/interrupts").ok()?;
    let line = text.lines().find(|l| l.trim_start().starts_with("TLB:"))?;
    Some(
        line.split_whitespace()
            .skip(1)
            .map_while(|w| w.parse::<u64>().ok())
            .sum(),
    )
}

/// A mapbench workload (serialized as its name).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum Workload {
    /// Private regions.
    Local,
    /// Regions handed round a ring.
    Pipeline,
    /// One shared region.
    Global,
}

impl Workload {
    /// All three.
    pub const ALL: [Workload; 3] = [Workload::Local, Workload::Pipeline, Workload::Global];

    /// Name in output.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Local => "local",
            Workload::Pipeline => "pipeline",
            Workload::Global => "global",
        }
    }
}

impl From<Workload> for String {
    fn from(w: Workload) -> String {
        w.name().into()
    }
}

impl TryFrom<String> for Workload {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl std::str::FromStr for Workload {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Workload::ALL
            .into_iter()
            .find(|w| w.name() == s)
            .ok_or_else(|| format!("unknown workload {s:?} (local, pipeline, global)"))
    }
}

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    /// Thread counts.
    pub threads: Vec<usize>,
    /// Seconds per run.
    pub secs: f64,
    /// Runs per cell.
    pub runs: usize,
    /// Region size in pages (mapbench; per thread).
    pub pages: u64,
    /// mapbench workloads.
    pub workloads: Vec<Workload>,
    /// Systems.
    pub systems: Vec<System>,
    /// faultbench: fractions of the mapper's time in mmap/munmap.
    pub map_fractions: Vec<f64>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            threads: vec![1, 2],
            secs: 1.0,
            runs: 3,
            pages: 4,
            workloads: Workload::ALL.to_vec(),
            systems: System::ALL.to_vec(),
            map_fractions: vec![0.0, 0.1, 0.25, 0.5, 0.9],
        }
    }
}

impl Options {
    /// `--quick`: mapbench under 30 s, faultbench under 20 s on 2 cores.
    pub fn quick() -> Options {
        Options {
            secs: 0.2,
            runs: 3,
            map_fractions: vec![0.0, 0.25, 0.5, 0.9],
            ..Options::default()
        }
    }
}

/// One mapbench result (`radixvm-percore --json` prints it with serde,
/// memlab reads it back and reports it as its own rows).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MapRow {
    /// Workload.
    pub workload: Workload,
    /// System.
    pub system: System,
    /// Threads.
    pub threads: usize,
    /// Region pages.
    pub pages: u64,
    /// Median iterations per second, all threads.
    pub iters_per_sec: f64,
    /// Median page touches per second, all threads.
    pub touches_per_sec: f64,
    /// Page faults per iteration.
    pub faults_per_iter: f64,
    /// Shootdowns per iteration (designs only).
    pub shootdowns_per_iter: Option<f64>,
    /// Remote targets per shootdown (designs only).
    pub targets_per_shootdown: Option<f64>,
    /// The design's shootdown messages (one per remote target) per
    /// iteration (designs only; user-level on every backend).
    pub messages_per_iter: Option<f64>,
    /// Page-table pages at the end of the last run (designs only; the
    /// userfaultfd backend's shadow table).
    pub page_table_pages: Option<u64>,
    /// TLB-shootdown interrupts the kernel counted per iteration,
    /// system-wide (real TLBs only; `None` where unreadable).
    pub kernel_tlb_ipis_per_iter: Option<f64>,
    /// Fault-around block of the RadixVM design, in pages (1: one page
    /// per fault; `None` for other systems), from
    /// [`crate::designs::radixvm::FAULT_AROUND_ENV`].
    #[serde(default)]
    pub fault_around_pages: Option<u64>,
    /// CPU time the threads (or workers) spent in their workload loops,
    /// user and kernel, per iteration, in microseconds (median of the
    /// runs). Unlike `iters_per_sec` it does not count time a thread
    /// waited for a CPU, so on a loaded machine it still shows whether a
    /// second thread makes each iteration dearer (shared cache lines,
    /// locks): 2 ÷ 1-thread throughput can reach at most 2 x (1-thread
    /// CPU per iteration ÷ 2-thread CPU per iteration).
    #[serde(default)]
    pub cpu_us_per_iter: Option<f64>,
    /// Spread in percent.
    pub spread_pct: f64,
    /// Runs.
    pub runs: usize,
}

/// One faultbench result (serialized as [`MapRow`] is).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FaultRow {
    /// Design and backend.
    pub system: System,
    /// Threads (one mapper, the rest fault).
    pub threads: usize,
    /// Fraction of the mapper's time in mmap/munmap.
    pub map_fraction: f64,
    /// Median faults per second, all faulting threads.
    pub faults_per_sec: f64,
    /// Median nanoseconds per faulting access.
    pub fault_ns: f64,
    /// mmap+munmap pairs per second by the mapper.
    pub maps_per_sec: f64,
    /// The design's shootdown messages per mapper mmap+munmap pair
    /// (user-level on every backend).
    pub messages_per_map: f64,
    /// Kernel TLB-shootdown interrupts per mapper mmap+munmap pair,
    /// system-wide (real TLBs only; `None` where unreadable or when the
    /// mapper did not map).
    pub kernel_tlb_ipis_per_map: Option<f64>,
    /// Fault-around block of the RadixVM design, in pages (1: one page
    /// per fault; `None` for other systems), from
    /// [`crate::designs::radixvm::FAULT_AROUND_ENV`].
    #[serde(default)]
    pub fault_around_pages: Option<u64>,
    /// Spread of `fault_ns` in percent.
    pub spread_pct: f64,
    /// Runs.
    pub runs: usize,
}

/// The fault-around block a row of `system` ran with (RadixVM only).
pub(crate) fn fault_around_of(system: System) -> Option<u64> {
    matches!(system, System::Design(Design::RadixVm, _))
        .then(|| crate::designs::radixvm::fault_around_from_env().unwrap_or(1))
}

fn pin(thread: usize) {
    let cpus = topology::allowed_cpus();
    if !cpus.is_empty() {
        let _ = topology::pin_current_thread(cpus[thread % cpus.len()]);
    }
}

/// Median and spread (percent) of `values`.
fn median_spread(mut values: Vec<f64>) -> (f64, f64) {
    values.sort_by(f64::total_cmp);
    let median = values[values.len() / 2];
    let spread = if median > 0.0 {
        (values[values.len() - 1] - values[0]) / median * 100.0
    } else {
        0.0
    };
    (median, spread)
}

/// What one timed run measured.
#[derive(Default, Clone, Copy)]
struct Sample {
    iters: u64,
    touches: u64,
    secs: f64,
    faults: u64,
    /// Kernel TLB-shootdown interrupts during the run, system-wide.
    kernel_tlb: Option<u64>,
    /// CPU time of the workload loops, all threads, in nanoseconds.
    cpu_ns: u64,
    stats: Stats,
}

/// CPU time of the calling thread so far, in nanoseconds (user and
/// kernel; `CLOCK_THREAD_CPUTIME_ID`).
pub(crate) fn thread_cpu_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the fully owned timespec.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    if rc != 0 {
        return 0;
    }
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// The operations a workload needs, for a design or native.
trait Vm: Sync {
    type Cpu<'a>
    where
        Self: 'a;
    fn attach(&self, cpu: usize) -> Self::Cpu<'_>;
    fn map(cpu: &Self::Cpu<'_>, at: Option<u64>, len: u64) -> u64;
    fn unmap(cpu: &Self::Cpu<'_>, addr: u64, len: u64);
    fn write(cpu: &Self::Cpu<'_>, addr: u64);
}

struct DesignVm(Arc<dyn AddressSpace>);

impl Vm for DesignVm {
    type Cpu<'a> = Cpu<'a>;
    fn attach(&self, cpu: usize) -> Cpu<'_> {
        Cpu::attach(&*self.0, cpu)
    }
    fn map(cpu: &Cpu<'_>, at: Option<u64>, len: u64) -> u64 {
        let at = at.map_or(MapAt::Anywhere, MapAt::Fixed);
        cpu.mmap(at, len, Prot::READ_WRITE, Backing::Anonymous)
            .expect("bench mmap")
    }
    fn unmap(cpu: &Cpu<'_>, addr: u64, len: u64) {
        cpu.munmap(addr, len).expect("bench munmap");
    }
    fn write(cpu: &Cpu<'_>, addr: u64) {
        cpu.write(addr, 1).expect("bench touch");
    }
}

/// The process's own virtual memory.
struct NativeVm {
    /// A reservation holding every fixed address the run uses.
    base: u64,
    len: usize,
}

impl NativeVm {
    fn new(len: usize) -> NativeVm {
        // SAFETY: a fresh PROT_NONE reservation; nothing else uses it.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED, "reservation");
        NativeVm {
            base: p as u64,
            len,
        }
    }
}

impl Drop for NativeVm {
    fn drop(&mut self) {
        // SAFETY: our reservation; no thread uses it any more.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
    }
}

impl Vm for NativeVm {
    type Cpu<'a> = u64;
    fn attach(&self, _cpu: usize) -> u64 {
        self.base
    }
    fn map(base: &u64, at: Option<u64>, len: u64) -> u64 {
        let (addr, flags) = match at {
            Some(a) => (base + a - BENCH_BASE_BYTES, libc::MAP_FIXED),
            None => (0, 0),
        };
        // SAFETY: either anywhere, or inside our own reservation.
        let p = unsafe {
            libc::mmap(
                addr as *mut libc::c_void,
                len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | flags,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED, "mmap");
        p as u64
    }
    fn unmap(base: &u64, addr: u64, len: u64) {
        let inside = addr >= *base && addr < base + (REGION_STRIDE_BYTES * 64);
        // SAFETY: a mapping this benchmark made; inside the reservation it
        // is replaced by PROT_NONE (freeing the pages, keeping the hole
        // reserved), elsewhere unmapped.
        let rc = unsafe {
            if inside {
                let p = libc::mmap(
                    addr as *mut libc::c_void,
                    len as usize,
                    libc::PROT_NONE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE,
                    -1,
                    0,
                );
                if p == libc::MAP_FAILED {
                    -1
                } else {
                    0
                }
            } else {
                libc::munmap(addr as *mut libc::c_void, len as usize)
            }
        };
        assert_eq!(rc, 0, "munmap");
    }
    fn write(_base: &u64, addr: u64) {
        // SAFETY: a page of a live read-write mapping of this benchmark.
        unsafe { (addr as *mut u8).write_volatile(1) };
    }
}

fn minor_faults() -> u64 {
    // SAFETY: getrusage writes the struct we pass.
    unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        u.ru_minflt as u64
    }
}

/// How the threads (or worker processes) of a workload meet: barriers,
/// hand-over queues, flags. Threads use std's primitives; per-core
/// workers use shared-memory ones that answer shootdowns while they wait
/// ([`crate::percore::Worker`]).
trait Coord: Sync {
    fn barrier(&self);
    fn hand_over(&self, to: usize, addr: u64);
    fn take(&self, me: usize) -> Option<u64>;
    fn stopped(&self) -> bool;
    fn more(&self) -> bool;
    fn set_more(&self, v: bool);
    fn relax(&self);
}

/// The threads' coordination.
struct Threads {
    stop: AtomicBool,
    round: Barrier,
    more: AtomicBool,
    rings: Vec<Mutex<VecDeque<u64>>>,
}

impl Coord for Threads {
    fn barrier(&self) {
        self.round.wait();
    }
    fn hand_over(&self, to: usize, addr: u64) {
        self.rings[to].lock().unwrap().push_back(addr);
    }
    fn take(&self, me: usize) -> Option<u64> {
        self.rings[me].lock().unwrap().pop_front()
    }
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
    fn more(&self) -> bool {
        self.more.load(Ordering::Acquire)
    }
    fn set_more(&self, v: bool) {
        self.more.store(v, Ordering::Release);
    }
    fn relax(&self) {
        std::thread::yield_now();
    }
}

impl Coord for crate::percore::Worker<'_> {
    fn barrier(&self) {
        crate::percore::Worker::barrier(self);
    }
    fn hand_over(&self, to: usize, addr: u64) {
        crate::percore::Worker::hand_over(self, to, addr);
    }
    fn take(&self, _me: usize) -> Option<u64> {
        crate::percore::Worker::take(self)
    }
    fn stopped(&self) -> bool {
        crate::percore::Worker::stopped(self)
    }
    fn more(&self) -> bool {
        crate::percore::Worker::more(self)
    }
    fn set_more(&self, v: bool) {
        crate::percore::Worker::set_more(self, v);
    }
    fn relax(&self) {
        crate::percore::Worker::relax(self);
    }
}

/// One thread's (or worker's) part of `workload`, as thread `t` of
/// `threads`: returns (iterations, page touches).
fn workload_body<V: Vm, C: Coord>(
    cpu: &V::Cpu<'_>,
    coord: &C,
    workload: Workload,
    t: usize,
    threads: usize,
    pages: u64,
) -> (u64, u64) {
    let len = pages * PAGE_SIZE_BYTES;
    let mut rng = rand::rngs::StdRng::seed_from_u64(t as u64);
    let mut order: Vec<u64> = (0..pages * threads as u64).collect();
    let (mut my_iters, mut my_touches) = (0u64, 0u64);
    match workload {
        Workload::Local => {
            let at = BENCH_BASE_BYTES + t as u64 * REGION_STRIDE_BYTES;
            while !coord.stopped() {
                let a = V::map(cpu, Some(at), len);
                for p in 0..pages {
                    V::write(cpu, a + p * PAGE_SIZE_BYTES);
                }
                V::unmap(cpu, a, len);
                my_iters += 1;
                my_touches += pages;
            }
        }
        Workload::Pipeline => {
            let next = (t + 1) % threads;
            while !coord.stopped() {
                let a = V::map(cpu, None, len);
                for p in 0..pages {
                    V::write(cpu, a + p * PAGE_SIZE_BYTES);
                }
                coord.hand_over(next, a);
                my_touches += pages;
                // Take what the previous thread handed over.
                loop {
                    if let Some(b) = coord.take(t) {
                        for p in 0..pages {
                            V::write(cpu, b + p * PAGE_SIZE_BYTES);
                        }
                        V::unmap(cpu, b, len);
                        my_touches += pages;
                        my_iters += 1;
                        break;
                    }
                    if coord.stopped() {
                        break;
                    }
                    coord.relax();
                }
            }
        }
        Workload::Global => {
            let region = BENCH_BASE_BYTES;
            let mine = region + t as u64 * len;
            loop {
                coord.barrier();
                if !coord.more() {
                    break;
                }
                // Where the region really is (native: in the
                // reservation).
                let base = V::map(cpu, Some(mine), len) - t as u64 * len;
                coord.barrier();
                order.shuffle(&mut rng);
                for &p in &order {
                    V::write(cpu, base + p * PAGE_SIZE_BYTES);
                }
                my_touches += order.len() as u64;
                coord.barrier();
                V::unmap(cpu, base + t as u64 * len, len);
                my_iters += 1;
                if t == 0 {
                    coord.set_more(!coord.stopped());
                }
            }
        }
    }
    (my_iters, my_touches)
}

/// Runs `workload` on `vm` for `secs`.
fn run_workload<V: Vm>(
    vm: &V,
    workload: Workload,
    threads: usize,
    pages: u64,
    secs: f64,
) -> Sample {
    let coord = Threads {
        stop: AtomicBool::new(false),
        round: Barrier::new(threads),
        more: AtomicBool::new(true),
        rings: (0..threads).map(|_| Mutex::new(VecDeque::new())).collect(),
    };
    let iters = AtomicU64::new(0);
    let touches = AtomicU64::new(0);
    let cpu_ns = AtomicU64::new(0);
    let start = Barrier::new(threads + 1);
    let faults_before = minor_faults();
    let tlb_before = kernel_tlb_shootdowns();
    let mut elapsed = Duration::ZERO;
    std::thread::scope(|s| {
        for t in 0..threads {
            let (iters, touches, cpu_ns, start, coord) =
                (&iters, &touches, &cpu_ns, &start, &coord);
            s.spawn(move || {
                pin(t);
                let cpu = vm.attach(t);
                start.wait();
                let cpu0 = thread_cpu_ns();
                let (my_iters, my_touches) =
                    workload_body::<V, _>(&cpu, coord, workload, t, threads, pages);
                cpu_ns.fetch_add(thread_cpu_ns() - cpu0, Ordering::Relaxed);
                iters.fetch_add(my_iters, Ordering::Relaxed);
                touches.fetch_add(my_touches, Ordering::Relaxed);
            });
        }
        start.wait();
        let t0 = Instant::now();
        std::thread::sleep(Duration::from_secs_f64(secs));
        coord.stop.store(true, Ordering::Relaxed);
        elapsed = t0.elapsed();
    });
    // Regions still in the pipeline rings stay mapped; the caller drops
    // the address space (or the process keeps a few pages).
    Sample {
        iters: iters.load(Ordering::Relaxed),
        touches: touches.load(Ordering::Relaxed),
        secs: elapsed.as_secs_f64(),
        faults: minor_faults() - faults_before,
        kernel_tlb: tlb_before.zip(kernel_tlb_shootdowns()).map(|(a, b)| b - a),
        cpu_ns: cpu_ns.load(Ordering::Relaxed),
        stats: Stats::default(),
    }
}

/// One mapbench run of `design` on the per-core backend: `threads`
/// forked workers run [`workload_body`]. Panics with the runner's error
/// (naming the worker) if a worker dies or hangs.
fn percore_map_sample(
    design: Design,
    workload: Workload,
    threads: usize,
    pages: u64,
    secs: f64,
) -> Sample {
    let frames = Frames::new_memfd(POOL_BYTES).expect("memfd frame pool");
    let space = new_space_on(design, Backend::Percore, &frames).expect("checked by usable_systems");
    let run = crate::percore::run(&*space, threads, Some(secs), &|cpu, worker| {
        let cpu0 = thread_cpu_ns();
        let (iters, touches) =
            workload_body::<DesignVm, _>(cpu, worker, workload, worker.id, threads, pages);
        [iters, touches, thread_cpu_ns() - cpu0, 0]
    })
    .unwrap_or_else(|e| {
        // The space may hold locks of a dead worker: leave without
        // dropping it.
        eprintln!("mapbench {} on percore: {e}", design.name());
        std::process::exit(1)
    });
    let stats = stats_of(space.mmu());
    Sample {
        iters: run.results.iter().map(|r| r[0]).sum(),
        touches: run.results.iter().map(|r| r[1]).sum(),
        secs: run.secs,
        faults: stats.faults,
        kernel_tlb: run.kernel_tlb,
        cpu_ns: run.results.iter().map(|r| r[2]).sum(),
        stats,
    }
}

/// One mapbench run of `system`.
fn map_sample(system: System, workload: Workload, threads: usize, pages: u64, secs: f64) -> Sample {
    match system {
        System::Design(design, Backend::Percore) => {
            percore_map_sample(design, workload, threads, pages, secs)
        }
        System::Design(design, backend) => {
            let frames = Frames::new(POOL_BYTES).expect("frame pool");
            let space = new_space_on(design, backend, &frames).expect("checked by usable_systems");
            let vm = DesignVm(space.clone());
            let mut sample = run_workload(&vm, workload, threads, pages, secs);
            sample.stats = stats_of(space.mmu());
            sample.faults = sample.stats.faults;
            sample
        }
        System::Native => {
            let vm = NativeVm::new((REGION_STRIDE_BYTES * 64) as usize);
            run_workload(&vm, workload, threads, pages, secs)
        }
    }
}

/// Runs mapbench, calling `row` as each row completes.
/// Userfaultfd rows are left out (with a note on stderr) where the
/// kernel offers no userfaultfd.
pub fn mapbench(options: &Options, mut row: impl FnMut(&MapRow)) -> Vec<MapRow> {
    let mut rows = Vec::new();
    let systems = usable_systems(&options.systems, |why| eprintln!("mapbench: {why}"));
    for &workload in &options.workloads {
        for &threads in &options.threads {
            for &system in &systems {
                let samples: Vec<Sample> = (0..options.runs.max(1))
                    .map(|_| map_sample(system, workload, threads, options.pages, options.secs))
                    .collect();
                let (iters_per_sec, spread_pct) =
                    median_spread(samples.iter().map(|s| s.iters as f64 / s.secs).collect());
                let (touches_per_sec, _) =
                    median_spread(samples.iter().map(|s| s.touches as f64 / s.secs).collect());
                let iters: u64 = samples.iter().map(|s| s.iters).sum::<u64>().max(1);
                let faults: u64 = samples.iter().map(|s| s.faults).sum();
                let shootdowns: u64 = samples.iter().map(|s| s.stats.shootdowns).sum();
                let targets: u64 = samples.iter().map(|s| s.stats.shootdown_targets).sum();
                let design = matches!(system, System::Design(..));
                let kernel_tlb: Option<u64> = samples.iter().map(|s| s.kernel_tlb).sum();
                let (cpu_us_per_iter, _) = median_spread(
                    samples
                        .iter()
                        .map(|s| s.cpu_ns as f64 / 1e3 / s.iters.max(1) as f64)
                        .collect(),
                );
                let r = MapRow {
                    workload,
                    system,
                    fault_around_pages: fault_around_of(system),
                    threads,
                    pages: options.pages,
                    iters_per_sec,
                    touches_per_sec,
                    faults_per_iter: faults as f64 / iters as f64,
                    shootdowns_per_iter: design.then(|| shootdowns as f64 / iters as f64),
                    targets_per_shootdown: design.then(|| {
                        if shootdowns == 0 {
                            0.0
                        } else {
                            targets as f64 / shootdowns as f64
                        }
                    }),
                    messages_per_iter: design.then(|| targets as f64 / iters as f64),
                    page_table_pages: design
                        .then(|| samples.last().map_or(0, |s| s.stats.page_table_pages)),
                    kernel_tlb_ipis_per_iter: kernel_tlb
                        .filter(|_| system.tlb() == "real")
                        .map(|k| k as f64 / iters as f64),
                    cpu_us_per_iter: Some(cpu_us_per_iter),
                    spread_pct,
                    runs: samples.len(),
                };
                row(&r);
                rows.push(r);
            }
        }
    }
    rows
}

/// Parses the command-line flags shared by the examples (and usable by
/// `memlab`): `--threads 1,2 --secs S --runs N --pages P --workloads
/// local,pipeline --systems radixvm,native-linux --fractions 0,0.5
/// --quick --json`. Returns the options and whether `--json` was given.
pub fn parse_args(args: impl IntoIterator<Item = String>) -> Result<(Options, bool), String> {
    let mut options = Options::default();
    let mut json = false;
    let mut args = args.into_iter();
    fn list<T>(v: Option<String>, f: impl Fn(&str) -> Result<T, String>) -> Result<Vec<T>, String> {
        v.ok_or("missing value")?.split(',').map(f).collect()
    }
    while let Some(a) = args.next() {
        match a.as_str() {
            "--threads" => {
                options.threads = list(args.next(), |t| t.parse().map_err(|e| format!("{e}")))?
            }
            "--secs" => {
                options.secs = args
                    .next()
                    .ok_or("--secs S")?
                    .parse()
                    .map_err(|e| format!("{e}"))?
            }
            "--runs" => {
                options.runs = args
                    .next()
                    .ok_or("--runs N")?
                    .parse()
                    .map_err(|e| format!("{e}"))?
            }
            "--pages" => {
                options.pages = args
                    .next()
                    .ok_or("--pages P")?
                    .parse()
                    .map_err(|e| format!("{e}"))?
            }
            "--workloads" => options.workloads = list(args.next(), |w| w.parse())?,
            "--systems" => options.systems = list(args.next(), |s| s.parse())?,
            "--fractions" => {
                options.map_fractions =
                    list(args.next(), |f| f.parse().map_err(|e| format!("{e}")))?
            }
            "--quick" => {
                let q = Options::quick();
                options.secs = q.secs;
                options.runs = q.runs;
                options.map_fractions = q.map_fractions;
            }
            "--json" => json = true,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok((options, json))
}
