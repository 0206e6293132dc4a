//! Platform layer (dissertation §4.4, §4.6): CPUs, NUMA nodes, the current
//! CPU id, the time-stamp counter, and thread pinning.
//!
//! Per-core log heads and per-CPU heaps choose their slot from the id of the
//! CPU the thread runs on, on every operation, so that id must cost a few
//! cycles rather than a system call. [`current_cpu`] uses `RDPID` if CPUID
//! advertises it, else `RDTSCP`, else glibc's `sched_getcpu()`; both
//! instructions read IA32_TSC_AUX, which Linux sets to `(node << 12) | cpu`,
//! so [`current_cpu_and_node`] gets the node for free. The choice is made
//! once, cross-checked against the kernel, cached in one atomic byte, and
//! never allocates (an allocator may call it). [`current_cpu_with`] exposes
//! each method so benchmarks can compare them.
//!
//! Epochs compare [`rdtsc`] stamps taken on different cores, which is only
//! meaningful with an invariant TSC ([`tsc_invariant`]) that the kernel has
//! found synchronised across cores; [`tsc_hz`] and [`tsc_to_ns`] turn ticks
//! into time. [`topology()`] maps online CPUs to NUMA nodes from sysfs so
//! per-node structures can be laid out ([`Topology::synthetic`] fakes
//! many-node machines for tests), and [`pin_current_thread`] makes placement
//! experiments repeatable.
//!
//! Real hardware access is limited to CPUID, RDTSC, RDTSCP and RDPID on
//! x86-64; everything else asks the kernel (sysfs, `/proc/cpuinfo`,
//! `sched_{get,set}affinity`, `sched_getcpu`, `clock_gettime`). Elsewhere the
//! CPU id comes from the kernel and "TSC" is `CLOCK_MONOTONIC` nanoseconds.

#![warn(missing_docs)]
#![deny(clippy::undocumented_unsafe_blocks)]
#![deny(unsafe_op_in_unsafe_fn)]

mod affinity;
#[cfg(target_arch = "x86_64")]
mod arch;
mod cpulist;
mod current;
mod numa;
mod tsc;

pub use affinity::{allowed_cpus, pin_current_thread};
pub use cpulist::{
    format_cpu_list, online_cpus, parse_cpu_list, ParseError, CPU_LIST_MAX_CPU_ID,
    SYSFS_ONLINE_CPUS_PATH,
};
pub use current::{
    cpu_id_method, current_cpu, current_cpu_and_node, current_cpu_with, supported_cpu_id_methods,
    CpuIdMethod, TSC_AUX_CPU_BITS, TSC_AUX_CPU_MASK,
};
pub use numa::{topology, Node, Topology, SYSFS_NODE_DIR};
pub use tsc::{
    calibrate_tsc_hz, ns_to_tsc, rdtsc, rdtscp, tsc_hz, tsc_hz_source, tsc_invariant, tsc_to_ns,
    TscHzSource, TSC_CALIBRATION_ROUNDS, TSC_CALIBRATION_WINDOW_MS, TSC_SANE_MAX_HZ,
    TSC_SANE_MIN_HZ,
};
