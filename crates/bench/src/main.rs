//! `memlab` with the system allocator (glibc malloc). All code is in the
//! library; see `bench::main_entry`.

fn main() -> std::process::ExitCode {
    bench::main_entry(bench::Alloc::Glibc)
}
