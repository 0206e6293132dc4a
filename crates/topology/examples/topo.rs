//! Prints what the `topology` crate sees on this machine and how fast each
//! current-CPU method is.
//!
//! `cargo run --release -p topology --example topo`

use std::hint::black_box;
use std::time::Instant;

use topology::{
    allowed_cpus, calibrate_tsc_hz, cpu_id_method, current_cpu, current_cpu_and_node,
    current_cpu_with, format_cpu_list, rdtsc, supported_cpu_id_methods, topology, tsc_hz,
    tsc_hz_source, tsc_invariant, CpuIdMethod,
};

const TIMED_CALLS: u32 = 1_000_000;
const WARMUP_CALLS: u32 = 10_000;

/// Mean nanoseconds per call of `f` over `TIMED_CALLS` calls.
fn ns_per_call(mut f: impl FnMut() -> usize) -> f64 {
    for _ in 0..WARMUP_CALLS {
        black_box(f());
    }
    let start = Instant::now();
    for _ in 0..TIMED_CALLS {
        black_box(f());
    }
    start.elapsed().as_nanos() as f64 / f64::from(TIMED_CALLS)
}

fn main() {
    let t = topology();
    println!(
        "CPUs: {} online ({}), max id {}, allowed for this thread: {}",
        t.num_cpus(),
        format_cpu_list(t.cpus()),
        t.max_cpu_id(),
        format_cpu_list(&allowed_cpus())
    );
    println!("NUMA nodes: {}", t.num_nodes());
    for (index, node) in t.nodes().iter().enumerate() {
        println!(
            "  node index {index} (id {}): {} CPUs [{}]",
            node.id,
            node.cpus.len(),
            format_cpu_list(&node.cpus)
        );
    }

    let supported = supported_cpu_id_methods();
    let names: Vec<&str> = supported.iter().map(|m| m.name()).collect();
    println!(
        "CPU-id method: {} (supported: {})",
        cpu_id_method(),
        names.join(", ")
    );
    let (cpu, node) = current_cpu_and_node();
    println!("running on CPU {cpu}, node id {node}");

    println!("cost per call ({TIMED_CALLS} calls each):");
    for method in CpuIdMethod::ALL {
        if method.is_supported() {
            let ns = ns_per_call(|| current_cpu_with(method));
            println!("  current_cpu_with({:<12}) {ns:7.2} ns", method.name());
        } else {
            println!("  current_cpu_with({:<12}) unsupported", method.name());
        }
    }
    println!(
        "  current_cpu()                  {:7.2} ns",
        ns_per_call(current_cpu)
    );
    println!(
        "  current_cpu_and_node()         {:7.2} ns",
        ns_per_call(|| current_cpu_and_node().0)
    );
    println!(
        "  rdtsc()                        {:7.2} ns",
        ns_per_call(|| rdtsc() as usize)
    );

    println!("invariant TSC: {}", tsc_invariant());
    let hz = tsc_hz();
    println!(
        "TSC: {hz} Hz ({:.3} GHz) from {:?}",
        hz as f64 / 1e9,
        tsc_hz_source()
    );
    let recalibrated = calibrate_tsc_hz();
    println!(
        "TSC re-calibrated against CLOCK_MONOTONIC: {recalibrated} Hz ({:+.1} ppm vs tsc_hz)",
        (recalibrated as f64 - hz as f64) / hz as f64 * 1e6
    );
}
