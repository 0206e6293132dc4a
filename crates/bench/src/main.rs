//! `memlab` with the system allocator (glibc malloc). All code is in the
//! library; see `bench::main_entry`.

#![deny(clippy::undocumented_unsafe_blocks)]

fn main() -> std::process::ExitCode {
    bench::main_entry(bench::Alloc::Glibc)
}
