//! The user-level half of a thread's move between VAS processes: a context
//! swap on x86-64.
//!
//! A context is a stack pointer. [`swap`] pushes the callee-saved registers
//! of the System V ABI (`rbp rbx r12-r15`), the SSE control/status word
//! (MXCSR) and the x87 control word onto the current stack, stores the
//! stack pointer through `save`, loads `load` as the new stack pointer and
//! pops the same frame from there. Caller-saved registers need no saving:
//! `swap` is an ordinary function call to the compiler.
//!
//! The two stacks may belong to two *processes*: the lane stack is a
//! `MAP_SHARED` mapping at the same address in every VAS process, so the
//! frame one process pushed is the frame the other pops (module essay of
//! [`crate::procvas`]). The kernel never sees a swap; what it sees is one
//! process going to sleep on a futex and another waking, and the page-table
//! load of that process switch is the VAS switch.
//!
//! ```text
//!  new context on a fresh stack (top 16-aligned):
//!   top-8   ret → ctx_start          ctx_start: mov rdi, r12 ; call rbx ; ud2
//!   top-16  rbp = 0
//!   top-24  rbx = entry fn
//!   top-32  r12 = argument
//!   top-40 .. top-56  r13 r14 r15 = 0
//!   top-72  mxcsr (0x1f80), x87 cw (0x037f)   ◀ initial stack pointer
//! ```

use std::arch::global_asm;

global_asm!(
    ".text",
    ".p2align 4",
    ".globl spacejmp_procvas_swap",
    ".type spacejmp_procvas_swap,@function",
    "spacejmp_procvas_swap:",
    "push rbp",
    "push rbx",
    "push r12",
    "push r13",
    "push r14",
    "push r15",
    "sub rsp, 16",
    "stmxcsr dword ptr [rsp]",
    "fnstcw word ptr [rsp + 4]",
    "mov qword ptr [rdi], rsp",
    "mov rsp, rsi",
    "ldmxcsr dword ptr [rsp]",
    "fldcw word ptr [rsp + 4]",
    "add rsp, 16",
    "pop r15",
    "pop r14",
    "pop r13",
    "pop r12",
    "pop rbx",
    "pop rbp",
    "ret",
    ".size spacejmp_procvas_swap, .-spacejmp_procvas_swap",
    ".p2align 4",
    ".globl spacejmp_procvas_start",
    ".type spacejmp_procvas_start,@function",
    "spacejmp_procvas_start:",
    "mov rdi, r12",
    "call rbx",
    "ud2",
    ".size spacejmp_procvas_start, .-spacejmp_procvas_start",
);

extern "C" {
    fn spacejmp_procvas_swap(save: *mut usize, load: usize);
    fn spacejmp_procvas_start();
}

/// Bytes of the initial frame [`prepare`] writes below a stack's top.
const INITIAL_FRAME_BYTES: usize = 72;
/// MXCSR after reset: all exceptions masked, round to nearest.
const MXCSR_DEFAULT: u32 = 0x1f80;
/// x87 control word after `fninit`.
const X87_CW_DEFAULT: u16 = 0x037f;

/// Write a first frame at the top of the stack `[lo, top)` so that a
/// [`swap`] to the returned stack pointer calls `entry(arg)` there.
/// `entry` must never return (it leaves by swapping away for good).
///
/// # Safety
/// `[top - INITIAL_FRAME_BYTES, top)` must be writable memory that nothing
/// else uses, and `top` must be 16-aligned.
pub(crate) unsafe fn prepare(top: usize, entry: extern "C" fn(usize) -> !, arg: usize) -> usize {
    debug_assert_eq!(top % 16, 0);
    let sp = top - INITIAL_FRAME_BYTES;
    let w = sp as *mut u64;
    // SAFETY: the caller gives us these 72 bytes below `top`; `sp` is
    // 8-aligned (top is 16-aligned), so every word write is aligned.
    unsafe {
        (w as *mut u32).write(MXCSR_DEFAULT);
        ((sp + 4) as *mut u16).write(X87_CW_DEFAULT);
        w.add(2).write(0); // r15
        w.add(3).write(0); // r14
        w.add(4).write(0); // r13
        w.add(5).write(arg as u64); // r12
        w.add(6).write(entry as *const () as usize as u64); // rbx
        w.add(7).write(0); // rbp
        w.add(8)
            .write(spacejmp_procvas_start as *const () as usize as u64); // return address
    }
    sp
}

/// Save the current context through `save` and continue in the context
/// whose stack pointer is `load`. Returns when some context swaps back to
/// the one saved here.
///
/// # Safety
/// `load` must be a stack pointer saved by `swap` (or made by [`prepare`])
/// whose stack is mapped in this process and not in use by anything else,
/// and `save` must be writable.
#[inline(never)]
pub(crate) unsafe fn swap(save: *mut usize, load: usize) {
    // SAFETY: forwarded from the caller; the assembly saves and restores
    // every register the ABI says a call preserves.
    unsafe { spacejmp_procvas_swap(save, load) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    static MAIN_SP: AtomicUsize = AtomicUsize::new(0);
    static CORO_SP: AtomicUsize = AtomicUsize::new(0);
    static TRACE: AtomicUsize = AtomicUsize::new(0);

    extern "C" fn coro(arg: usize) -> ! {
        let mut local = arg;
        for _ in 0..3 {
            local += 1;
            TRACE.store(local, Ordering::SeqCst);
            // SAFETY: MAIN_SP was saved by the swap that started us.
            unsafe { swap(CORO_SP.as_ptr(), MAIN_SP.load(Ordering::SeqCst)) };
        }
        TRACE.store(usize::MAX, Ordering::SeqCst);
        let mut dead = 0usize;
        // SAFETY: as above; this context is never resumed again.
        unsafe { swap(&mut dead, MAIN_SP.load(Ordering::SeqCst)) };
        unreachable!("a finished context was resumed")
    }

    #[test]
    fn swaps_between_two_stacks_in_one_thread() {
        let mut stack = vec![0u128; 4096];
        let top = stack.as_mut_ptr() as usize + stack.len() * 16;
        // SAFETY: `stack` is ours, 16-aligned, and outlives the coroutine.
        let sp = unsafe { prepare(top, coro, 40) };
        CORO_SP.store(sp, Ordering::SeqCst);
        let mut seen = Vec::new();
        for _ in 0..4 {
            // Keep a float in flight across the swap: the ABI's callee-saved
            // state must come back intact.
            let x = std::hint::black_box(1.5f64);
            // SAFETY: CORO_SP was made by `prepare` or saved by `swap` on
            // `stack`, which nothing else uses.
            unsafe { swap(MAIN_SP.as_ptr(), CORO_SP.load(Ordering::SeqCst)) };
            assert_eq!(x * 2.0, 3.0);
            seen.push(TRACE.load(Ordering::SeqCst));
        }
        assert_eq!(seen, vec![41, 42, 43, usize::MAX]);
    }
}
