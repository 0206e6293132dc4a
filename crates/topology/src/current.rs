//! Which CPU (and NUMA node) the calling thread is running on, as cheaply as
//! the hardware allows.

use std::fmt;
use std::sync::atomic::{AtomicU8, Ordering};

#[cfg(target_arch = "x86_64")]
use crate::arch;

/// Linux programs IA32_TSC_AUX as `(node << TSC_AUX_CPU_BITS) | cpu`.
pub const TSC_AUX_CPU_BITS: u32 = 12;
/// Mask extracting the CPU id from IA32_TSC_AUX.
pub const TSC_AUX_CPU_MASK: u32 = (1 << TSC_AUX_CPU_BITS) - 1;

/// How many (sched_getcpu, TSC_AUX, sched_getcpu) samples detection takes
/// at most while cross-checking a hardware method against the kernel.
#[cfg(target_arch = "x86_64")]
const CPU_ID_VALIDATION_ATTEMPTS: usize = 32;
/// How many migration-free agreeing samples accept a hardware method.
#[cfg(target_arch = "x86_64")]
const CPU_ID_VALIDATION_AGREEMENTS: usize = 3;
/// Upper bound on the size of `/sys/devices/system/cpu/possible` we read
/// (on the stack, so detection never allocates).
#[cfg(target_arch = "x86_64")]
const POSSIBLE_CPUS_READ_BUFFER_BYTES: usize = 256;
#[cfg(target_arch = "x86_64")]
const SYSFS_POSSIBLE_CPUS_PATH: &std::ffi::CStr = c"/sys/devices/system/cpu/possible";

/// Bits of the cached detection state; 0 means "not detected yet".
const STATE_DETECTED: u8 = 1 << 0;
const STATE_RDPID_OK: u8 = 1 << 1;
const STATE_RDTSCP_OK: u8 = 1 << 2;
static STATE: AtomicU8 = AtomicU8::new(0);

/// A way of asking "which CPU am I on?".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CpuIdMethod {
    /// `RDPID`: reads IA32_TSC_AUX directly (a few cycles).
    Rdpid,
    /// `RDTSCP`: reads the TSC and IA32_TSC_AUX; the TSC is discarded.
    Rdtscp,
    /// glibc `sched_getcpu()` (vDSO or rseq; no hardware assumption).
    Sched,
}

impl CpuIdMethod {
    /// All methods, fastest first.
    pub const ALL: [CpuIdMethod; 3] = [CpuIdMethod::Rdpid, CpuIdMethod::Rdtscp, CpuIdMethod::Sched];

    /// Whether this method can be used here: the CPU has the instruction,
    /// the kernel's IA32_TSC_AUX agreed with `sched_getcpu()` at detection,
    /// and every possible CPU id fits the 12-bit TSC_AUX field. `Sched` is
    /// always supported.
    pub fn is_supported(self) -> bool {
        let state = state();
        match self {
            CpuIdMethod::Rdpid => state & STATE_RDPID_OK != 0,
            CpuIdMethod::Rdtscp => state & STATE_RDTSCP_OK != 0,
            CpuIdMethod::Sched => true,
        }
    }

    /// Short lowercase name ("rdpid", "rdtscp", "sched_getcpu").
    pub fn name(self) -> &'static str {
        match self {
            CpuIdMethod::Rdpid => "rdpid",
            CpuIdMethod::Rdtscp => "rdtscp",
            CpuIdMethod::Sched => "sched_getcpu",
        }
    }
}

impl fmt::Display for CpuIdMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The supported methods, fastest first (always ends with `Sched`).
pub fn supported_cpu_id_methods() -> Vec<CpuIdMethod> {
    CpuIdMethod::ALL
        .into_iter()
        .filter(|m| m.is_supported())
        .collect()
}

/// The method [`current_cpu`] uses: the fastest supported one.
pub fn cpu_id_method() -> CpuIdMethod {
    best(state())
}

/// The id of the CPU the calling thread is running on.
///
/// Like any such query the answer may be stale by the time it is used (the
/// thread can migrate right after); it is a placement hint, not a lock.
/// Never allocates and never blocks, so it is usable inside a global
/// allocator; the first call runs detection (a few CPUID instructions, a
/// short sysfs read and at most 128 `sched_getcpu()` calls).
#[inline]
pub fn current_cpu() -> usize {
    let state = state();
    match tsc_aux(best(state), state) {
        Some(aux) => (aux & TSC_AUX_CPU_MASK) as usize,
        None => sched_cpu(),
    }
}

/// [`current_cpu`] with an explicit method, for tests and benchmarks.
///
/// # Panics
/// If `method` is not supported here (see [`CpuIdMethod::is_supported`]).
#[inline]
pub fn current_cpu_with(method: CpuIdMethod) -> usize {
    if method == CpuIdMethod::Sched {
        return sched_cpu();
    }
    match tsc_aux(method, state()) {
        Some(aux) => (aux & TSC_AUX_CPU_MASK) as usize,
        None => panic!("CPU-id method {method} is not supported on this machine"),
    }
}

/// The calling thread's CPU id and the kernel **id** of its NUMA node, read
/// together (so they are consistent with each other).
///
/// With RDPID/RDTSCP both come from one read of IA32_TSC_AUX. Otherwise the
/// `getcpu` system call is used (slower: no vDSO through `libc::syscall`),
/// and if that fails the node is reported as 0. The node id is the `N` of
/// `/sys/devices/system/node/nodeN`; convert it with
/// [`crate::Topology::node_index_of_id`] when ids may be sparse.
#[inline]
pub fn current_cpu_and_node() -> (usize, usize) {
    let state = state();
    match tsc_aux(best(state), state) {
        Some(aux) => (
            (aux & TSC_AUX_CPU_MASK) as usize,
            (aux >> TSC_AUX_CPU_BITS) as usize,
        ),
        None => getcpu_syscall().unwrap_or_else(|| (sched_cpu(), 0)),
    }
}

#[inline]
fn state() -> u8 {
    let state = STATE.load(Ordering::Relaxed);
    if state != 0 {
        state
    } else {
        detect()
    }
}

#[inline]
fn best(state: u8) -> CpuIdMethod {
    if state & STATE_RDPID_OK != 0 {
        CpuIdMethod::Rdpid
    } else if state & STATE_RDTSCP_OK != 0 {
        CpuIdMethod::Rdtscp
    } else {
        CpuIdMethod::Sched
    }
}

/// Raw IA32_TSC_AUX via `method`, or `None` for `Sched` and for hardware
/// methods that `state` does not mark as usable.
#[inline(always)]
fn tsc_aux(method: CpuIdMethod, state: u8) -> Option<u32> {
    #[cfg(target_arch = "x86_64")]
    match method {
        CpuIdMethod::Rdpid if state & STATE_RDPID_OK != 0 => {
            // SAFETY: STATE_RDPID_OK is only set by `detect` after CPUID
            // reported RDPID support.
            return Some(unsafe { arch::rdpid() });
        }
        CpuIdMethod::Rdtscp if state & STATE_RDTSCP_OK != 0 => {
            // SAFETY: STATE_RDTSCP_OK is only set by `detect` after CPUID
            // reported RDTSCP support.
            return Some(unsafe { arch::rdtscp() }.1);
        }
        _ => {}
    }
    let _ = (method, state);
    None
}

/// `sched_getcpu()`, with its error value (-1) mapped to CPU 0.
#[inline]
fn sched_cpu() -> usize {
    usize::try_from(raw_sched_getcpu()).unwrap_or(0)
}

#[inline]
fn raw_sched_getcpu() -> i32 {
    // SAFETY: sched_getcpu takes no arguments and has no preconditions.
    unsafe { libc::sched_getcpu() }
}

/// The `getcpu(2)` system call: (cpu, node id).
fn getcpu_syscall() -> Option<(usize, usize)> {
    let mut cpu: libc::c_uint = 0;
    let mut node: libc::c_uint = 0;
    // SAFETY: getcpu writes one c_uint through each of the two valid,
    // writable pointers; its third argument is unused and may be null.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_getcpu,
            &mut cpu as *mut libc::c_uint,
            &mut node as *mut libc::c_uint,
            std::ptr::null_mut::<libc::c_void>(),
        )
    };
    (ret == 0).then_some((cpu as usize, node as usize))
}

/// Detects the usable methods, caches them in `STATE` and returns the state.
/// Allocation-free. Races are benign: every thread computes the same value.
#[cold]
#[inline(never)]
fn detect() -> u8 {
    let state = STATE_DETECTED | usable_hardware_methods();
    STATE.store(state, Ordering::Relaxed);
    state
}

/// `STATE_RDPID_OK` / `STATE_RDTSCP_OK` bits for the instructions that both
/// exist and return what the kernel says.
#[cfg(target_arch = "x86_64")]
fn usable_hardware_methods() -> u8 {
    // Linux truncates CPU ids above 4095 in TSC_AUX, so on such machines
    // only the kernel can be asked.
    // (Unknown counts as fitting: `Option::is_none_or` is newer than MSRV.)
    if matches!(max_possible_cpu_id(), Some(max) if max > TSC_AUX_CPU_MASK as usize) {
        return 0;
    }
    let mut bits = 0;
    if arch::has_rdpid()
        // SAFETY: the closure runs only after `has_rdpid()` (checked just
        // above, short-circuit) reported RDPID support.
        && tsc_aux_matches_kernel(|| unsafe { arch::rdpid() })
    {
        bits |= STATE_RDPID_OK;
    }
    if arch::has_rdtscp()
        // SAFETY: the closure runs only after `has_rdtscp()` (checked just
        // above, short-circuit) reported RDTSCP support.
        && tsc_aux_matches_kernel(|| unsafe { arch::rdtscp() }.1)
    {
        bits |= STATE_RDTSCP_OK;
    }
    bits
}

#[cfg(not(target_arch = "x86_64"))]
fn usable_hardware_methods() -> u8 {
    0
}

/// Cross-checks a TSC_AUX reader against `sched_getcpu()`: a hypervisor or
/// kernel that does not program IA32_TSC_AUX would otherwise make every
/// thread look like it runs on CPU 0. Samples where the thread migrated
/// (the two kernel answers differ) are skipped. If the kernel cannot answer
/// at all, CPUID is trusted.
#[cfg(target_arch = "x86_64")]
fn tsc_aux_matches_kernel(read_aux: impl Fn() -> u32) -> bool {
    let mut agreements = 0;
    for _ in 0..CPU_ID_VALIDATION_ATTEMPTS {
        let before = raw_sched_getcpu();
        let aux = read_aux();
        let after = raw_sched_getcpu();
        if before < 0 {
            return true;
        }
        if before != after {
            continue;
        }
        if (aux & TSC_AUX_CPU_MASK) as i32 != before {
            return false;
        }
        agreements += 1;
        if agreements == CPU_ID_VALIDATION_AGREEMENTS {
            break;
        }
    }
    true
}

/// Largest possible CPU id from sysfs, read without allocating. `None` if
/// the file is missing, unreadable or longer than the buffer.
#[cfg(target_arch = "x86_64")]
fn max_possible_cpu_id() -> Option<usize> {
    let mut buf = [0u8; POSSIBLE_CPUS_READ_BUFFER_BYTES];
    // SAFETY: the path is a NUL-terminated C string literal.
    let fd = unsafe {
        libc::open(
            SYSFS_POSSIBLE_CPUS_PATH.as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: `buf` is a live, writable buffer of exactly `buf.len()` bytes
    // and `fd` is the descriptor opened above.
    let len = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    // SAFETY: `fd` was opened above and is closed exactly once.
    unsafe { libc::close(fd) };
    let len = usize::try_from(len)
        .ok()
        .filter(|&n| n > 0 && n < buf.len())?;
    last_cpu_in_list(&buf[..len])
}

/// The last CPU id of a kernel range list, which is its maximum because the
/// kernel prints lists in ascending order.
#[cfg(any(target_arch = "x86_64", test))]
fn last_cpu_in_list(list: &[u8]) -> Option<usize> {
    let list = list.trim_ascii_end();
    let digits = list.iter().rev().take_while(|b| b.is_ascii_digit()).count();
    std::str::from_utf8(&list[list.len() - digits..])
        .ok()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_cpu_of_list() {
        assert_eq!(last_cpu_in_list(b"0-255\n"), Some(255));
        assert_eq!(last_cpu_in_list(b"0,2,4-7"), Some(7));
        assert_eq!(last_cpu_in_list(b"3"), Some(3));
        assert_eq!(last_cpu_in_list(b"\n"), None);
        assert_eq!(last_cpu_in_list(b"0-"), None);
    }

    #[test]
    fn sched_is_always_supported_and_listed_last() {
        assert!(CpuIdMethod::Sched.is_supported());
        assert_eq!(supported_cpu_id_methods().last(), Some(&CpuIdMethod::Sched));
        assert!(cpu_id_method().is_supported());
        assert_eq!(supported_cpu_id_methods()[0], cpu_id_method());
    }

    #[test]
    fn answers_are_in_range() {
        let max = crate::topology().max_cpu_id();
        for method in supported_cpu_id_methods() {
            assert!(current_cpu_with(method) <= max, "{method}");
        }
        let (cpu, node) = current_cpu_and_node();
        assert!(cpu <= max);
        assert!(crate::topology().node_index_of_id(node).is_some());
    }
}
