//! `memlab-jemalloc`: memlab with jemalloc as the global allocator. The
//! parent `memlab` runs the `*-jemalloc` baselines in this binary (a process
//! has one global allocator); it also works as a memlab of its own.

#![deny(clippy::undocumented_unsafe_blocks)]

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    bench::main_entry(bench::Alloc::Jemalloc)
}
