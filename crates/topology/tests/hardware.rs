//! Checks against the real machine: pinning, current-CPU methods, topology.

use topology::{
    allowed_cpus, cpu_id_method, current_cpu, current_cpu_and_node, current_cpu_with, online_cpus,
    pin_current_thread, supported_cpu_id_methods, topology, CpuIdMethod,
};

fn kernel_cpu() -> usize {
    // SAFETY: sched_getcpu has no preconditions.
    let cpu = unsafe { libc::sched_getcpu() };
    usize::try_from(cpu).expect("sched_getcpu failed")
}

#[test]
fn every_method_agrees_with_kernel_on_every_allowed_cpu() {
    let allowed = allowed_cpus();
    assert!(!allowed.is_empty());
    let methods = supported_cpu_id_methods();
    // On a machine that advertises RDPID, the test must exercise it.
    std::thread::spawn(move || {
        for &cpu in &allowed {
            pin_current_thread(cpu).unwrap_or_else(|e| panic!("pin to {cpu}: {e}"));
            assert_eq!(allowed_cpus(), vec![cpu]);
            assert_eq!(kernel_cpu(), cpu, "kernel disagrees right after pinning");
            for &method in &methods {
                assert_eq!(current_cpu_with(method), cpu, "{method} on cpu {cpu}");
            }
            assert_eq!(current_cpu(), cpu);
            let (c, node_id) = current_cpu_and_node();
            assert_eq!(c, cpu);
            let t = topology();
            assert_eq!(
                t.node_index_of_id(node_id),
                Some(t.node_of_cpu(cpu)),
                "node of cpu {cpu}"
            );
        }
    })
    .join()
    .unwrap();
}

#[test]
fn method_choice_is_the_fastest_supported() {
    let methods = supported_cpu_id_methods();
    assert_eq!(methods.first(), Some(&cpu_id_method()));
    assert_eq!(methods.last(), Some(&CpuIdMethod::Sched));
    #[cfg(target_arch = "x86_64")]
    if std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .split_ascii_whitespace()
        .any(|flag| flag == "rdpid")
    {
        assert_eq!(cpu_id_method(), CpuIdMethod::Rdpid);
    }
}

#[test]
fn unsupported_method_panics_instead_of_faulting() {
    if let Some(&method) = CpuIdMethod::ALL.iter().find(|m| !m.is_supported()) {
        assert!(std::panic::catch_unwind(|| current_cpu_with(method)).is_err());
    }
}

#[test]
fn pinning_rejects_offline_cpu_with_clear_error() {
    let beyond = online_cpus().last().unwrap() + 1;
    let err = std::thread::spawn(move || pin_current_thread(beyond))
        .join()
        .unwrap()
        .unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    assert!(err.to_string().contains("not online"), "{err}");
}

#[test]
fn repinning_after_pinning_works() {
    let allowed = allowed_cpus();
    std::thread::spawn(move || {
        for &cpu in allowed.iter().rev().chain(allowed.iter()) {
            pin_current_thread(cpu).unwrap();
            assert_eq!(current_cpu(), cpu);
        }
    })
    .join()
    .unwrap();
}
