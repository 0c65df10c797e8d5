//! userbpf's uprobe extensions in the verifier: `bpf_override_return` (helper 58) only in
//! kprobe-type programs (uprobes, uretprobes, USDT), GPL-only; stores into the argument
//! registers of `pt_regs` only with `writable_args` (SEC("uprobe.w")), scalars only, and no
//! other context store.

use userbpf_isa::asm::assemble;
use userbpf_verifier::{Options, ProgType, verify};

fn check(src: &str, prog_type: ProgType, writable_args: bool, gpl: bool) -> Result<(), String> {
    let insns = assemble(src).unwrap_or_else(|e| panic!("{e:?}"));
    let mut o = Options::new(prog_type);
    o.writable_args = writable_args;
    o.gpl_compatible = gpl;
    verify(&insns, &o).map(|_| ()).map_err(|e| e.to_string())
}

const OVERRIDE: &str = "mov %r2, 7\ncall 58\nmov %r0, 0\nexit";

#[test]
fn override_return_in_uprobes_only() {
    assert_eq!(check(OVERRIDE, ProgType::Kprobe, false, true), Ok(()));
    for t in [
        ProgType::Tracepoint { record_size: None },
        ProgType::RawTracepoint { args: None },
        ProgType::PerfEvent,
        ProgType::Syscall,
        ProgType::SocketFilter,
    ] {
        assert_eq!(
            check(OVERRIDE, t, false, true).unwrap_err(),
            "instruction 1: program of this type cannot use helper bpf_override_return#58",
            "{t:?}"
        );
    }
    // GPL-only, as in the kernel.
    assert_eq!(
        check(OVERRIDE, ProgType::Kprobe, false, false).unwrap_err(),
        "instruction 1: cannot call GPL-restricted function from non-GPL compatible program"
    );
    // r1 must be the context, unmodified.
    let e = check("mov %r1, 0\nmov %r2, 7\ncall 58\nmov %r0, 0\nexit", ProgType::Kprobe, false, true).unwrap_err();
    assert!(e.starts_with("instruction 2: R1 type=scalar expected=ctx"), "{e}");
    // r2 must be initialised.
    let e = check("call 58\nmov %r0, 0\nexit", ProgType::Kprobe, false, true).unwrap_err();
    assert!(e.starts_with("instruction 0: R2 !read_ok"), "{e}");
}

#[test]
fn argument_writes_only_with_the_opt_in() {
    // di (112), si (104), dx (96), cx (88), r8 (72), r9 (64): whole and in part.
    for off in [112, 104, 96, 88, 72, 64] {
        let p = format!("ldxdw %r2, [%r1+{off}]\nadd %r2, 1\nstxdw [%r1+{off}], %r2\nmov %r0, 0\nexit");
        assert_eq!(check(&p, ProgType::Kprobe, true, true), Ok(()), "{off}");
        let e = check(&p, ProgType::Kprobe, false, true).unwrap_err();
        assert!(
            e.starts_with(&format!(
                "instruction 2: invalid bpf_context access off={off} size=8 (argument registers may be written only by SEC(\"uprobe.w/...\") programs"
            )),
            "{e}"
        );
        let p = format!("mov %r2, 5\nstxw [%r1+{}], %r2\nmov %r0, 0\nexit", off + 4);
        assert_eq!(check(&p, ProgType::Kprobe, true, true), Ok(()), "{off}+4");
    }
    // Nothing else of pt_regs: ax, ip, sp, flags, the callee-saved registers.
    for off in [80, 128, 152, 144, 0, 40, 32] {
        let p = format!("mov %r2, 5\nstxdw [%r1+{off}], %r2\nmov %r0, 0\nexit");
        let e = check(&p, ProgType::Kprobe, true, true).unwrap_err();
        assert_eq!(e, format!("instruction 1: invalid bpf_context access off={off} size=8"), "{off}");
    }
    // A pointer would outlive the run in the function's hands.
    let e = check("mov %r2, %r10\nstxdw [%r1+112], %r2\nmov %r0, 0\nexit", ProgType::Kprobe, true, true).unwrap_err();
    assert!(e.starts_with("instruction 1: R2 leaks addr into ctx"), "{e}");
    // Only for uprobes.
    let p = "mov %r2, 5\nstxdw [%r1+112], %r2\nmov %r0, 0\nexit";
    assert!(check(p, ProgType::PerfEvent, true, true).is_err());
}
