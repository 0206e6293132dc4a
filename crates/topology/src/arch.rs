//! The raw x86-64 instructions this crate uses: CPUID, RDTSC, RDTSCP, RDPID.
//!
//! Everything here is a thin wrapper; feature detection policy lives in the
//! callers. Only compiled on `x86_64`.

use core::arch::asm;

/// The four output registers of one CPUID query.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cpuid {
    pub eax: u32,
    pub ebx: u32,
    pub ecx: u32,
    pub edx: u32,
}

/// Executes CPUID for `leaf`/`subleaf`.
///
/// Written with `asm!` rather than `core::arch::x86_64::__cpuid_count`
/// because that intrinsic is `unsafe` on older toolchains (our MSRV) and
/// safe on newer ones, which no single spelling satisfies without lints.
#[inline]
pub(crate) fn cpuid(leaf: u32, subleaf: u32) -> Cpuid {
    let (eax, ebx, ecx, edx): (u32, u32, u32, u32);
    // SAFETY: CPUID is present on every x86-64 processor, touches no memory
    // and writes only eax/ebx/ecx/edx. LLVM reserves rbx, so it is saved in
    // a scratch register and swapped back, leaving CPUID's ebx in the scratch.
    unsafe {
        asm!(
            "mov {saved:r}, rbx",
            "cpuid",
            "xchg {saved:r}, rbx",
            saved = out(reg) ebx,
            inout("eax") leaf => eax,
            inout("ecx") subleaf => ecx,
            out("edx") edx,
            options(nostack, preserves_flags),
        );
    }
    Cpuid { eax, ebx, ecx, edx }
}

/// Highest standard CPUID leaf.
pub(crate) fn max_basic_leaf() -> u32 {
    cpuid(0, 0).eax
}

/// Highest extended (0x8000_xxxx) CPUID leaf.
pub(crate) fn max_extended_leaf() -> u32 {
    cpuid(0x8000_0000, 0).eax
}

/// Queries a leaf only if the processor implements it (Intel returns the
/// highest basic leaf's data for out-of-range leaves, which would be
/// misread as feature bits).
pub(crate) fn cpuid_if_present(leaf: u32) -> Option<Cpuid> {
    let max = if leaf >= 0x8000_0000 {
        max_extended_leaf()
    } else {
        max_basic_leaf()
    };
    (max >= leaf).then(|| cpuid(leaf, 0))
}

/// CPUID.(EAX=7,ECX=0):ECX bit 22.
pub(crate) fn has_rdpid() -> bool {
    (max_basic_leaf() >= 7) && cpuid(7, 0).ecx & (1 << 22) != 0
}

/// CPUID.80000001h:EDX bit 27.
pub(crate) fn has_rdtscp() -> bool {
    cpuid_if_present(0x8000_0001).is_some_and(|r| r.edx & (1 << 27) != 0)
}

/// CPUID.80000007h:EDX bit 8 ("TscInvariant").
pub(crate) fn has_invariant_tsc() -> bool {
    cpuid_if_present(0x8000_0007).is_some_and(|r| r.edx & (1 << 8) != 0)
}

/// Reads the time-stamp counter.
#[inline(always)]
pub(crate) fn rdtsc() -> u64 {
    // SAFETY: RDTSC is part of the x86-64 baseline and touches no memory.
    // (If the kernel set CR4.TSD via prctl(PR_SET_TSC) the instruction
    // raises SIGSEGV, which is a crash, not undefined behaviour.)
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// Reads the time-stamp counter and IA32_TSC_AUX.
///
/// # Safety
/// CPUID must have reported RDTSCP (CPUID.80000001h:EDX bit 27); otherwise
/// the instruction raises #UD.
#[inline(always)]
pub(crate) unsafe fn rdtscp() -> (u64, u32) {
    let mut aux = 0u32;
    // SAFETY: the caller guarantees RDTSCP support; `aux` is a valid, writable
    // u32 for the intrinsic to store IA32_TSC_AUX into.
    let tsc = unsafe { core::arch::x86_64::__rdtscp(&mut aux) };
    (tsc, aux)
}

/// Reads IA32_TSC_AUX with RDPID.
///
/// # Safety
/// CPUID must have reported RDPID (CPUID.(EAX=7,ECX=0):ECX bit 22);
/// otherwise the instruction raises #UD.
#[inline(always)]
pub(crate) unsafe fn rdpid() -> u32 {
    let aux: u64;
    // SAFETY: the caller guarantees RDPID support; the instruction only
    // writes the named register and neither reads memory nor touches flags.
    unsafe {
        asm!("rdpid {}", out(reg) aux, options(nomem, nostack, preserves_flags));
    }
    // IA32_TSC_AUX is a 32-bit MSR; RDPID zero-extends it.
    aux as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpuid_wrapper_matches_std_detection() {
        let vendor: Vec<u8> = {
            let r = cpuid(0, 0);
            [r.ebx, r.edx, r.ecx]
                .iter()
                .flat_map(|w| w.to_le_bytes())
                .collect()
        };
        assert!(
            vendor.iter().all(|b| b.is_ascii_graphic() || *b == b' '),
            "vendor {vendor:?}"
        );
        let leaf1 = cpuid(1, 0);
        assert_ne!(leaf1.edx & (1 << 4), 0, "CPUID.1:EDX.TSC must be set");
        assert_eq!(
            leaf1.ecx & (1 << 20) != 0,
            std::is_x86_feature_detected!("sse4.2")
        );
        assert_eq!(
            leaf1.ecx & (1 << 30) != 0,
            std::is_x86_feature_detected!("rdrand")
        );
        assert!(max_extended_leaf() >= 0x8000_0000);
    }
}
