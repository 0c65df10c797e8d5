//! bpftrace one-liners on a test program, each run once through the kernel (plain `bpftrace`)
//! and once unmodified through `userbpf load bpftrace` with the target under `userbpf start`
//! (in either order, and with `bpftrace -c`): the outputs must be the same, up to the order of
//! entries bpftrace itself does not order (map entries of equal value, printf lines from
//! different CPUs' rings).
//!
//! The target (targets/loaders/bt_target.c) makes the same calls in every run; the kernel's
//! output is also checked against values known from the target, so that two empty or broken
//! outputs cannot pass.

mod common;

use common::*;

/// Runs `script` ("{T}" = the target's path) through the kernel and through userbpf in each of
/// `orders`; `expect` must appear in the kernel's output.
fn compare(test: &str, script: &str, ending: Ending, orders: &[Order], expect: &[&str]) {
    compare_marked(test, script, "Attaching ", ending, orders, expect)
}

/// [`compare`], the target let go once the loader printed `marker` (bpftrace prints
/// "Attaching N probes" before it attaches them; a `BEGIN` probe's line comes once every probe
/// is attached, through userbpf once every agent has taken them).
fn compare_marked(test: &str, script: &str, marker: &str, ending: Ending, orders: &[Order], expect: &[&str]) {
    let probed = probed_functions(script);
    // The kernel's run is the reference; on a loaded machine it has once lost the hits of one
    // probe (ustack, 1 run in 10), so a reference that lacks what the target certainly did is
    // taken again before the test gives up.
    let mut attempt = 0;
    let kout = loop {
        attempt += 1;
        let (kout, kerr) = run_with_target(
            test,
            Via::Kernel,
            Order::LoaderFirst,
            &["bpftrace", "-e", script],
            marker,
            &probed,
            ending,
        );
        match expect.iter().find(|e| !kout.contains(*e)) {
            None => break kout,
            Some(e) if attempt == 3 => {
                panic!("the kernel's output lacks {e:?} (is the test target right?)\n{kout}\n{kerr}")
            }
            Some(e) => eprintln!("{test}: the kernel's output lacks {e:?}; running it again\n{kout}"),
        }
    };
    let kn = normalise_bpftrace(&kout);
    for &order in orders {
        // Known intermittent failure: about one run of this file in ten on a loaded 2-core
        // machine, bpftrace prints a map empty or a stack blank because it finds the map's
        // descriptor closed when it prints (EBADF from the lookup; seen with ustack, once with
        // printf). The kernel's own run shows the same (an outer_b stack printed as `@[]` and
        // `@i` missing), so it is not userbpf's; the reference run above is retried for it too.
        // A run that differs is shown and taken once more; two in a row fail the test.
        let mut attempt = 0;
        loop {
            attempt += 1;
            let (uout, uerr) =
                run_with_target(test, Via::Userbpf, order, &["bpftrace", "-e", script], marker, &probed, ending);
            let un = normalise_bpftrace(&uout);
            if un == kn || attempt == 2 {
                assert_same_output(&format!("{test} ({order:?})"), &kn, &un, &kout, &uout, &uerr);
                break;
            }
            eprintln!(
                "{test} ({order:?}): userbpf's output differs from the kernel's; running it again\n=== userbpf ===\n{uout}\n=== userbpf stderr ===\n{uerr}"
            );
        }
    }
}

const BOTH: &[Order] = &[Order::LoaderFirst, Order::TargetFirst];
const LOADER_FIRST: &[Order] = &[Order::LoaderFirst];

#[test]
fn count_sum_avg_min_max_stats() {
    // tadd(t, i): 4 threads, t = 0..3, i = 0..49.
    compare(
        "aggregations",
        "uprobe:{T}:tadd { @c = count(); @s = sum(arg1); @a = avg(arg1); @mn = min(arg1); @mx = max(arg1); @st = stats(arg0); @per[arg0] = count(); }",
        Ending::Interrupt,
        BOTH,
        &[
            "@c: 200\n",
            "@s: 4900\n",
            "@a: 24\n",
            "@mn: 0\n",
            "@mx: 49\n",
            "@st: count 200, average 1, total 300\n",
            "@per[3]: 50\n",
        ],
    );
}

/// Several programs on one function run in the kernel's order: the consumers of one uprobe
/// from the last attached (bpftrace attaches these in the reverse of the script's order), at
/// the entry and at the return; each appends its digit to a number they share. The target
/// goes once `BEGIN` has printed: the first probe's patch alone (what the harness checks)
/// does not say that the other three are in.
#[test]
fn programs_on_one_function_run_in_the_kernels_order() {
    // greet(...) 8 times: 16 digits at the entry and at the return.
    compare_marked(
        "order",
        "BEGIN { printf(\"all attached\\n\"); } \
         uprobe:{T}:greet { @e = @e * 10 + 1; } uprobe:{T}:greet { @e = @e * 10 + 2; } \
         uretprobe:{T}:greet { @r = @r * 10 + 3; } uretprobe:{T}:greet { @r = @r * 10 + 4; }",
        "all attached",
        Ending::Interrupt,
        BOTH,
        &["@e: 1212121212121212\n", "@r: 3434343434343434\n"],
    );
}

#[test]
fn curtask_is_the_threads_task_with_its_leader_and_parent() {
    // tadd(t, i) runs on 4 threads: `curtask` (bpf_get_current_task) is each thread's, read
    // through bpf_probe_read_kernel at the kernel's offsets (bpftrace takes them from the
    // kernel's BTF): its pid and name, its main thread as group_leader, a parent process.
    compare(
        "curtask",
        "uprobe:{T}:tadd { @[curtask->comm, curtask->group_leader->comm, curtask->pid == tid, curtask->tgid == pid, \
         curtask->pid != pid, curtask->group_leader->pid == pid, curtask->real_parent->tgid > 1] = count(); }",
        Ending::Interrupt,
        BOTH,
        &["@[bt_target, bt_target, 1, 1, 1, 1, 1]: 200\n"],
    );
}

#[test]
fn hist_and_lhist() {
    // add(i, 2i) for i < 20, then add(100 + i, i) for i < 10.
    compare(
        "hist",
        "uprobe:{T}:add { @h = hist(arg0); @l = lhist(arg1, 0, 40, 5); @hk[arg0 / 100] = hist(arg1); }",
        Ending::Interrupt,
        LOADER_FIRST,
        &["@h: \n", "[64, 128)             10 |", "@l: \n", "[35, 40)               2 |", "@hk[1]: \n"],
    );
}

#[test]
fn printf_with_arguments_and_str() {
    // greet("item-<7i>", i, 0xa0 + i, "t<i%3>xyz") for i < 8.
    compare(
        "printf",
        r#"uprobe:{T}:greet { printf("%s|%d|%x|%s|%s|%5d|%-4s|\n", str(arg0), arg1, arg2, str(arg3), str(arg3, 3), arg1 * 3, str(arg3, 2)); }"#,
        Ending::Interrupt,
        BOTH,
        &["item-0|0|a0|t0xyz|t0x|    0|t0  |\n", "item-49|7|a7|t1xyz|t1x|   21|t1  |\n"],
    );
}

#[test]
fn arg0_to_arg5_and_maps_keyed_by_several_values() {
    // six(i % 3, i % 2, 7, -1, 0x1234, i) for i < 12.
    compare(
        "args",
        r#"uprobe:{T}:six { @[arg0, arg1, arg5 % 4] = count(); @s[arg2, arg4, comm] = sum(arg5); @neg[(int64)arg3] = count(); printf("%d %d %d %d %d %d\n", arg0, arg1, arg2, (int64)arg3, arg4, arg5); }"#,
        Ending::Interrupt,
        LOADER_FIRST,
        &["@[2, 1, 1]: 1\n", "@s[7, 4660, bt_target]: 66\n", "@neg[-1]: 12\n", "2 1 7 -1 4660 5\n"],
    );
}

#[test]
fn ustack() {
    // leaf() under outer_a -> middle -> inner (3 times) and outer_b -> inner (5 times). At a
    // uprobe on a function's first instruction the kernel's frame-pointer walk skips the
    // direct caller (its frame is not set up yet): userbpf must show the same frames.
    compare(
        "ustack",
        "uprobe:{T}:leaf { @[ustack(4)] = count(); } uprobe:{T}:inner { @i[ustack(2), arg0] = count(); }",
        Ending::Interrupt,
        BOTH,
        &["    leaf+0\n    outer_b+", "]: 5\n", "    inner+0\n    middle+", "\n, 1]: 3\n"],
    );
}

#[test]
fn uretprobe_latency_with_a_per_thread_map_and_retval() {
    // nap(12), nap(24), nap(48) in each of 4 threads at once: only a map keyed by tid pairs
    // each return with its own entry. Latencies go into one wide bucket (timing is not compared).
    compare(
        "latency",
        "uprobe:{T}:nap { @start[tid] = nsecs; } uretprobe:{T}:nap /@start[tid]/ { $ms = (nsecs - @start[tid]) / 1000000; @lat = lhist($ms, 0, 1000, 500); @ok = count(); @short[$ms < 12] = count(); @ret[retval] = count(); @rh = hist(retval); delete(@start[tid]); } uretprobe:{T}:tadd { @tr[retval / 1000] = sum(retval % 1000); }",
        Ending::Interrupt,
        LOADER_FIRST,
        &["@ok: 12\n", "@ret[48]: 4\n", "@short[0]: 12\n", "[0, 500)              12 |", "@tr[2]: 1225\n"],
    );
}

#[test]
fn interval_begin_end_and_exit() {
    // add() is called 30 times by one thread; the interval probe sees the final count.
    compare(
        "interval",
        r#"BEGIN { printf("begin\n"); } uprobe:{T}:add { @calls = @calls + 1; } interval:ms:100 /@calls == 30/ { printf("calls %d\n", @calls); print(@calls); exit(); } END { printf("end\n"); }"#,
        Ending::ItSelf,
        LOADER_FIRST,
        &["begin\n", "calls 30\n", "@calls: 30\n", "end\n"],
    );
}

#[test]
fn clear_delete_and_print() {
    // add(i, 2i) for i < 20, mark(1), add(100 + i, i) for i < 10, mark(2), then the threads.
    // print() and clear() are carried out by bpftrace's reader, later than the probe that asks
    // for them: they come at mark(2), after which no probe changes @a.
    compare(
        "clear",
        "uprobe:{T}:add { @a[arg0 % 3] = count(); @b[arg0] = arg1; } uprobe:{T}:mark /arg0 == 1/ { delete(@b[5]); delete(@b[7]); } uprobe:{T}:mark /arg0 == 2/ { print(@a); clear(@a); delete(@b[0]); } uprobe:{T}:tadd { @t = count(); }",
        Ending::Interrupt,
        LOADER_FIRST,
        &["@a[0]: 10\n", "@a[1]: 11\n", "@b[19]: 38\n", "@b[109]: 9\n", "@t: 200\n"],
    );
}

/// `bpftrace -e SCRIPT -c CMD` through the kernel, then through `userbpf load` (`run(via)`
/// gives each side's script and command): `expect` in the kernel's output, and the same
/// output from both.
fn compare_dash_c(test: &str, run: impl Fn(Via) -> (String, String), expect: &[String]) {
    let mut outs = Vec::new();
    for via in [Via::Kernel, Via::Userbpf] {
        let (script, cmd) = run(via);
        let session = session_name(test, via, Order::LoaderFirst);
        let mut p = Proc::spawn("bpftrace -c", loader_command(via, &session, &["bpftrace", "-e", &script, "-c", &cmd]));
        let st = p.wait_exit("when its command exits");
        assert!(st.success(), "bpftrace -c ({via:?}) failed: {st:?}\n{}\n{}", p.stdout(), p.stderr());
        remove_session(&session);
        outs.push((p.stdout(), p.stderr()));
    }
    let (k, u) = (&outs[0], &outs[1]);
    for e in expect {
        assert!(k.0.contains(e.as_str()), "kernel output lacks {e:?}\n{}", k.0);
    }
    assert_same_output(test, &normalise_bpftrace(&k.0), &normalise_bpftrace(&u.0), &k.0, &u.0, &u.1);
}

#[test]
fn bpftrace_dash_c_starts_the_target() {
    let test = "dash_c";
    let run = |via: Via| {
        let dir = tmp().join("loaders").join(test).join(format!("{via:?}").to_lowercase());
        let target = private_copy(&bt_target(), &dir);
        let t = target.to_str().unwrap();
        let script =
            format!("uprobe:{t}:add {{ @c = count(); @h = hist(arg0); }} uprobe:{t}:tadd {{ @t[arg0] = sum(arg1); }}");
        (script, format!("{t} --now"))
    };
    compare_dash_c(test, run, &["target: sum ".into(), "@c: 30\n".into(), "@t[0]: 1225\n".into()]);
}

/// `bpftrace -c` with the return of execve: the command's image (started by bpftrace, the
/// syscall server's library acting as its agent) and the one it execs each report it once,
/// under their names, as on the kernel.
#[test]
fn bpftrace_dash_c_sees_each_execs_return_once() {
    let test = "dash_c_exec";
    let dir = tmp().join("loaders").join(test);
    std::fs::create_dir_all(&dir).unwrap();
    // Copies of sh and true with names of this run's own: the kernel's tracepoint sees every
    // process of the machine.
    let n = std::process::id() % 100_000;
    let (sh, tr) = (dir.join(format!("sh{n}")), dir.join(format!("tr{n}")));
    std::fs::copy("/bin/sh", &sh).unwrap();
    std::fs::copy("/bin/true", &tr).unwrap();
    let script_file = dir.join("exec.sh");
    std::fs::write(&script_file, format!("exec {}\n", tr.display())).unwrap();
    let run = |_| {
        let script = format!(
            "tracepoint:syscalls:sys_exit_execve /comm == \"sh{n}\" || comm == \"tr{n}\"/ {{ @[comm, args->ret] = count(); }}"
        );
        (script, format!("{} {}", sh.display(), script_file.display()))
    };
    compare_dash_c(test, run, &[format!("@[sh{n}, 0]: 1\n"), format!("@[tr{n}, 0]: 1\n")]);
}

#[test]
fn normalising_keeps_values_and_orders_only_ties() {
    let a = "Attaching 1 probe...\nx 2\nx 1\n\n@[\n    a+1\n]: 3\n@[\n    b+1\n]: 3\n@h: \n[0]  1 |@|\n\n@m[2]: 1\n@m[1]: 1\n";
    let b = "Attaching 1 probe...\nx 1\nx 2\n\n@[\n    b+1\n]: 3\n@[\n    a+1\n]: 3\n@h: \n[0]  1 |@|\n\n@m[1]: 1\n@m[2]: 1\n";
    assert_eq!(normalise_bpftrace(a), normalise_bpftrace(b));
    let c = b.replace("@m[2]: 1", "@m[2]: 2");
    assert_ne!(normalise_bpftrace(a), normalise_bpftrace(&c));
    let d = b.replace("[0]  1", "[0]  2");
    assert_ne!(normalise_bpftrace(a), normalise_bpftrace(&d));
    let e = b.replace("    a+1", "    a+2");
    assert_ne!(normalise_bpftrace(a), normalise_bpftrace(&e));
}
