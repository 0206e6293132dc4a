//! The time-stamp counter: reading it, whether it is invariant, and its
//! frequency.

use std::sync::OnceLock;
use std::time::Duration;

#[cfg(target_arch = "x86_64")]
use crate::arch;

/// Length of one calibration round against `CLOCK_MONOTONIC`.
pub const TSC_CALIBRATION_WINDOW_MS: u64 = 20;
/// Calibration rounds; the one with the tightest clock brackets wins.
pub const TSC_CALIBRATION_ROUNDS: usize = 3;
/// Lowest TSC frequency accepted from CPUID as plausible.
pub const TSC_SANE_MIN_HZ: u64 = 100_000_000;
/// Highest TSC frequency accepted from CPUID as plausible.
pub const TSC_SANE_MAX_HZ: u64 = 10_000_000_000;

/// (rdtsc, clock_gettime, rdtsc) brackets tried per calibration endpoint;
/// the narrowest (least disturbed) is used.
const CLOCK_BRACKET_TRIES: usize = 16;
const NS_PER_S: u64 = 1_000_000_000;
#[cfg(any(target_arch = "x86_64", test))]
const HZ_PER_MHZ: u64 = 1_000_000;
/// Fractional bits of the fixed-point tick <-> ns factors.
const FIXED_POINT_FRACTION_BITS: u32 = 32;

/// Where [`tsc_hz`] got its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TscHzSource {
    /// CPUID leaf 0x15: crystal Hz × numerator / denominator.
    CpuidLeaf15,
    /// CPUID leaf 0x15 ratio with the crystal derived from leaf 0x16's base
    /// frequency (which makes the TSC rate equal to that base frequency).
    CpuidLeaf15And16,
    /// Measured against `CLOCK_MONOTONIC` (see [`calibrate_tsc_hz`]).
    Calibrated,
    /// Not x86-64: [`rdtsc`] returns `CLOCK_MONOTONIC` nanoseconds.
    MonotonicClock,
}

struct TscClock {
    hz: u64,
    source: TscHzSource,
    /// Nanoseconds per tick, fixed point with `FIXED_POINT_FRACTION_BITS`.
    ns_per_tick_fixed: u64,
    /// Ticks per nanosecond, fixed point with `FIXED_POINT_FRACTION_BITS`.
    ticks_per_ns_fixed: u64,
}

impl TscClock {
    fn new(hz: u64, source: TscHzSource) -> TscClock {
        let hz = hz.max(1);
        let ns_per_tick = (u128::from(NS_PER_S) << FIXED_POINT_FRACTION_BITS) / u128::from(hz);
        let ticks_per_ns = (u128::from(hz) << FIXED_POINT_FRACTION_BITS) / u128::from(NS_PER_S);
        TscClock {
            hz,
            source,
            ns_per_tick_fixed: u64::try_from(ns_per_tick).unwrap_or(u64::MAX),
            ticks_per_ns_fixed: u64::try_from(ticks_per_ns).unwrap_or(u64::MAX),
        }
    }
}

static TSC_CLOCK: OnceLock<TscClock> = OnceLock::new();
static TSC_INVARIANT: OnceLock<bool> = OnceLock::new();
#[cfg(target_arch = "x86_64")]
static RDTSCP_SUPPORTED: OnceLock<bool> = OnceLock::new();

fn tsc_clock() -> &'static TscClock {
    TSC_CLOCK.get_or_init(|| {
        let (hz, source) = detect_tsc_hz();
        TscClock::new(hz, source)
    })
}

/// Reads the time-stamp counter (not serialising: it may execute before
/// earlier instructions finish). On non-x86-64 targets this returns
/// `CLOCK_MONOTONIC` in nanoseconds, and [`tsc_hz`] is 10^9. Under Miri,
/// which cannot execute RDTSC, it also returns `CLOCK_MONOTONIC`: that
/// keeps the property callers rely on (reads ordered in time are not
/// decreasing), so the TSC-based code can be checked there.
#[inline]
pub fn rdtsc() -> u64 {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    {
        arch::rdtsc()
    }
    #[cfg(any(not(target_arch = "x86_64"), miri))]
    {
        monotonic_ns()
    }
}

/// Reads the TSC and IA32_TSC_AUX (`(node << 12) | cpu` on Linux) with
/// RDTSCP, which waits for earlier instructions to execute first. `None`
/// when the processor lacks RDTSCP (or this is not x86-64).
#[inline]
pub fn rdtscp() -> Option<(u64, u32)> {
    #[cfg(target_arch = "x86_64")]
    {
        if *RDTSCP_SUPPORTED.get_or_init(arch::has_rdtscp) {
            // SAFETY: RDTSCP_SUPPORTED is true only if CPUID reported RDTSCP.
            return Some(unsafe { arch::rdtscp() });
        }
    }
    None
}

/// Whether the TSC ticks at a constant rate in all P-, C- and T-states:
/// CPUID 0x8000_0007 EDX bit 8, or else both `constant_tsc` and
/// `nonstop_tsc` in the `/proc/cpuinfo` flags (the kernel sets these from
/// CPUID plus per-model knowledge). Cached.
///
/// Invariance is per core; whether the cores' TSCs are also *synchronised*
/// is checked by the kernel at boot (it keeps `tsc` as the clocksource only
/// if so). Off x86-64 this is `true`, since [`rdtsc`] is then the
/// monotonic clock.
pub fn tsc_invariant() -> bool {
    *TSC_INVARIANT.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            arch::has_invariant_tsc()
                || std::fs::read_to_string("/proc/cpuinfo")
                    .is_ok_and(|text| cpuinfo_has_flags(&text, &["constant_tsc", "nonstop_tsc"]))
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            true
        }
    })
}

/// TSC frequency in Hz, determined once: from CPUID leaf 0x15 (with leaf
/// 0x16 supplying the crystal when 0x15 leaves it out) if that gives a
/// complete, plausible answer, else by [`calibrate_tsc_hz`] (about
/// `TSC_CALIBRATION_ROUNDS × TSC_CALIBRATION_WINDOW_MS` on the first call).
pub fn tsc_hz() -> u64 {
    tsc_clock().hz
}

/// Where [`tsc_hz`]'s value came from.
pub fn tsc_hz_source() -> TscHzSource {
    tsc_clock().source
}

/// Converts a TSC tick count (a difference of two [`rdtsc`] readings) to
/// nanoseconds. One 64×64-bit multiply; saturates at `u64::MAX`.
#[inline]
pub fn tsc_to_ns(ticks: u64) -> u64 {
    scale_fixed(ticks, tsc_clock().ns_per_tick_fixed)
}

/// Converts nanoseconds to TSC ticks (inverse of [`tsc_to_ns`]);
/// saturates at `u64::MAX`.
#[inline]
pub fn ns_to_tsc(ns: u64) -> u64 {
    scale_fixed(ns, tsc_clock().ticks_per_ns_fixed)
}

#[inline]
fn scale_fixed(value: u64, factor_fixed: u64) -> u64 {
    let scaled = (u128::from(value) * u128::from(factor_fixed)) >> FIXED_POINT_FRACTION_BITS;
    u64::try_from(scaled).unwrap_or(u64::MAX)
}

/// Measures the TSC frequency against `CLOCK_MONOTONIC`, uncached: each of
/// `TSC_CALIBRATION_ROUNDS` rounds brackets a clock reading with two TSC
/// reads at both ends of a `TSC_CALIBRATION_WINDOW_MS` sleep, and the round
/// with the narrowest brackets (least interference) wins. Takes about
/// 60 ms. Useful to cross-check a CPUID-derived [`tsc_hz`].
pub fn calibrate_tsc_hz() -> u64 {
    let window_ns = TSC_CALIBRATION_WINDOW_MS * 1_000_000;
    (0..TSC_CALIBRATION_ROUNDS)
        .map(|_| calibration_round(window_ns))
        .min_by_key(|&(_, uncertainty_ticks)| uncertainty_ticks)
        .map_or(NS_PER_S, |(hz, _)| hz)
}

/// One round: (estimated Hz, summed bracket width in ticks).
fn calibration_round(window_ns: u64) -> (u64, u64) {
    let (tsc_start, ns_start, width_start) = clock_bracket();
    let mut now_ns = ns_start;
    while now_ns.saturating_sub(ns_start) < window_ns {
        std::thread::sleep(Duration::from_nanos(window_ns - (now_ns - ns_start)));
        now_ns = monotonic_ns();
    }
    let (tsc_end, ns_end, width_end) = clock_bracket();
    let ticks = tsc_end.saturating_sub(tsc_start);
    let ns = ns_end.saturating_sub(ns_start).max(1);
    let hz = u128::from(ticks) * u128::from(NS_PER_S) / u128::from(ns);
    (
        u64::try_from(hz).unwrap_or(u64::MAX),
        width_start + width_end,
    )
}

/// A (TSC, monotonic ns) pair taken as close together as possible: the
/// TSC value is the midpoint of the narrowest of several
/// rdtsc/clock_gettime/rdtsc brackets. Returns (tsc, ns, bracket width).
fn clock_bracket() -> (u64, u64, u64) {
    let mut best = (0, 0, u64::MAX);
    for _ in 0..CLOCK_BRACKET_TRIES {
        let before = rdtsc();
        let ns = monotonic_ns();
        let after = rdtsc();
        let width = after.saturating_sub(before);
        if width < best.2 {
            best = (before + width / 2, ns, width);
        }
    }
    best
}

/// `CLOCK_MONOTONIC` in nanoseconds.
fn monotonic_ns() -> u64 {
    // SAFETY: timespec is plain integers, for which all-zero is valid.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC exists on
    // every Linux kernel, so the call cannot fail with these arguments.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64) * NS_PER_S + ts.tv_nsec as u64
}

fn detect_tsc_hz() -> (u64, TscHzSource) {
    #[cfg(target_arch = "x86_64")]
    {
        let leaf15 = arch::cpuid_if_present(0x15).map(|r| (r.eax, r.ebx, r.ecx));
        let leaf16_base_mhz = arch::cpuid_if_present(0x16).map(|r| r.eax & 0xffff);
        tsc_hz_from_cpuid(leaf15, leaf16_base_mhz)
            .unwrap_or_else(|| (calibrate_tsc_hz(), TscHzSource::Calibrated))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        (NS_PER_S, TscHzSource::MonotonicClock)
    }
}

/// The TSC frequency implied by CPUID leaf 0x15 (`(eax = denominator,
/// ebx = numerator, ecx = crystal Hz)`) and leaf 0x16's base MHz, following
/// Linux's `native_calibrate_tsc`: needs a ratio, and a crystal either from
/// 0x15 or derived from 0x16 (crystal = base × den / num, so the TSC runs
/// at exactly the base frequency). Implausible results are rejected.
#[cfg(any(target_arch = "x86_64", test))]
fn tsc_hz_from_cpuid(
    leaf15: Option<(u32, u32, u32)>,
    leaf16_base_mhz: Option<u32>,
) -> Option<(u64, TscHzSource)> {
    let (denominator, numerator, crystal_hz) = leaf15?;
    if denominator == 0 || numerator == 0 {
        return None;
    }
    let (hz, source) = if crystal_hz != 0 {
        (
            u64::from(crystal_hz) * u64::from(numerator) / u64::from(denominator),
            TscHzSource::CpuidLeaf15,
        )
    } else {
        let base_mhz = leaf16_base_mhz.filter(|&mhz| mhz != 0)?;
        (
            u64::from(base_mhz) * HZ_PER_MHZ,
            TscHzSource::CpuidLeaf15And16,
        )
    };
    (TSC_SANE_MIN_HZ..=TSC_SANE_MAX_HZ)
        .contains(&hz)
        .then_some((hz, source))
}

/// Whether the first `flags` line of `/proc/cpuinfo` text has all `wanted`.
#[cfg(any(target_arch = "x86_64", test))]
fn cpuinfo_has_flags(cpuinfo: &str, wanted: &[&str]) -> bool {
    let Some(flags) = cpuinfo
        .lines()
        .find(|line| {
            line.split(':')
                .next()
                .is_some_and(|key| key.trim() == "flags")
        })
        .and_then(|line| line.split_once(':'))
        .map(|(_, flags)| flags)
    else {
        return false;
    };
    wanted
        .iter()
        .all(|w| flags.split_ascii_whitespace().any(|f| f == *w))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpuid_leaf_arithmetic() {
        // Crystal given: 24 MHz × 176 / 2 = 2.112 GHz.
        assert_eq!(
            tsc_hz_from_cpuid(Some((2, 176, 24_000_000)), None),
            Some((2_112_000_000, TscHzSource::CpuidLeaf15))
        );
        // Crystal missing, leaf 0x16 base frequency 2100 MHz.
        assert_eq!(
            tsc_hz_from_cpuid(Some((2, 175, 0)), Some(2100)),
            Some((2_100_000_000, TscHzSource::CpuidLeaf15And16))
        );
        // Incomplete answers.
        assert_eq!(tsc_hz_from_cpuid(None, Some(2100)), None);
        assert_eq!(tsc_hz_from_cpuid(Some((0, 0, 0)), Some(2100)), None);
        assert_eq!(tsc_hz_from_cpuid(Some((2, 175, 0)), None), None);
        assert_eq!(tsc_hz_from_cpuid(Some((2, 175, 0)), Some(0)), None);
        // Implausible: 1 Hz crystal.
        assert_eq!(tsc_hz_from_cpuid(Some((1, 1, 1)), None), None);
    }

    #[test]
    fn cpuinfo_flags() {
        let text =
            "processor\t: 0\nflags\t\t: fpu tsc constant_tsc rdtscp nonstop_tsc\nbugs\t: x\n";
        assert!(cpuinfo_has_flags(text, &["constant_tsc", "nonstop_tsc"]));
        assert!(!cpuinfo_has_flags(text, &["constant_tsc", "rdpid"]));
        assert!(!cpuinfo_has_flags("processor : 0\n", &["tsc"]));
        // "vmx flags" must not be mistaken for "flags".
        assert!(!cpuinfo_has_flags(
            "vmx flags\t: constant_tsc\n",
            &["constant_tsc"]
        ));
    }

    #[test]
    fn fixed_point_conversion() {
        let clock = TscClock::new(2_500_000_000, TscHzSource::Calibrated);
        assert_eq!(
            scale_fixed(2_500_000_000, clock.ns_per_tick_fixed),
            999_999_999
        );
        assert_eq!(scale_fixed(1_000, clock.ticks_per_ns_fixed), 2_500);
        assert_eq!(scale_fixed(u64::MAX, u64::MAX), u64::MAX);
        let one_ghz = TscClock::new(NS_PER_S, TscHzSource::MonotonicClock);
        assert_eq!(scale_fixed(12_345, one_ghz.ns_per_tick_fixed), 12_345);
    }

    #[test]
    fn rdtsc_is_monotonic_on_one_thread() {
        // Pin so that only one core's counter is read (cross-core ordering
        // is the kernel's synchronisation check, not ours).
        crate::pin_current_thread(crate::current_cpu()).unwrap();
        let mut last = rdtsc();
        for _ in 0..100_000 {
            let now = rdtsc();
            assert!(now >= last, "TSC went backwards: {last} -> {now}");
            last = now;
        }
    }

    #[test]
    fn tsc_hz_is_sane_and_converts() {
        let hz = tsc_hz();
        assert!((TSC_SANE_MIN_HZ..=TSC_SANE_MAX_HZ).contains(&hz), "{hz} Hz");
        assert_eq!(tsc_hz(), hz, "cached");
        let ns = tsc_to_ns(hz);
        assert!((999_000_000..=1_001_000_000).contains(&ns), "{ns}");
        let ticks = ns_to_tsc(1_000_000);
        assert!(ticks.abs_diff(hz / 1000) <= hz / 1_000_000 + 1, "{ticks}");
    }
}
