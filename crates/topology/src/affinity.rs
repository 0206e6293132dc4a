//! Thread pinning and the calling thread's allowed-CPU set.

use std::io;
use std::mem::size_of;

use crate::cpulist::{format_cpu_list, online_cpus};

type MaskWord = libc::c_ulong;
const MASK_WORD_BITS: usize = MaskWord::BITS as usize;
/// Smallest mask handed to the kernel: glibc's `CPU_SETSIZE`.
const CPU_MASK_MIN_BITS: usize = 1024;
/// Largest mask tried when the kernel keeps asking for a bigger one.
const CPU_MASK_MAX_BITS: usize = 1 << 20;

/// The calling thread's affinity mask via the raw `sched_getaffinity`
/// system call, growing the buffer beyond `CPU_SETSIZE` when the kernel has
/// more CPU ids than that.
pub(crate) fn affinity_mask() -> io::Result<Vec<usize>> {
    let mut bits = CPU_MASK_MIN_BITS;
    loop {
        let mut mask: Vec<MaskWord> = vec![0; bits / MASK_WORD_BITS];
        let len_bytes = mask.len() * size_of::<MaskWord>();
        // SAFETY: `mask` is a live, writable buffer of exactly `len_bytes`
        // bytes (a whole number of longs, as the kernel requires); pid 0 is
        // the calling thread.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_sched_getaffinity,
                0 as libc::c_long,
                len_bytes,
                mask.as_mut_ptr(),
            )
        };
        if ret >= 0 {
            // The kernel returns how many bytes it wrote.
            let written_words = (ret as usize)
                .div_ceil(size_of::<MaskWord>())
                .min(mask.len());
            let cpus = mask[..written_words]
                .iter()
                .enumerate()
                .flat_map(|(w, &word)| {
                    (0..MASK_WORD_BITS)
                        .filter(move |b| word & (1 << b) != 0)
                        .map(move |b| w * MASK_WORD_BITS + b)
                })
                .collect();
            return Ok(cpus);
        }
        let err = io::Error::last_os_error();
        // EINVAL: buffer smaller than the kernel's CPU mask.
        if err.raw_os_error() == Some(libc::EINVAL) && bits < CPU_MASK_MAX_BITS {
            bits *= 2;
            continue;
        }
        return Err(err);
    }
}

/// The CPUs the calling thread may run on (its `sched_getaffinity` mask),
/// sorted. After [`pin_current_thread`] this is just the pinned CPU. If the
/// system call fails (seccomp), returns [`online_cpus()`].
pub fn allowed_cpus() -> Vec<usize> {
    affinity_mask().unwrap_or_else(|_| online_cpus())
}

/// Restricts the calling thread to `cpu` with `sched_setaffinity`. When it
/// returns `Ok`, the thread is already running there.
///
/// Errors (`ErrorKind::InvalidInput`, with a message saying which) if `cpu`
/// is not online, or is online but outside the thread's cpuset (container
/// or cgroup limits); other system-call failures are passed on with
/// context. A thread already pinned elsewhere can be re-pinned to any CPU
/// of its cpuset.
pub fn pin_current_thread(cpu: usize) -> io::Result<()> {
    let online = online_cpus();
    if online.binary_search(&cpu).is_err() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "cannot pin to CPU {cpu}: it is not online (online CPUs: {})",
                format_cpu_list(&online)
            ),
        ));
    }
    let bits = (cpu + 1)
        .next_multiple_of(MASK_WORD_BITS)
        .max(CPU_MASK_MIN_BITS);
    let mut mask: Vec<MaskWord> = vec![0; bits / MASK_WORD_BITS];
    mask[cpu / MASK_WORD_BITS] |= 1 << (cpu % MASK_WORD_BITS);
    let len_bytes = mask.len() * size_of::<MaskWord>();
    // SAFETY: `mask` is a live buffer of exactly `len_bytes` bytes, which
    // the kernel only reads; pid 0 is the calling thread.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_sched_setaffinity,
            0 as libc::c_long,
            len_bytes,
            mask.as_ptr(),
        )
    };
    if ret == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EINVAL) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "cannot pin to CPU {cpu}: it is online but not allowed for this thread \
                 (cpuset/cgroup restriction; online CPUs: {})",
                format_cpu_list(&online)
            ),
        ));
    }
    Err(io::Error::new(
        err.kind(),
        format!("sched_setaffinity to CPU {cpu} failed: {err}"),
    ))
}
