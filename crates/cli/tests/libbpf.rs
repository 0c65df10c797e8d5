//! The repository's own libbpf program with a skeleton (examples/libbpf/userbpf-demo: a
//! uprobe writing to a ring buffer, a uretprobe writing to a perf buffer, .bss counters read
//! through the map's mmap, a .rodata filter set before loading), run unmodified through the
//! kernel and through `userbpf load`, its target under `userbpf start` in either order: the
//! events and counters printed must be the same, also when the loader and the target run as an
//! ordinary user.

mod common;

use common::*;

fn compare(test: &str, extra: &[&str], orders: &[Order], expect: &[&str]) {
    compare_via(test, extra, Via::Userbpf, orders, expect)
}

fn compare_via(test: &str, extra: &[&str], via: Via, orders: &[Order], expect: &[&str]) {
    let demo = libbpf_demo();
    let mut argv = vec![demo.to_str().unwrap(), "{T}", "greet"];
    argv.extend_from_slice(extra);
    let probed = vec!["greet".to_string()];
    let (kout, kerr) =
        run_with_target(test, Via::Kernel, Order::LoaderFirst, &argv, "attached to ", &probed, Ending::Interrupt);
    for e in expect {
        assert!(kout.contains(e), "the kernel's output lacks {e:?}\n{kout}\n{kerr}");
    }
    // The path of the target differs between runs (each has a copy of its own).
    let norm =
        |s: &str| sorted_lines(&s.lines().filter(|l| !l.starts_with("attached to ")).collect::<Vec<_>>().join("\n"));
    let kn = norm(&kout);
    for &order in orders {
        let (uout, uerr) = run_with_target(test, via, order, &argv, "attached to ", &probed, Ending::Interrupt);
        assert!(uout.contains("attached to "), "{uout}\n{uerr}");
        assert_same_output(&format!("{test} ({order:?})"), &kn, &norm(&uout), &kout, &uout, &uerr);
    }
}

#[test]
fn skeleton_ringbuf_and_perf_buffer() {
    // greet("item-<7i>", i, 0xa0 + i, ...) for i < 8, returning strlen(name) + i + 0xa0 + i + 5.
    compare(
        "demo",
        &[],
        &[Order::LoaderFirst, Order::TargetFirst],
        &[
            "call seq=0 comm=bt_target name=item-0 n=0 x=0xa0\n",
            "call seq=7 comm=bt_target name=item-49 n=7 x=0xa7\n",
            "return seq=7 ret=",
            "calls=8 returns=8 dropped=0 ring_events=8 perf_events=8 perf_lost=0\n",
        ],
    );
}

#[test]
fn skeleton_rodata_set_before_loading() {
    compare(
        "demo_min_n",
        &["5"],
        &[Order::LoaderFirst],
        &[
            "call seq=0 comm=bt_target name=item-35 n=5 x=0xa5\n",
            "calls=3 returns=3 dropped=0 ring_events=3 perf_events=3 perf_lost=0\n",
        ],
    );
}

#[test]
fn skeleton_as_an_ordinary_user() {
    // No kernel eBPF is involved: the loader and its target run as nobody (uid 65534), the
    // kernel's run as root for reference.
    compare_via(
        "demo_nobody",
        &[],
        Via::UserbpfAs(65534),
        &[Order::LoaderFirst],
        &["calls=8 returns=8 dropped=0 ring_events=8 perf_events=8 perf_lost=0\n"],
    );
}
