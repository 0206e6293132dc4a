//! `memlab-mimalloc`: memlab with mimalloc as the global allocator. The
//! parent `memlab` runs the `*-mimalloc` baselines in this binary (a process
//! has one global allocator); it also works as a memlab of its own.

#![deny(clippy::undocumented_unsafe_blocks)]

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    bench::main_entry(bench::Alloc::Mimalloc)
}
