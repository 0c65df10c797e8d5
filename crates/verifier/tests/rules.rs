//! Rules checked without the kernel: programs written in assembly, verified as root and as
//! an unprivileged loader, and the log.

use userbpf_isa::asm::assemble;
use userbpf_verifier::{MapInfo, Options, ProgType, verify};

fn opts(privileged: bool) -> Options {
    let mut o = Options::new(ProgType::Kprobe);
    o.privileged = privileged;
    o.maps.insert(
        0,
        MapInfo { name: "arr".into(), map_type: 2, key_size: 4, value_size: 8, max_entries: 4, ..Default::default() },
    );
    o.maps.insert(
        1,
        MapInfo { name: "hash".into(), map_type: 1, key_size: 4, value_size: 16, max_entries: 4, ..Default::default() },
    );
    o
}

fn check(src: &str, privileged: bool) -> Result<usize, String> {
    let insns = assemble(src).unwrap_or_else(|e| panic!("{e:?}"));
    verify(&insns, &opts(privileged)).map(|s| s.insns_processed).map_err(|e| e.to_string())
}

#[test]
fn uninitialised_stack_reads_only_as_root() {
    let p = "ldxdw %r0, [%r10-8]\nexit";
    assert!(check(p, true).is_ok());
    assert_eq!(check(p, false).unwrap_err(), "instruction 0: invalid read from stack R10 off -8+0 size 8");
}

#[test]
fn pointer_leaks_only_as_root() {
    let p = "mov %r0, %r10\nexit";
    assert!(check(p, true).is_ok());
    assert_eq!(check(p, false).unwrap_err(), "instruction 1: R0 leaks addr as return value");
}

#[test]
fn bounded_loops_run_to_their_end_and_unbounded_ones_hit_the_limit() {
    let bounded = "mov %r0, 0\nadd %r0, 1\njlt %r0, 1000, -2\nexit";
    let n = check(bounded, true).unwrap();
    assert!(n >= 2000, "{n} instructions processed");
    let unbounded = "ldxdw %r1, [%r1+112]\nmov %r0, 0\nadd %r0, 1\njlt %r0, %r1, -2\nexit";
    let e = check(unbounded, true).unwrap_err();
    assert!(e.contains("BPF program is too large. Processed 1000001 insn"), "{e}");
}

#[test]
fn pruning_keeps_branchy_programs_linear() {
    // 30 independent branches: 2^30 paths without pruning. The registers they test and set
    // are dead where the paths join, so the states there are the same.
    let mut p = String::from("mov %r0, 0\n");
    for i in 0..30 {
        p.push_str(&format!("ldxdw %r2, [%r1+112]\njset %r2, {}, +1\nmov %r3, {i}\n", 1u32 << (i % 31)));
    }
    p.push_str("exit\n");
    let n = check(&p, true).unwrap();
    assert!(n < 2000, "{n} instructions processed");
}

#[test]
fn null_check_on_a_copy_refines_the_original() {
    let p = "stw [%r10-4], 1\nmov %r2, %r10\nadd %r2, -4\nlddw %r1, 0\ncall 1\nmov %r6, %r0\njeq %r6, 0, +2\nldxdw %r0, [%r0+8]\nexit\nmov %r0, 0\nexit";
    let mut insns = assemble(p).unwrap();
    insns[3].src = userbpf_isa::BPF_PSEUDO_MAP_IDX;
    insns[3].imm = 1;
    assert!(verify(&insns, &opts(true)).is_ok());
}

#[test]
fn errors_carry_the_register_states() {
    let insns = assemble("mov %r2, 7\nldxdw %r0, [%r2+0]\nexit").unwrap();
    let e = verify(&insns, &opts(true)).unwrap_err();
    assert_eq!(e.message, "R2 invalid mem access 'scalar'");
    assert!(e.log.contains("1: R1=ctx() R2=7 R10=fp0"), "{}", e.log);
    let mut o = opts(true);
    o.log_level = 2;
    let e = verify(&insns, &o).unwrap_err();
    assert!(e.log.contains("0: (b7) "), "{}", e.log);
}

#[test]
fn imprecise_scalars_do_not_keep_states_apart() {
    // 30 tests of bits of one unknown value: each refines it differently, but nothing
    // depends on its range, so the paths join (without precision tracking: 2^30 paths).
    let mut p = String::from("mov %r0, 0\nldxdw %r2, [%r1+112]\n");
    for i in 0..30 {
        p.push_str(&format!("jset %r2, {}, +1\nmov %r3, {i}\n", 1u32 << i));
    }
    p.push_str("exit\n");
    let n = check(&p, true).unwrap();
    assert!(n < 2000, "{n} instructions processed");
}

#[test]
fn a_scalar_used_as_an_offset_is_precise_where_paths_join() {
    // The first path (r3 = 0) is safe and stores its state at 18; the second (r3 = 8) joins
    // there and must not be pruned: r3 became an offset after the join.
    let p = "ldxdw %r2, [%r1+112]\nmov %r3, 8\nmov %r4, 1\nmov %r4, 2\nmov %r4, 3\njeq %r4, 7, +0\nmov %r5, 1\nmov %r5, 2\n\
             jeq %r2, 0, +9\nmov %r3, 0\nmov %r5, 1\nmov %r5, 2\njeq %r5, 7, +0\nmov %r5, 3\nmov %r5, 4\njeq %r5, 7, +0\nmov %r5, 5\nmov %r5, 6\n\
             mov %r4, %r10\nadd %r4, -8\nadd %r4, %r3\nstxdw [%r4+0], %r2\nmov %r0, 0\nexit";
    let e = check(p, true).unwrap_err();
    assert_eq!(e, "instruction 21: invalid write to stack R4 off=0 size=8");
}

/// A map lookup whose stack key is not a known constant does not make the key precise (the
/// kernel's `get_constant_map_key` marks only constants): the loop's exits, which differ
/// only in the counter that went into the key, join after the loop instead of each running
/// the rest of the program.
#[test]
fn a_non_constant_map_key_does_not_keep_loop_exits_apart() {
    let p = "ldxdw %r6, [%r1+112]\nldxdw %r7, [%r1+104]\nmov %r2, 1\n\
             jeq %r2, 64, +4\nmov %r1, %r6\nrsh %r1, %r2\nadd %r2, 1\njne %r1, 0, -5\n\
             and %r7, 1\nadd %r2, %r7\nstxw [%r10-4], %r2\nmov %r2, %r10\nadd %r2, -4\nlddw %r1, 0\ncall 1\n\
             mov %r0, 0\nmov %r3, 1\nmov %r3, 2\nmov %r3, 3\nmov %r3, 4\nmov %r3, 5\nmov %r3, 6\nmov %r3, 7\nexit";
    let mut insns = assemble(p).unwrap_or_else(|e| panic!("{e:?}"));
    let ld = insns.iter().position(|i| i.is_lddw()).unwrap();
    insns[ld].src = userbpf_isa::BPF_PSEUDO_MAP_IDX;
    let n = verify(&insns, &opts(true)).unwrap_or_else(|e| panic!("{e}")).insns_processed;
    // 63 iterations of the loop's 5 instructions, and the rest of the program about once.
    assert!(n < 500, "{n} instructions processed");
}
