//! Exit requests (`request_exit`, for bpf_tail_call) and callbacks (`callback::invoke`, for
//! bpf_loop and friends), in both executors, which must agree.

mod common;

use std::cell::RefCell;

use common::{Asm, Exec, u64_at};
use userbpf_isa::*;
use userbpf_vm::error::AccessKind;
use userbpf_vm::interp::INTERP_FUNC_TAG;
use userbpf_vm::{Helper, HelperFn, HelperRegistry, MAX_CALL_FRAMES, VmError, callback, request_exit};

const H_EXIT: u32 = 1;
const H_EXIT_UNMARKED: u32 = 2;
const H_LOOP: u32 = 3;
const H_LOOP_UNMARKED: u32 = 4;
const H_INVOKE: u32 = 5;
const H_RUN_INNER: u32 = 6;
const H_ADD1: u32 = 7;

thread_local! {
    /// Errors helpers got from `callback::invoke` or from an inner run.
    static SEEN: RefCell<Vec<VmError>> = const { RefCell::new(Vec::new()) };
    /// The program H_RUN_INNER runs.
    static INNER: RefCell<Option<Exec>> = const { RefCell::new(None) };
}

fn seen() -> Vec<VmError> {
    SEEN.with(|s| std::mem::take(&mut *s.borrow_mut()))
}

/// request_exit(r1); returns 0.
unsafe extern "C" fn h_exit(r0: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    request_exit(r0);
    0
}

/// bpf_loop: cb(i, ctx) for i in 0..n until it returns non-zero; the number of calls, or -1
/// when `invoke` fails.
unsafe extern "C" fn h_loop(n: u64, cb: u64, ctx: u64, _: u64, _: u64) -> u64 {
    for i in 0..n {
        match callback::invoke(cb, [i, ctx, 0, 0, 0]) {
            Ok(0) => {}
            Ok(_) => return i + 1,
            Err(e) => {
                SEEN.with(|s| s.borrow_mut().push(e));
                return u64::MAX;
            }
        }
    }
    n
}

/// invoke(func, [a, 0, 0, 0, 0]): its r0, -22 if refused, -1 if the run is ending.
unsafe extern "C" fn h_invoke(func: u64, a: u64, _: u64, _: u64, _: u64) -> u64 {
    match callback::invoke(func, [a, 0, 0, 0, 0]) {
        Ok(v) => v,
        Err(e) => {
            let refused = matches!(e, VmError::InvalidCallback { .. });
            SEEN.with(|s| s.borrow_mut().push(e));
            if refused { -22i64 as u64 } else { u64::MAX }
        }
    }
}

/// Runs the thread's INNER program; its r0 (u64::MAX if it failed). r1 != 0: then asks the
/// calling run to end with that r0, as bpf_tail_call does.
unsafe extern "C" fn h_run_inner(tail: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    let r = INNER.with(|i| i.borrow().as_ref().expect("an inner program").run(&mut []));
    let v = r.unwrap_or_else(|e| {
        SEEN.with(|s| s.borrow_mut().push(e));
        u64::MAX
    });
    if tail != 0 {
        request_exit(v);
    }
    v
}

unsafe extern "C" fn h_add1(a: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    a + 1
}

fn helpers() -> HelperRegistry {
    let mut r = HelperRegistry::new();
    for (id, name, func, may_exit) in [
        (H_EXIT, "exit", h_exit as HelperFn, true),
        (H_EXIT_UNMARKED, "exit_unmarked", h_exit as HelperFn, false),
        (H_LOOP, "loop", h_loop as HelperFn, true),
        (H_LOOP_UNMARKED, "loop_unmarked", h_loop as HelperFn, false),
        (H_INVOKE, "invoke", h_invoke as HelperFn, true),
        (H_RUN_INNER, "run_inner", h_run_inner as HelperFn, true),
        (H_ADD1, "add1", h_add1 as HelperFn, true),
    ] {
        r.register(Helper { id, name, func, may_exit });
    }
    r
}

fn both(insns: &[Insn]) -> [Exec; 2] {
    [Exec::load(insns, helpers(), false), Exec::load(insns, helpers(), true)]
}

// ---- exit requests ----

#[test]
fn exit_ends_the_run_at_once() {
    let mut a = Asm::new();
    a.movx(6, 1).mov(1, 42).call(H_EXIT).st(BPF_DW, 6, 0, 1).mov(0, 99).exit();
    for e in both(&a.build()) {
        let mut buf = [0u8; 8];
        assert_eq!(e.run(&mut buf), Ok(42), "{}", e.name());
        assert_eq!(buf, [0; 8], "{}: the rest of the program did not run", e.name());
        // The request was the run's own: the next run starts clean.
        let ok = Exec::load(&Asm::new().mov(0, 3).exit().build(), helpers(), matches!(e, Exec::Jit(_)));
        assert_eq!(ok.run(&mut []), Ok(3));
    }
}

#[test]
fn exit_from_nested_bpf_frames() {
    let mut a = Asm::new();
    a.movx(6, 1).lddw(7, 0x7777).lddw(8, 0x8888).call_fn("f1").st(BPF_DW, 6, 0, 1).mov(0, 99).exit();
    a.label("f1").st(BPF_DW, 10, -8, 5).mov(7, 1).call_fn("f2").st(BPF_DW, 6, 8, 1).mov(0, 98).exit();
    a.label("f2").mov(8, 2).st(BPF_DW, 10, -8, 6).mov(1, 77).call(H_EXIT).st(BPF_DW, 6, 16, 1).mov(0, 97).exit();
    for e in both(&a.build()) {
        let mut buf = [0u8; 24];
        assert_eq!(e.run(&mut buf), Ok(77), "{}", e.name());
        assert_eq!(buf, [0; 24], "{}", e.name());
        assert_eq!(e.run(&mut buf), Ok(77), "{}: again", e.name());
    }
}

#[test]
fn exit_after_an_unmarked_helper_is_honoured_when_the_run_ends() {
    let mut a = Asm::new();
    a.movx(6, 1).mov(1, 42).call(H_EXIT_UNMARKED).st(BPF_DW, 6, 0, 1).mov(0, 99).exit();
    for e in both(&a.build()) {
        let mut buf = [0u8; 8];
        assert_eq!(e.run(&mut buf), Ok(42), "{}", e.name());
        assert_eq!(u64_at(&buf, 0), 1, "{}: the program went on", e.name());
    }
}

#[test]
fn marked_helpers_without_a_request_go_on() {
    // r6..r9 survive the check after the helper, r0 is the helper's.
    let mut a = Asm::new();
    a.mov(6, 1).mov(7, 20).mov(8, 300).mov(9, 4000).mov(1, 50000).call(H_ADD1);
    a.addx(0, 6).addx(0, 7).addx(0, 8).addx(0, 9).exit();
    for e in both(&a.build()) {
        assert_eq!(e.run(&mut []), Ok(54322), "{}", e.name());
    }
}

#[test]
fn callx_checks_for_exit_requests() {
    for id in [H_EXIT, H_EXIT_UNMARKED] {
        let mut a = Asm::new();
        a.movx(6, 1).mov(1, 42).mov(2, id as i32).callx(2).st(BPF_DW, 6, 0, 1).mov(0, 99).exit();
        for e in both(&a.build()) {
            let mut buf = [0u8; 8];
            assert_eq!(e.run(&mut buf), Ok(42), "{} id {id}", e.name());
            assert_eq!(buf, [0; 8], "{} id {id}", e.name());
        }
    }
}

#[test]
fn request_exit_outside_a_run_is_ignored() {
    request_exit(5);
    for e in both(&Asm::new().mov(0, 3).exit().build()) {
        assert_eq!(e.run(&mut []), Ok(3), "{}", e.name());
    }
}

#[test]
fn nested_runs_keep_their_own_requests() {
    // The inner program asks its own run to end with 5.
    let inner_exit = Asm::new().mov(1, 5).call(H_EXIT).mov(0, 1).exit().build();
    let inner_plain = Asm::new().mov(0, 7).exit().build();
    let inner_fails = Asm::new().mov(1, 0).ldx(BPF_DW, 0, 1, 8).exit().build();
    // Not a tail call: the outer program goes on with the inner's r0.
    let outer_call = Asm::new().mov(1, 0).call(H_RUN_INNER).add(0, 100).exit().build();
    // A tail call: the outer run ends with the inner's r0.
    let outer_tail = Asm::new().movx(6, 1).mov(1, 1).call(H_RUN_INNER).st(BPF_DW, 6, 0, 1).mov(0, 99).exit().build();
    // A request of the outer run (unmarked, so pending) survives the inner run's own.
    let outer_pending =
        Asm::new().mov(1, 42).call(H_EXIT_UNMARKED).mov(1, 0).call(H_RUN_INNER).add(0, 100).exit().build();
    for outer_jit in [false, true] {
        for inner_jit in [false, true] {
            let what = format!("outer jit {outer_jit}, inner jit {inner_jit}");
            let set_inner = |p: &[Insn]| INNER.with(|i| *i.borrow_mut() = Some(Exec::load(p, helpers(), inner_jit)));
            set_inner(&inner_exit);
            assert_eq!(Exec::load(&outer_call, helpers(), outer_jit).run(&mut []), Ok(105), "{what}");
            let mut buf = [0u8; 8];
            assert_eq!(Exec::load(&outer_tail, helpers(), outer_jit).run(&mut buf), Ok(5), "{what}");
            assert_eq!(buf, [0; 8], "{what}");
            assert_eq!(Exec::load(&outer_pending, helpers(), outer_jit).run(&mut []), Ok(42), "{what}");
            set_inner(&inner_plain);
            assert_eq!(Exec::load(&outer_tail, helpers(), outer_jit).run(&mut buf), Ok(7), "{what}");
            // An error of the inner run is the inner run's.
            set_inner(&inner_fails);
            assert_eq!(Exec::load(&outer_call, helpers(), outer_jit).run(&mut []), Ok(99), "{what}");
            let errs = seen();
            assert_eq!(errs.len(), 1, "{what}: {errs:?}");
            assert!(
                matches!(errs[0], VmError::OutOfBounds { pc: 1, addr: 8, .. } | VmError::Fault { pc: 1, addr: 8 }),
                "{what}: {errs:?}"
            );
        }
    }
    INNER.with(|i| *i.borrow_mut() = None);
}

#[test]
fn exit_from_inside_a_callback_ends_the_whole_run() {
    let mut a = Asm::new();
    a.movx(6, 1).mov(1, 10).ld_fn(2, "cb").movx(3, 6).call(H_LOOP).st(BPF_DW, 6, 8, 1).mov(0, 99).exit();
    // cb(i, ctx): counts its calls in ctx[0]; at i == 3 asks the run to end with 42.
    a.label("cb").ldx(BPF_DW, 3, 2, 0).add(3, 1).stx(BPF_DW, 2, 3, 0);
    a.jmp(BPF_JNE, 1, 3, "out").mov(1, 42).call(H_EXIT).mov(0, 1).exit();
    a.label("out").mov(0, 0).exit();
    for e in both(&a.build()) {
        let mut buf = [0u8; 16];
        assert_eq!(e.run(&mut buf), Ok(42), "{}", e.name());
        assert_eq!(u64_at(&buf, 0), 4, "{}: the loop stopped", e.name());
        assert_eq!(u64_at(&buf, 8), 0, "{}: the caller did not go on", e.name());
        assert_eq!(seen(), vec![VmError::Exited { r0: 42 }], "{}", e.name());
    }
}

// ---- callbacks ----

/// main: sum = 0 at r10-8; n = loop(10, cb, &sum); returns sum << 32 | n.
/// cb(i, ctx): writes its own r10-8 (which must not be main's), *ctx += i * i.
fn sum_of_squares() -> Vec<Insn> {
    let mut a = Asm::new();
    a.st(BPF_DW, 10, -8, 0).mov(1, 10).ld_fn(2, "cb").movx(3, 10).add(3, -8).call(H_LOOP);
    a.movx(6, 0).ldx(BPF_DW, 0, 10, -8).alu(BPF_LSH, 0, 32).alux(BPF_OR, 0, 6).exit();
    a.label("cb").st(BPF_DW, 10, -8, 1234).movx(3, 1).alux(BPF_MUL, 3, 1);
    a.ldx(BPF_DW, 4, 2, 0).addx(4, 3).stx(BPF_DW, 2, 4, 0);
    a.ldx(BPF_DW, 0, 10, -8).add(0, -1234).exit();
    a.build()
}

#[test]
fn callbacks_run_with_their_own_stack() {
    for e in both(&sum_of_squares()) {
        assert_eq!(e.run(&mut []), Ok((285 << 32) | 10), "{}", e.name());
    }
}

#[test]
fn interpreter_counts_callback_instructions() {
    let Exec::Interp(i) = Exec::load(&sum_of_squares(), helpers(), false) else { unreachable!() };
    let (r, n) = i.run_counted(0, 0, &[]);
    assert_eq!(r, Ok((285 << 32) | 10));
    // main: 6 slots before the call (lddw counts once) + 5 after; cb: 9 per call.
    assert_eq!(n, 5 + 1 + 5 + 10 * 9);
}

#[test]
fn callbacks_nest_and_make_local_calls() {
    let mut a = Asm::new();
    a.st(BPF_DW, 10, -8, 0).mov(1, 3).ld_fn(2, "outer").movx(3, 10).add(3, -8).call(H_LOOP);
    a.ldx(BPF_DW, 0, 10, -8).exit();
    // outer(i, ctx): *ctx += sq(i); loop(i + 1, inner, ctx)
    a.label("outer").movx(6, 2).movx(7, 1).movx(1, 7).call_fn("sq").movx(8, 0);
    a.movx(1, 7).add(1, 1).ld_fn(2, "inner").movx(3, 6).call(H_LOOP);
    a.ldx(BPF_DW, 4, 6, 0).addx(4, 8).stx(BPF_DW, 6, 4, 0).mov(0, 0).exit();
    a.label("sq").movx(0, 1).alux(BPF_MUL, 0, 1).exit();
    // inner(j, ctx): *ctx += 1000
    a.label("inner").ldx(BPF_DW, 3, 2, 0).add(3, 1000).stx(BPF_DW, 2, 3, 0).mov(0, 0).exit();
    for e in both(&a.build()) {
        assert_eq!(e.run(&mut []), Ok(6005), "{}", e.name());
    }
}

#[test]
fn callback_depth_is_limited() {
    // cb calls loop(1, cb, ctx) again, forever; ctx[0] counts the calls.
    let mut a = Asm::new();
    a.movx(6, 1).mov(1, 1).ld_fn(2, "cb").movx(3, 6).call(H_LOOP).st(BPF_DW, 6, 8, 1).mov(0, 99).exit();
    a.label("cb").movx(6, 2).ldx(BPF_DW, 3, 6, 0).add(3, 1).stx(BPF_DW, 6, 3, 0);
    a.mov(1, 1).ld_fn(2, "cb").movx(3, 6).call(H_LOOP).mov(0, 0).exit();
    let cb = a.at("cb");
    for e in both(&a.build()) {
        let mut buf = [0u8; 16];
        assert_eq!(e.run(&mut buf), Err(VmError::CallDepth { pc: cb, max: MAX_CALL_FRAMES }), "{}", e.name());
        // The entry frame and seven callbacks.
        assert_eq!(u64_at(&buf, 0), MAX_CALL_FRAMES as u64 - 1, "{}", e.name());
        assert_eq!(u64_at(&buf, 8), 0, "{}", e.name());
        let errs = seen();
        assert_eq!(errs.len(), MAX_CALL_FRAMES, "{}: every level's helper saw it", e.name());
        assert!(errs.iter().all(|x| *x == VmError::CallDepth { pc: cb, max: MAX_CALL_FRAMES }), "{errs:?}");
    }
}

#[test]
fn invalid_callbacks_are_refused_and_the_program_goes_on() {
    let mut a = Asm::new();
    a.movx(6, 1);
    a.lddw(1, 12345).mov(2, 1).call(H_INVOKE).stx(BPF_DW, 6, 0, 0);
    a.ld_fn(1, "cb").add(1, 1).mov(2, 1).call(H_INVOKE).stx(BPF_DW, 6, 0, 8);
    a.ld_fn(1, "cb").mov(2, 5).call(H_INVOKE).stx(BPF_DW, 6, 0, 16);
    // The other executor's kind of function value.
    a.ldx(BPF_DW, 1, 6, 32).mov(2, 5).call(H_INVOKE).stx(BPF_DW, 6, 0, 24);
    a.mov(0, 1).exit();
    a.label("cb").movx(0, 1).alu(BPF_MUL, 0, 2).exit();
    let cb = a.at("cb") as u64;
    let insns = a.build();
    for e in both(&insns) {
        let other = match e {
            Exec::Interp(_) => {
                let Exec::Jit(j) = Exec::load(&insns, helpers(), true) else { unreachable!() };
                // The entry of a JIT program that is not running.
                j.subprog_address(1) as u64
            }
            Exec::Jit(_) => INTERP_FUNC_TAG | cb,
        };
        let mut buf = [0u8; 40];
        buf[32..].copy_from_slice(&other.to_le_bytes());
        assert_eq!(e.run(&mut buf), Ok(1), "{}", e.name());
        let einval = -22i64 as u64;
        assert_eq!(
            [u64_at(&buf, 0), u64_at(&buf, 8), u64_at(&buf, 16), u64_at(&buf, 24)],
            [einval, einval, 10, einval],
            "{}",
            e.name()
        );
        let errs = seen();
        assert_eq!(errs.len(), 3, "{errs:?}");
        assert!(errs.iter().all(|x| matches!(x, VmError::InvalidCallback { .. })), "{errs:?}");
    }
    // Outside any run.
    assert!(
        matches!(callback::invoke(INTERP_FUNC_TAG, [0; 5]), Err(VmError::InvalidCallback { func, .. }) if func == INTERP_FUNC_TAG)
    );
}

/// main: loop(5, cb, buf); buf[8] = 1; return 99. cb fails at i == 2 with `bad`.
fn failing_callback(helper: u32, bad: &dyn Fn(&mut Asm)) -> (Vec<Insn>, usize) {
    let mut a = Asm::new();
    a.movx(6, 1).mov(1, 5).ld_fn(2, "cb").movx(3, 6).call(helper).st(BPF_DW, 6, 8, 1).mov(0, 99).exit();
    a.label("cb").ldx(BPF_DW, 4, 2, 0).add(4, 1).stx(BPF_DW, 2, 4, 0);
    a.jmp(BPF_JEQ, 1, 2, "bad").mov(0, 0).exit();
    a.label("bad");
    let pc = a.here();
    bad(&mut a);
    a.exit();
    (a.build(), pc)
}

#[test]
fn an_error_in_a_callback_ends_the_enclosing_run() {
    // Out of bounds (interpreter) / a fault (JIT).
    let (p, pc) = failing_callback(H_LOOP, &|a| {
        a.mov(4, 0).ldx(BPF_DW, 0, 4, 24);
    });
    for e in both(&p) {
        let mut buf = [0u8; 16];
        let r = e.run(&mut buf);
        match &e {
            Exec::Interp(_) => {
                assert_eq!(r, Err(VmError::OutOfBounds { pc: pc + 1, addr: 24, len: 8, kind: AccessKind::Read }))
            }
            Exec::Jit(_) => assert_eq!(r, Err(VmError::Fault { pc: pc + 1, addr: 24 })),
        }
        assert_eq!(u64_at(&buf, 0), 3, "{}", e.name());
        assert_eq!(u64_at(&buf, 8), 0, "{}: the caller did not go on", e.name());
        assert_eq!(seen().len(), 1);
    }
    // callx of an unknown helper.
    let (p, pc) = failing_callback(H_LOOP, &|a| {
        a.mov(5, 4321).callx(5);
    });
    for e in both(&p) {
        let mut buf = [0u8; 16];
        assert_eq!(e.run(&mut buf), Err(VmError::UnknownHelper { pc: pc + 1, id: 4321 }), "{}", e.name());
        assert_eq!(u64_at(&buf, 8), 0, "{}", e.name());
        assert_eq!(seen(), vec![VmError::UnknownHelper { pc: pc + 1, id: 4321 }]);
        // The process and the program are fine: a run that does not fail.
        let ok = Exec::load(&sum_of_squares(), helpers(), matches!(e, Exec::Jit(_)));
        assert_eq!(ok.run(&mut []), Ok((285 << 32) | 10));
    }
}

#[test]
fn an_error_in_a_callback_of_an_unmarked_helper_is_reported_when_the_run_ends() {
    let (p, pc) = failing_callback(H_LOOP_UNMARKED, &|a| {
        a.mov(5, 4321).callx(5);
    });
    for e in both(&p) {
        let mut buf = [0u8; 16];
        assert_eq!(e.run(&mut buf), Err(VmError::UnknownHelper { pc: pc + 1, id: 4321 }), "{}", e.name());
        assert_eq!(u64_at(&buf, 8), 1, "{}: the program went on", e.name());
        assert_eq!(seen().len(), 1);
    }
}

#[test]
fn a_helper_that_calls_back_after_the_run_ended_runs_nothing() {
    // h_loop stops at the first error; a helper that ignores it and calls again gets the
    // same error without running anything.
    unsafe extern "C" fn h_stubborn(cb: u64, ctx: u64, _: u64, _: u64, _: u64) -> u64 {
        let first = callback::invoke(cb, [0, ctx, 0, 0, 0]);
        let second = callback::invoke(cb, [1, ctx, 0, 0, 0]);
        SEEN.with(|s| s.borrow_mut().extend([first.unwrap_err(), second.unwrap_err()]));
        0
    }
    let mut r = helpers();
    r.register(Helper { id: 50, name: "stubborn", func: h_stubborn, may_exit: true });
    let mut a = Asm::new();
    a.movx(6, 1).ld_fn(1, "cb").movx(2, 6).call(50).mov(0, 99).exit();
    // cb: ctx[0] += 1; then an unknown callx
    a.label("cb").ldx(BPF_DW, 4, 2, 0).add(4, 1).stx(BPF_DW, 2, 4, 0).mov(5, 999).callx(5).exit();
    let pc = a.at("cb") + 4;
    for jit in [false, true] {
        let e = Exec::load(&a.build(), r.clone(), jit);
        let mut buf = [0u8; 8];
        let want = VmError::UnknownHelper { pc, id: 999 };
        assert_eq!(e.run(&mut buf), Err(want.clone()), "{}", e.name());
        assert_eq!(u64_at(&buf, 0), 1, "{}: the callback ran once", e.name());
        assert_eq!(seen(), vec![want.clone(), want], "{}", e.name());
    }
}
