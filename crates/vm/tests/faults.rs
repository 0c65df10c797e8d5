//! Faults in JIT code end the run with `VmError::Fault` and leave the process usable; faults
//! anywhere else still do what they would without the VM.

mod common;

use std::sync::Arc;

use common::{Asm, Exec};
use userbpf_isa::*;
use userbpf_vm::error::AccessKind;
use userbpf_vm::{Helper, HelperFn, HelperRegistry, JitProgram, LoadOptions, Program, Region, VmError, callback};

const H_LOOP: u32 = 3;
const H_NULL: u32 = 4;
const H_RUN: u32 = 5;

/// bpf_loop: cb(i, ctx) for i in 0..n until it returns non-zero or `invoke` fails.
unsafe extern "C" fn h_loop(n: u64, cb: u64, ctx: u64, _: u64, _: u64) -> u64 {
    for i in 0..n {
        match callback::invoke(cb, [i, ctx, 0, 0, 0]) {
            Ok(0) => {}
            Ok(_) => return i + 1,
            Err(_) => return u64::MAX,
        }
    }
    n
}

/// A helper that dereferences null: a fault that is not the JIT's.
unsafe extern "C" fn h_null(a: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    // SAFETY: not safe at all: the test runs this in a child process that must die of it.
    unsafe { std::ptr::read_volatile(a as *const u64) }
}

/// Runs the JIT program at `prog` (a `*const JitProgram`) with r1 = 0: r0, or u64::MAX on error.
unsafe extern "C" fn h_run(prog: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    // SAFETY: the test passes the address of a JitProgram that outlives the run.
    let j = unsafe { &*(prog as *const JitProgram) };
    // SAFETY: the inner programs of the tests touch nothing or fault.
    unsafe { j.run(0, 0) }.unwrap_or(u64::MAX)
}

fn helpers() -> HelperRegistry {
    let mut r = HelperRegistry::new();
    r.register(Helper { id: H_LOOP, name: "loop", func: h_loop as HelperFn, may_exit: true });
    r.register(Helper::new(H_NULL, "null", h_null as HelperFn));
    r.register(Helper::new(H_RUN, "run", h_run as HelperFn));
    r
}

fn jit(insns: &[Insn]) -> JitProgram {
    let opts = LoadOptions { helpers: Arc::new(helpers()), allow_callx: true, ..Default::default() };
    let prog = Program::load(insns, &opts, None).unwrap_or_else(|e| panic!("load failed: {e}"));
    JitProgram::compile(Arc::new(prog)).expect("compile")
}

fn run(j: &JitProgram, r1: u64, r2: u64) -> Result<u64, VmError> {
    // SAFETY: the tests' programs touch their stack and the memory they are given, or fault.
    unsafe { j.run(r1, r2) }
}

/// An anonymous mapping of `pages` pages; `prot[i]` is page i's protection.
struct Pages {
    ptr: *mut u8,
    len: usize,
}

fn page_size() -> usize {
    // SAFETY: sysconf only reads a system constant.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

impl Pages {
    fn new(prot: &[libc::c_int]) -> Pages {
        let page = page_size();
        let len = page * prot.len();
        // SAFETY: a fresh anonymous mapping; nothing else is touched.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let ptr = p.cast::<u8>();
        for (i, &pr) in prot.iter().enumerate() {
            // SAFETY: a page of the mapping made above.
            assert_eq!(unsafe { libc::mprotect(ptr.add(i * page).cast(), page, pr) }, 0);
        }
        Pages { ptr, len }
    }
    fn addr(&self, off: usize) -> u64 {
        self.ptr as u64 + off as u64
    }
}

impl Drop for Pages {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, no longer used.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// A program that sums the 8 bytes at r1 and r1 + 8 — to run normally after a fault.
fn good_program() -> JitProgram {
    jit(&Asm::new().ldx(BPF_DW, 0, 1, 0).ldx(BPF_DW, 2, 1, 8).addx(0, 2).exit().build())
}

fn check_usable() {
    let g = good_program();
    let buf = [40u64, 2];
    assert_eq!(run(&g, buf.as_ptr() as u64, 0), Ok(42));
    // SIGSEGV is not left blocked on this thread.
    // SAFETY: querying the signal mask into a local set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        assert_eq!(libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut set), 0);
        assert_eq!(libc::sigismember(&set, libc::SIGSEGV), 0);
        assert_eq!(libc::sigismember(&set, libc::SIGBUS), 0);
    }
}

#[test]
fn null_dereference() {
    let p = Asm::new().mov(0, 1).ldx(BPF_DW, 0, 1, 16).exit().build();
    let j = jit(&p);
    assert_eq!(run(&j, 0, 0), Err(VmError::Fault { pc: 1, addr: 16 }));
    // The same program with a good pointer, and the interpreter's view of the bad one.
    let v = [0u64, 0, 0x1234];
    assert_eq!(run(&j, v.as_ptr() as u64, 0), Ok(0x1234));
    let i = Exec::load(&p, helpers(), false);
    assert_eq!(i.run_with(0, 0, &[]), Err(VmError::OutOfBounds { pc: 1, addr: 16, len: 8, kind: AccessKind::Read }));
    check_usable();
}

#[test]
fn store_to_a_read_only_page() {
    let ro = Pages::new(&[libc::PROT_READ]);
    let mut a = Asm::new();
    a.ldx(BPF_W, 0, 1, 0).st(BPF_W, 1, 4, 7).exit();
    let j = jit(&a.build());
    assert_eq!(run(&j, ro.addr(0), 0), Err(VmError::Fault { pc: 1, addr: ro.addr(4) }));
    // Atomics on it fault too.
    let j = jit(&Asm::new().mov(2, 1).atomic(BPF_DW, 1, 2, 8, BPF_ADD as i32).mov(0, 0).exit().build());
    assert_eq!(run(&j, ro.addr(0), 0), Err(VmError::Fault { pc: 1, addr: ro.addr(8) }));
    let mut rw = [0u64; 2];
    assert_eq!(run(&j, rw.as_mut_ptr() as u64, 0), Ok(0));
    assert_eq!(rw[1], 1);
    check_usable();
}

#[test]
fn wild_and_non_canonical_addresses() {
    // A non-canonical address is a general-protection fault: the kernel gives no address.
    let j = jit(&Asm::new().lddw(1, 0x8000_0000_0000_0000).st(BPF_DW, 1, 0, 1).exit().build());
    assert_eq!(run(&j, 0, 0), Err(VmError::Fault { pc: 2, addr: 0 }));
    // Kernel space.
    let j = jit(&Asm::new().lddw(1, 0xffff_8880_0000_0000).ldx(BPF_B, 0, 1, 0x10).exit().build());
    assert!(matches!(run(&j, 0, 0), Err(VmError::Fault { pc: 2, .. })));
    check_usable();
}

#[test]
fn misaligned_atomic_across_a_page() {
    let page = page_size();
    let m = Pages::new(&[libc::PROT_READ | libc::PROT_WRITE, libc::PROT_NONE]);
    let at = m.addr(page - 4);
    for (size, op) in [
        (BPF_DW, BPF_ADD as i32),
        (BPF_DW, BPF_XCHG),
        (BPF_DW, BPF_CMPXCHG),
        (BPF_DW, 0x40 | BPF_FETCH),
        (BPF_W, BPF_ADD as i32 | BPF_FETCH),
    ] {
        let mut a = Asm::new();
        a.mov(2, 1).mov(0, 0).atomic(size, 1, 2, if size == BPF_W { 2 } else { 0 }, op).exit();
        let j = jit(&a.build());
        match run(&j, at, 0) {
            Err(VmError::Fault { pc: 2, addr }) => {
                assert!((m.addr(page)..m.addr(page) + 8).contains(&addr), "{addr:#x}")
            }
            other => panic!("size {size:#x} op {op:#x}: {other:?}"),
        }
    }
    check_usable();
}

#[test]
fn bus_error_beyond_the_end_of_a_file_mapping() {
    // SAFETY: an empty memfd mapped shared: the page exists but has no backing, so a read of
    // it raises SIGBUS.
    let (fd, p) = unsafe {
        let fd = libc::memfd_create(c"userbpf-vm-test".as_ptr(), 0);
        assert!(fd >= 0);
        let p = libc::mmap(std::ptr::null_mut(), page_size(), libc::PROT_READ, libc::MAP_SHARED, fd, 0);
        assert_ne!(p, libc::MAP_FAILED);
        (fd, p)
    };
    let j = jit(&Asm::new().mov(0, 5).ldx(BPF_W, 0, 1, 12).exit().build());
    assert_eq!(run(&j, p as u64, 0), Err(VmError::Fault { pc: 1, addr: p as u64 + 12 }));
    // SAFETY: the mapping and the fd made above.
    unsafe {
        libc::munmap(p, page_size());
        libc::close(fd);
    }
    check_usable();
}

#[test]
fn fault_in_a_nested_bpf_to_bpf_frame() {
    // main -> f1 -> f2 -> f3, each with stack contents and r6..r9 of its own; f3 dereferences
    // r1 + 8.
    let mut a = Asm::new();
    a.movx(6, 1).mov(7, 7).st(BPF_DW, 10, -8, 1).call_fn("f1").ldx(BPF_DW, 1, 10, -8).addx(0, 1).addx(0, 7).exit();
    a.label("f1")
        .mov(7, 70)
        .mov(8, 80)
        .st(BPF_DW, 10, -16, 2)
        .call_fn("f2")
        .ldx(BPF_DW, 1, 10, -16)
        .addx(0, 1)
        .addx(0, 8)
        .exit();
    a.label("f2").mov(9, 900).st(BPF_DW, 10, -24, 3).call_fn("f3").ldx(BPF_DW, 1, 10, -24).addx(0, 1).addx(0, 9).exit();
    a.label("f3").mov(6, 6000).ldx(BPF_DW, 0, 1, 8).addx(0, 6).exit();
    let pc = a.at("f3") + 1;
    let j = jit(&a.build());
    for _ in 0..3 {
        assert_eq!(run(&j, 0, 0), Err(VmError::Fault { pc, addr: 8 }));
        let v = [0u64, 10000];
        assert_eq!(run(&j, v.as_ptr() as u64, 0), Ok(10000 + 6000 + 3 + 900 + 2 + 80 + 1 + 7));
    }
    check_usable();
}

#[test]
fn fault_inside_a_callback() {
    // main: loop(3, cb, buf); buf[8] = 1. cb(i, ctx): counts in ctx[0]; at i == 1 calls f,
    // which reads address 0x18.
    let mut a = Asm::new();
    a.movx(6, 1).mov(1, 3).ld_fn(2, "cb").movx(3, 6).call(H_LOOP).st(BPF_DW, 6, 8, 1).mov(0, 99).exit();
    a.label("cb").ldx(BPF_DW, 4, 2, 0).add(4, 1).stx(BPF_DW, 2, 4, 0).mov(0, 0);
    a.jmp(BPF_JNE, 1, 1, "out").mov(1, 0x10).call_fn("f").label("out").exit();
    a.label("f").ldx(BPF_DW, 0, 1, 8).exit();
    let pc = a.at("f");
    let j = jit(&a.build());
    let mut buf = [0u64; 2];
    assert_eq!(run(&j, buf.as_mut_ptr() as u64, 0), Err(VmError::Fault { pc, addr: 0x18 }));
    assert_eq!(buf, [2, 0], "the loop stopped and the caller did not go on");
    check_usable();
}

#[test]
fn fault_in_a_run_nested_in_a_helper_is_that_run_s() {
    let inner = jit(&Asm::new().mov(1, 0).ldx(BPF_DW, 0, 1, 0).exit().build());
    let outer = jit(&Asm::new().movx(6, 1).movx(1, 2).call(H_RUN).st(BPF_DW, 6, 0, 1).add(0, 2).exit().build());
    let mut buf = [0u64; 1];
    // The inner run fails (h_run gives u64::MAX); the outer one goes on.
    assert_eq!(run(&outer, buf.as_mut_ptr() as u64, &inner as *const JitProgram as u64), Ok(1));
    assert_eq!(buf[0], 1);
    check_usable();
}

#[test]
fn every_memory_form_reports_its_instruction() {
    let base = 0x40u64; // in the unmapped first pages
    let forms: Vec<Insn> = {
        let mut v = Vec::new();
        for size in [BPF_B, BPF_H, BPF_W, BPF_DW] {
            v.push(Insn::new(BPF_LDX | BPF_MEM | size, 0, 1, 8, 0));
            v.push(Insn::new(BPF_ST | BPF_MEM | size, 1, 0, 8, -1));
            v.push(Insn::new(BPF_STX | BPF_MEM | size, 1, 2, 8, 0));
            if size != BPF_DW {
                v.push(Insn::new(BPF_LDX | BPF_MEMSX | size, 0, 1, 8, 0));
            }
        }
        for size in [BPF_W, BPF_DW] {
            for op in [0x00, 0x40, 0x50, 0xa0] {
                v.push(Insn::new(BPF_STX | BPF_ATOMIC | size, 1, 2, 8, op));
                v.push(Insn::new(BPF_STX | BPF_ATOMIC | size, 1, 2, 8, op | BPF_FETCH));
            }
            v.push(Insn::new(BPF_STX | BPF_ATOMIC | size, 1, 2, 8, BPF_XCHG));
            v.push(Insn::new(BPF_STX | BPF_ATOMIC | size, 1, 2, 8, BPF_CMPXCHG));
        }
        v
    };
    for (k, &form) in forms.iter().enumerate() {
        for base_reg in [1u8, 3, 6, 9] {
            // Filler before the access (an lddw counts as two slots), with base_reg = base.
            let mut a = Asm::new();
            a.lddw(7, 0x1111_2222_3333_4444);
            for f in 0..(k % 5) {
                a.add(7, f as i32);
            }
            a.lddw(base_reg, base).mov(2, 1).mov(0, 0);
            let pc = a.here();
            let insn = Insn {
                dst: if form.class() == BPF_LDX { 0 } else { base_reg },
                src: match form.class() {
                    BPF_LDX => base_reg,
                    BPF_ST => 0,
                    _ => 2,
                },
                ..form
            };
            a.i(insn).exit();
            let j = jit(&a.build());
            assert_eq!(run(&j, 0, 0), Err(VmError::Fault { pc, addr: base + 8 }), "form {k} {insn:?} base r{base_reg}");
        }
    }
    check_usable();
}

#[test]
fn faults_on_many_threads_while_programs_come_and_go() {
    let threads: Vec<_> = (0..8)
        .map(|t| {
            std::thread::spawn(move || {
                let j = jit(&Asm::new().mov(3, t).ldx(BPF_DW, 0, 1, 8).addx(0, 3).exit().build());
                let v = [0u64, 100];
                for n in 0..300u64 {
                    assert_eq!(run(&j, n * 8, 0), Err(VmError::Fault { pc: 1, addr: n * 8 + 8 }));
                    assert_eq!(run(&j, v.as_ptr() as u64, 0), Ok(100 + t as u64));
                }
            })
        })
        .collect();
    for n in 0..300 {
        let j = jit(&Asm::new().mov(0, n).exit().build());
        assert_eq!(run(&j, 0, 0), Ok(n as u64));
    }
    for t in threads {
        t.join().unwrap();
    }
    check_usable();
}

#[test]
fn interpreter_and_jit_agree_on_where_the_bad_access_is() {
    let mut a = Asm::new();
    a.movx(6, 1).ldx(BPF_DW, 0, 6, 0).jmp(BPF_JEQ, 0, 0, "bad").exit();
    a.label("bad").ldx(BPF_DW, 1, 6, 8).ldx(BPF_DW, 0, 1, 0).exit();
    let p = a.build();
    let pc = a.at("bad") + 1;
    let j = jit(&p);
    let i = Exec::load(&p, helpers(), false);
    let good = [0u64, 0x20];
    let region = Region::new(good.as_ptr() as u64, 16, false);
    let want_i = Err(VmError::OutOfBounds { pc, addr: 0x20, len: 8, kind: AccessKind::Read });
    assert_eq!(i.run_with(good.as_ptr() as u64, 0, &[region]), want_i);
    assert_eq!(run(&j, good.as_ptr() as u64, 0), Err(VmError::Fault { pc, addr: 0x20 }));
}

/// Runs `child` in a forked child and returns its wait status.
fn in_child(child: impl FnOnce()) -> libc::c_int {
    // SAFETY: fork in a test; the child only runs code prepared before the fork (JIT code,
    // reads, no allocation or locks) and then _exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        child();
        // SAFETY: _exit is always safe to call.
        unsafe { libc::_exit(0) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    status
}

fn died_of_sigsegv(status: libc::c_int) -> bool {
    libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGSEGV
}

#[test]
fn a_fault_outside_jit_code_still_kills_the_process() {
    // Fault handling is set up and has contained a fault of JIT code in this process.
    let j = jit(&Asm::new().ldx(BPF_DW, 0, 1, 0).exit().build());
    assert_eq!(run(&j, 0, 0), Err(VmError::Fault { pc: 0, addr: 0 }));
    let status = in_child(|| {
        // SAFETY: deliberately faulting in the child.
        unsafe { std::ptr::read_volatile(8 as *const u8) };
    });
    assert!(died_of_sigsegv(status), "status {status:#x}");
}

#[test]
fn a_fault_in_a_helper_called_from_jit_code_is_not_contained() {
    let j = jit(&Asm::new().mov(1, 0).call(H_NULL).exit().build());
    let status = in_child(|| {
        let _ = run(&j, 0, 0);
    });
    assert!(died_of_sigsegv(status), "status {status:#x}");
    // The helper with a good pointer, in this process.
    let v = 77u64;
    let j = jit(&Asm::new().call(H_NULL).exit().build());
    assert_eq!(run(&j, &v as *const u64 as u64, 0), Ok(77));
}
