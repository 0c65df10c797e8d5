//! examples/libbpf/percpu-counter (the loader benchmark's libbpf program: a uprobe adding one
//! to a BPF_MAP_TYPE_PERCPU_ARRAY slot, summed over CPUs at exit) on the loader tests' target,
//! through the kernel and unmodified through `userbpf load`: both count every call.

mod common;

use common::*;

/// The summed count and the per-CPU slots the program printed.
fn counts(out: &str) -> (u64, Vec<u64>) {
    let mut total = None;
    let mut cpus = Vec::new();
    for l in out.lines() {
        let w: Vec<&str> = l.split_whitespace().collect();
        match w.as_slice() {
            ["count", n] => total = Some(n.parse().unwrap()),
            ["cpu", _, n] => cpus.push(n.parse().unwrap()),
            _ => {}
        }
    }
    (total.unwrap_or_else(|| panic!("no count line in {out:?}")), cpus)
}

#[test]
fn per_cpu_array_counter_counts_every_call_as_on_the_kernel() {
    let bin = libbpf_example("percpu-counter");
    let bin = bin.to_str().unwrap();
    // tadd(t, i): 4 threads, 50 calls each.
    let probed = vec!["tadd".to_string()];
    let mut slots = None;
    for (via, order) in
        [(Via::Kernel, Order::LoaderFirst), (Via::Userbpf, Order::LoaderFirst), (Via::Userbpf, Order::TargetFirst)]
    {
        let (out, err) = run_with_target(
            "percpu_counter",
            via,
            order,
            &[bin, "{T}", "tadd"],
            "attached to ",
            &probed,
            Ending::Interrupt,
        );
        let (total, cpus) = counts(&out);
        assert_eq!(total, 200, "{via:?} {order:?}: every call of tadd counted\n{out}\n{err}");
        assert_eq!(cpus.iter().sum::<u64>(), total, "{via:?} {order:?}: the slots add up\n{out}");
        // One slot per possible CPU, as many as the kernel's.
        assert!(!cpus.is_empty(), "{via:?} {order:?}: no per-CPU slots printed\n{out}");
        assert_eq!(
            *slots.get_or_insert(cpus.len()),
            cpus.len(),
            "{via:?} {order:?}: as many slots as the kernel's\n{out}"
        );
    }
}
