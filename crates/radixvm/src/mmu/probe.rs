//! One-instruction user-access probes with a fault fixup, shared by the
//! MMU backends that run over real page tables ([`super::uffd`],
//! [`crate::percore`]).
//!
//! Each probe's only memory access is its first instruction. The SIGBUS
//! and SIGSEGV handlers installed by [`install_handlers`] check whether
//! the faulting instruction is a probe and, if so, move the instruction
//! pointer to a fixup that returns "fault" (the kernel's exception-table
//! technique, as `copy_from_user` does). Any other fault goes to the
//! handler that was there before, or to the default action. The handler
//! runs on the alternate signal stack with every signal blocked, so no
//! other handler nests on that small stack.

use std::io;
use std::sync::{Once, OnceLock};

#[cfg(target_arch = "x86_64")]
use super::Op;

/// Performs `op` at `p`; `None` if it faulted.
///
/// # Safety
/// `p` is inside a mapping that stays mapped (possibly `PROT_NONE`) for
/// the call, and [`install_handlers`] has run in this process.
#[cfg(target_arch = "x86_64")]
pub unsafe fn perform(p: *mut u8, op: Op) -> Option<u8> {
    // SAFETY: the caller's contract is `asm::perform`'s.
    unsafe { asm::perform(p, op) }
}

#[cfg(target_arch = "x86_64")]
mod asm {
    use crate::mmu::Op;
    use crate::Access;

    // Each probe's first instruction is its only memory access, so a
    // fault in a probe has the probe's own address as its instruction
    // pointer, and the stack holds just the return address: the fixup
    // returns u64::MAX to the caller.
    std::arch::global_asm!(
        ".pushsection .text.radixvm_uffd_probes,\"ax\",@progbits",
        ".p2align 4",
        ".globl radixvm_uffd_load",
        ".hidden radixvm_uffd_load",
        "radixvm_uffd_load:",
        "    movzx eax, byte ptr [rdi]",
        "    ret",
        ".p2align 4",
        ".globl radixvm_uffd_store",
        ".hidden radixvm_uffd_store",
        "radixvm_uffd_store:",
        "    mov byte ptr [rdi], sil",
        "    xor eax, eax",
        "    ret",
        ".p2align 4",
        ".globl radixvm_uffd_or",
        ".hidden radixvm_uffd_or",
        "radixvm_uffd_or:",
        "    lock or byte ptr [rdi], sil",
        "    xor eax, eax",
        "    ret",
        ".p2align 4",
        ".globl radixvm_uffd_fixup",
        ".hidden radixvm_uffd_fixup",
        "radixvm_uffd_fixup:",
        "    mov rax, -1",
        "    ret",
        ".popsection",
    );

    extern "C" {
        fn radixvm_uffd_load(p: *const u8) -> u64;
        fn radixvm_uffd_store(p: *mut u8, v: u64) -> u64;
        fn radixvm_uffd_or(p: *mut u8, v: u64) -> u64;
        fn radixvm_uffd_fixup();
    }

    /// Where execution resumes after a fault at `rip`, if `rip` is a
    /// probe.
    pub fn fixup_for(rip: usize) -> Option<usize> {
        let probes = [
            radixvm_uffd_load as unsafe extern "C" fn(*const u8) -> u64 as usize,
            radixvm_uffd_store as unsafe extern "C" fn(*mut u8, u64) -> u64 as usize,
            radixvm_uffd_or as unsafe extern "C" fn(*mut u8, u64) -> u64 as usize,
        ];
        probes
            .contains(&rip)
            .then_some(radixvm_uffd_fixup as unsafe extern "C" fn() as usize)
    }

    /// Performs `op` at `p`; `None` if it faulted.
    ///
    /// # Safety
    /// `p` is inside a mapping that stays mapped for the call, and the
    /// fault handler ([`super::install_handlers`]) is installed in this
    /// process.
    pub unsafe fn perform(p: *mut u8, op: Op) -> Option<u8> {
        // SAFETY: per the contract; a fault in the probe returns u64::MAX
        // through the fixup instead of killing the thread.
        let r = unsafe {
            match op {
                Op::Load | Op::Touch(Access::Read) => radixvm_uffd_load(p),
                Op::Store(v) => radixvm_uffd_store(p, v as u64),
                Op::Touch(Access::Write) => radixvm_uffd_or(p, 0),
            }
        };
        (r != u64::MAX).then_some(r as u8)
    }
}

/// The handlers that were installed before ours, per signal.
static OLD_SIGBUS: OnceLock<libc::sigaction> = OnceLock::new();
static OLD_SIGSEGV: OnceLock<libc::sigaction> = OnceLock::new();
static HANDLERS: Once = Once::new();

#[cfg(target_arch = "x86_64")]
extern "C" fn on_fault(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid ucontext_t to an SA_SIGINFO
    // handler; we read and write the saved instruction pointer only.
    let rip =
        unsafe { &mut (*ctx.cast::<libc::ucontext_t>()).uc_mcontext.gregs[libc::REG_RIP as usize] };
    if let Some(fixup) = asm::fixup_for(*rip as usize) {
        *rip = fixup as i64;
        return;
    }
    // Not ours: hand it to whoever was there before (Rust's stack-overflow
    // handler, or the default action).
    let old = if sig == libc::SIGBUS {
        OLD_SIGBUS.get()
    } else {
        OLD_SIGSEGV.get()
    };
    match old {
        Some(old)
            if old.sa_sigaction != libc::SIG_DFL
                && old.sa_sigaction != libc::SIG_IGN
                && old.sa_flags & libc::SA_SIGINFO != 0 =>
        {
            // SAFETY: an SA_SIGINFO handler has this signature.
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                unsafe { std::mem::transmute(old.sa_sigaction) };
            f(sig, info, ctx);
        }
        Some(old) if old.sa_sigaction != libc::SIG_DFL && old.sa_sigaction != libc::SIG_IGN => {
            // SAFETY: a plain handler has this signature.
            let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(old.sa_sigaction) };
            f(sig);
        }
        _ => {
            // Default action: restore it and return; the instruction
            // faults again and the process dies as it would have.
            // SAFETY: sigaction and sigemptyset are async-signal-safe; the
            // struct is fully initialized.
            unsafe {
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigemptyset(&mut dfl.sa_mask);
                libc::sigaction(sig, &dfl, std::ptr::null_mut());
            }
        }
    }
}

/// Installs the SIGBUS and SIGSEGV handlers once per process.
#[cfg(target_arch = "x86_64")]
pub fn install_handlers() -> io::Result<()> {
    let mut result = Ok(());
    HANDLERS.call_once(|| {
        for (sig, slot) in [(libc::SIGBUS, &OLD_SIGBUS), (libc::SIGSEGV, &OLD_SIGSEGV)] {
            // SAFETY: sigaction with a fully initialized struct; `old`
            // receives the previous action.
            let rc = unsafe {
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = on_fault
                    as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void)
                    as usize;
                action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
                // Nothing nests on the alternate stack: a signal taken
                // inside this handler (the per-core backend's IPI) would
                // push a second frame there, and two frames with AVX-512
                // state (~3.5 KiB each) overflow a small alternate stack,
                // which the kernel answers with a fatal SIGSEGV. Blocked,
                // it arrives when the handler returns.
                libc::sigfillset(&mut action.sa_mask);
                let mut old: libc::sigaction = std::mem::zeroed();
                let rc = libc::sigaction(sig, &action, &mut old);
                if rc == 0 {
                    let _ = slot.set(old);
                }
                rc
            };
            if rc != 0 {
                result = Err(io::Error::last_os_error());
            }
        }
    });
    result
}
