//! The JIT's inline array updates (`Relocator::inline_update`) give what the helper gives, for
//! plain and per-CPU arrays, every flag and index; and its claiming entry
//! (`JitProgram::claim_entry_address`) claims the CPU slot of the CPU the thread runs on, runs
//! with that CPU, gives the slot and the thread's "run in progress" mark back (also after a
//! fault), and runs nothing (`CLAIM_RETRY`) when it cannot claim.

mod common;

use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};

use common::Asm;
use userbpf_isa::*;
use userbpf_vm::jit::{CLAIM_RETRY, SlotClaim};
use userbpf_vm::{Helper, HelperRegistry, InlineArray, JitProgram, LoadOptions, Program, Relocator};

thread_local! {
    /// The CPU the reference helper writes (what the JIT is given).
    static TEST_CPU: Cell<u32> = const { Cell::new(0) };
    /// The claiming entry's thread-local words.
    static ACTIVE: Cell<u8> = const { Cell::new(0) };
    static TID: Cell<u32> = const { Cell::new(0) };
}

/// The reference: an array update as `userbpf_maps::array` does it (checks in its order).
unsafe extern "C" fn update_helper(map: u64, key: u64, value: u64, flags: u64, _: u64) -> u64 {
    // SAFETY: the tests pass a live InlineArray, a 4-byte key and an elem_size-byte value.
    let (a, idx) = unsafe { (&*(map as *const InlineArray), (key as *const u32).read_unaligned()) };
    let err = |e: i32| (-(e as i64)) as u64;
    if (flags & !4) > 2 {
        return err(libc::EINVAL);
    }
    if idx >= a.max_entries {
        return err(libc::E2BIG);
    }
    if flags & 1 != 0 {
        return err(libc::EEXIST);
    }
    if flags & 4 != 0 {
        return err(libc::EINVAL);
    }
    let dst = a.values + idx as u64 * a.elem_size as u64 + TEST_CPU.with(|c| c.get()) as u64 * a.cpu_stride as u64;
    // SAFETY: the element lies in the test's backing memory; the value is elem_size bytes.
    unsafe { std::ptr::copy_nonoverlapping(value as *const u8, dst as *mut u8, a.elem_size as usize) };
    0
}

unsafe extern "C" fn lookup_helper(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    unreachable!("lookups are inlined here")
}

fn registry() -> Arc<HelperRegistry> {
    let mut r = HelperRegistry::new();
    r.register(Helper::new(1, "map_lookup_elem", lookup_helper));
    r.register(Helper::new(2, "map_update_elem", update_helper));
    Arc::new(r)
}

/// `lddw r1, map 0` resolves to the address of `array`; updates (and lookups) are offered for
/// inlining when `inline` is set.
struct One<'a> {
    array: &'a InlineArray,
    inline: bool,
}

impl Relocator for One<'_> {
    fn resolve_lddw(&self, index: usize, src: u8, imm: i32, _: i32) -> Result<u64, String> {
        match (src, imm) {
            (BPF_PSEUDO_MAP_IDX, 0) => Ok(self.array as *const InlineArray as u64),
            _ => Err(format!("instruction {index}: no map {imm}")),
        }
    }
    fn inline_lookup(&self, _: u64) -> Option<InlineArray> {
        self.inline.then_some(*self.array)
    }
    fn inline_update(&self, _: u64) -> Option<InlineArray> {
        self.inline.then_some(*self.array)
    }
}

fn ld_map(a: &mut Asm) {
    a.i(Insn::new(OP_LDDW, 1, BPF_PSEUDO_MAP_IDX, 0, 0));
    a.i(Insn::new(0, 0, 0, 0, 0));
}

/// ctx = [key: u32, pad, flags: u64, value: 2 x u64]; r0 = update(map, &key, &value, flags).
fn update_prog() -> Vec<Insn> {
    let mut a = Asm::new();
    a.ldx(BPF_W, 6, 1, 0).stx(BPF_W, 10, 6, -4);
    a.ldx(BPF_DW, 7, 1, 16).stx(BPF_DW, 10, 7, -24);
    a.ldx(BPF_DW, 7, 1, 24).stx(BPF_DW, 10, 7, -16);
    a.ldx(BPF_DW, 4, 1, 8);
    ld_map(&mut a);
    a.movx(2, 10).add(2, -4).movx(3, 10).add(3, -24).call(2).exit();
    a.build()
}

/// [`update_prog`] with the flags a constant (`r4 = flags` just before the call, which the JIT
/// then checks when compiling).
fn update_prog_const(flags: i32) -> Vec<Insn> {
    let mut a = Asm::new();
    a.ldx(BPF_W, 6, 1, 0).stx(BPF_W, 10, 6, -4);
    a.ldx(BPF_DW, 7, 1, 16).stx(BPF_DW, 10, 7, -24);
    a.ldx(BPF_DW, 7, 1, 24).stx(BPF_DW, 10, 7, -16);
    ld_map(&mut a);
    a.movx(2, 10).add(2, -4).movx(3, 10).add(3, -24).mov(4, flags).call(2).exit();
    a.build()
}

fn jit(insns: &[Insn], array: &InlineArray, inline: bool) -> JitProgram {
    let opts = LoadOptions { helpers: registry(), ..Default::default() };
    let p = Program::load(insns, &opts, Some(&One { array, inline })).unwrap_or_else(|e| panic!("load: {e}"));
    assert_eq!(p.inline_updates().len() + p.inline_lookups().len(), usize::from(inline), "inlined sites");
    JitProgram::compile(Arc::new(p)).expect("compile")
}

#[test]
fn inline_updates_match_the_helper() {
    for cpu_stride in [0u32, 4 * 16] {
        let mut inl = vec![0u64; 32];
        let mut ref_ = vec![0u64; 32];
        let a_inl = InlineArray { values: inl.as_mut_ptr() as u64, max_entries: 4, elem_size: 16, cpu_stride };
        let a_ref = InlineArray { values: ref_.as_mut_ptr() as u64, ..a_inl };
        let (ji, jr) = (jit(&update_prog(), &a_inl, true), jit(&update_prog(), &a_ref, false));
        assert_eq!(ji.needs_context(), cpu_stride != 0, "a per-CPU update needs the CPU");
        let mut n = 1u64;
        for cpu in [0u32, 1] {
            TEST_CPU.with(|c| c.set(cpu));
            for key in [0u32, 3, 4, u32::MAX] {
                for flags in [0u64, 1, 2, 3, 4, 5, 6, 8, 1 << 40] {
                    n += 1;
                    let mut ctx = [0u64; 4];
                    ctx[0] = key as u64;
                    ctx[1] = flags;
                    ctx[2] = n;
                    ctx[3] = !n;
                    let r1 = ctx.as_mut_ptr() as u64;
                    // SAFETY: the programs read their 32-byte context and stack and write the
                    // elements of the backing vectors (keys checked, CPU below 2).
                    let (i, r) = unsafe { (ji.run_on_cpu(r1, 32, cpu), jr.run_on_cpu(r1, 32, cpu)) };
                    let what = format!("stride {cpu_stride} cpu {cpu} key {key} flags {flags:#x}");
                    assert_eq!(i, r, "{what}");
                    assert_eq!(inl, ref_, "{what}: memory");
                }
            }
        }
        assert!(inl.iter().any(|&v| v != 0), "something was written");
    }
}

#[test]
fn inline_updates_with_constant_flags_match_the_helper() {
    for flags in [0i32, 1, 2, 3, 4, 8, -1] {
        let mut inl = vec![0u64; 32];
        let mut ref_ = vec![0u64; 32];
        let a_inl = InlineArray { values: inl.as_mut_ptr() as u64, max_entries: 4, elem_size: 16, cpu_stride: 64 };
        let a_ref = InlineArray { values: ref_.as_mut_ptr() as u64, ..a_inl };
        let p = update_prog_const(flags);
        let (ji, jr) = (jit(&p, &a_inl, true), jit(&p, &a_ref, false));
        for (n, key) in [0u32, 3, 4, u32::MAX].into_iter().enumerate() {
            TEST_CPU.with(|c| c.set(n as u32 % 2));
            let mut ctx = [key as u64, 0, n as u64 + 7, !(n as u64)];
            let r1 = ctx.as_mut_ptr() as u64;
            // SAFETY: as in inline_updates_match_the_helper.
            let (i, r) = unsafe { (ji.run_on_cpu(r1, 32, n as u32 % 2), jr.run_on_cpu(r1, 32, n as u32 % 2)) };
            assert_eq!(i, r, "flags {flags} key {key}");
            assert_eq!(inl, ref_, "flags {flags} key {key}: memory");
        }
    }
}

/// The thread-local words' offsets from the thread pointer.
fn tls_offset(p: *const u8) -> i64 {
    let fs0: usize;
    // SAFETY: reads the thread pointer (fs:[0], the TCB's self pointer).
    unsafe { std::arch::asm!("mov {}, qword ptr fs:[0]", out(reg) fs0, options(nostack, readonly, preserves_flags)) };
    p as i64 - fs0 as i64
}

fn rseq_offset() -> Option<i64> {
    // SAFETY: dlsym of glibc's constants; read once they are found.
    unsafe {
        let off = libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_offset".as_ptr());
        let size = libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_size".as_ptr());
        if off.is_null() || size.is_null() || (size as *const u32).read() < 8 {
            return None;
        }
        Some((off as *const isize).read() as i64)
    }
}

#[test]
fn the_claiming_entry_claims_runs_and_gives_back() {
    let Some(rseq) = rseq_offset() else {
        panic!("glibc registers no rseq area here: the claiming entry cannot be tested");
    };
    // Stay on one CPU: the slot the entry claims is that CPU's.
    // SAFETY: sched_getcpu has no preconditions; a zeroed cpu_set_t with that CPU set.
    let cpu = unsafe {
        let cpu = libc::sched_getcpu().max(0) as usize;
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        assert_eq!(libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set), 0);
        cpu
    };
    let nr = (cpu as u32 + 1).max(4);
    // 64-byte slots, their first word the owner (written by the JIT code: atomics here).
    let slots: Vec<[AtomicU32; 16]> = (0..nr).map(|_| std::array::from_fn(|_| AtomicU32::new(0))).collect();
    let word = |i: usize| slots[i][0].load(SeqCst);
    let array = InlineArray { values: 0x7000_0000, max_entries: 4, elem_size: 16, cpu_stride: 0x1000 };
    // r0 = lookup(map, &ctx[0]) (per-CPU, inlined); a null ctx faults.
    let mut a = Asm::new();
    a.ldx(BPF_W, 6, 1, 0).stx(BPF_W, 10, 6, -4);
    ld_map(&mut a);
    a.movx(2, 10).add(2, -4).call(1).exit();
    let j = jit(&a.build(), &array, true);
    let entry = j.claim_entry_address().expect("no helper called: a claiming entry");
    // SAFETY: the claiming entry's signature (JitProgram::claim_entry_address).
    let f: unsafe extern "C" fn(u64, *const SlotClaim, *mut [u64; 3]) -> u64 = unsafe { std::mem::transmute(entry) };
    let claim = SlotClaim {
        slots: slots.as_ptr() as u64,
        nr,
        have_rseq: 1,
        rseq_cpu: rseq + 4,
        active: tls_offset(ACTIVE.with(|c| c.as_ptr())),
        tid: tls_offset(TID.with(|c| c.as_ptr()).cast()),
    };
    let run = |claim: &SlotClaim, key: u32| {
        let mut ctx = key.to_ne_bytes();
        let mut rec = [0u64; 3];
        // SAFETY: the program reads its 4-byte context (or faults on null, contained).
        let r0 = unsafe { f(if key == u32::MAX { 0 } else { ctx.as_mut_ptr() as u64 }, claim, &mut rec) };
        (r0, rec[0])
    };
    // The thread's id not known: nothing runs.
    assert_eq!(run(&claim, 1), (0, CLAIM_RETRY));
    TID.with(|t| t.set(4242));
    // No rseq: nothing runs.
    assert_eq!(run(&SlotClaim { have_rseq: 0, ..claim }, 1), (0, CLAIM_RETRY));
    // A run in progress on the thread: nothing runs.
    ACTIVE.with(|c| c.set(1));
    assert_eq!(run(&claim, 1), (0, CLAIM_RETRY));
    ACTIVE.with(|c| c.set(0));
    // The slot held by another thread: nothing runs, the slot stays its.
    slots[cpu][0].store(99, SeqCst);
    assert_eq!(run(&claim, 1), (0, CLAIM_RETRY));
    assert_eq!(word(cpu), 99);
    slots[cpu][0].store(0, SeqCst);
    // Claimed: runs with this CPU, then everything is given back.
    for key in [0u32, 3] {
        assert_eq!(run(&claim, key), (array.values + key as u64 * 16 + cpu as u64 * 0x1000, 0));
        assert!((0..nr as usize).all(|i| word(i) == 0), "slots given back");
        assert_eq!(ACTIVE.with(|c| c.get()), 0, "run mark cleared");
    }
    // A fault ends the run; the slot and the mark are given back too.
    let (_, kind) = run(&claim, u32::MAX);
    assert!(kind != 0 && kind != CLAIM_RETRY, "an abort is recorded: {kind}");
    assert!((0..nr as usize).all(|i| word(i) == 0), "slots given back after a fault");
    assert_eq!(ACTIVE.with(|c| c.get()), 0, "run mark cleared after a fault");
}

/// The claiming entry of a program compiled with the process's claim (`compile_claiming`):
/// the same behaviour with the claim's words taken as constants, the `SlotClaim` argument
/// unread (a zeroed one is passed), and a claim without rseq compiled in: nothing runs.
#[test]
fn the_claiming_entry_compiled_with_its_claim_claims_runs_and_gives_back() {
    let Some(rseq) = rseq_offset() else {
        panic!("glibc registers no rseq area here: the claiming entry cannot be tested");
    };
    // SAFETY: as in the test above.
    let cpu = unsafe {
        let cpu = libc::sched_getcpu().max(0) as usize;
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        assert_eq!(libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set), 0);
        cpu
    };
    let nr = (cpu as u32 + 1).max(4);
    let slots: Vec<[AtomicU32; 16]> = (0..nr).map(|_| std::array::from_fn(|_| AtomicU32::new(0))).collect();
    let word = |i: usize| slots[i][0].load(SeqCst);
    let array = InlineArray { values: 0x7000_0000, max_entries: 4, elem_size: 16, cpu_stride: 0x1000 };
    let mut a = Asm::new();
    a.ldx(BPF_W, 6, 1, 0).stx(BPF_W, 10, 6, -4);
    ld_map(&mut a);
    a.movx(2, 10).add(2, -4).call(1).exit();
    let insns = a.build();
    let claim = SlotClaim {
        slots: slots.as_ptr() as u64,
        nr,
        have_rseq: 1,
        rseq_cpu: rseq + 4,
        active: tls_offset(ACTIVE.with(|c| c.as_ptr())),
        tid: tls_offset(TID.with(|c| c.as_ptr()).cast()),
    };
    let compiled = |claim: SlotClaim| {
        let opts = LoadOptions { helpers: registry(), ..Default::default() };
        let p = Program::load(&insns, &opts, Some(&One { array: &array, inline: true })).expect("load");
        JitProgram::compile_claiming(Arc::new(p), claim).expect("compile")
    };
    let (j, no_rseq) = (compiled(claim), compiled(SlotClaim { have_rseq: 0, ..claim }));
    let entry = |j: &JitProgram| {
        let e = j.claim_entry_address().expect("a claiming entry");
        // SAFETY: the claiming entry's signature (JitProgram::claim_entry_address).
        unsafe { std::mem::transmute::<usize, unsafe extern "C" fn(u64, *const SlotClaim, *mut [u64; 3]) -> u64>(e) }
    };
    let unread = SlotClaim::default();
    let run = |j: &JitProgram, key: u32| {
        let mut ctx = key.to_ne_bytes();
        let mut rec = [0u64; 3];
        // SAFETY: the program reads its 4-byte context (or faults on null, contained); the
        // entry reads no SlotClaim.
        let r0 = unsafe { entry(j)(if key == u32::MAX { 0 } else { ctx.as_mut_ptr() as u64 }, &unread, &mut rec) };
        (r0, rec[0])
    };
    TID.with(|t| t.set(0));
    assert_eq!(run(&j, 1), (0, CLAIM_RETRY), "the thread's id not known");
    TID.with(|t| t.set(4242));
    assert_eq!(run(&no_rseq, 1), (0, CLAIM_RETRY), "no rseq");
    ACTIVE.with(|c| c.set(1));
    assert_eq!(run(&j, 1), (0, CLAIM_RETRY), "a run in progress");
    ACTIVE.with(|c| c.set(0));
    slots[cpu][0].store(99, SeqCst);
    assert_eq!(run(&j, 1), (0, CLAIM_RETRY), "the slot held by another thread");
    assert_eq!(word(cpu), 99);
    slots[cpu][0].store(0, SeqCst);
    for key in [0u32, 3] {
        assert_eq!(run(&j, key), (array.values + key as u64 * 16 + cpu as u64 * 0x1000, 0));
        assert!((0..nr as usize).all(|i| word(i) == 0), "slots given back");
        assert_eq!(ACTIVE.with(|c| c.get()), 0, "run mark cleared");
    }
    let (_, kind) = run(&j, u32::MAX);
    assert!(kind != 0 && kind != CLAIM_RETRY, "an abort is recorded: {kind}");
    assert!((0..nr as usize).all(|i| word(i) == 0), "slots given back after a fault");
    assert_eq!(ACTIVE.with(|c| c.get()), 0, "run mark cleared after a fault");
}

/// A claimed run of a program compiled with its claim runs subprogram 0 as its own copy, in
/// the entry's frame (`claim_const`): branches, the stack, a bpf-to-bpf call and every exit
/// give what the program computes, the slot and the mark are given back on every way out,
/// and a fault names the instruction of the copy that faulted.
#[test]
fn the_claiming_entrys_copy_of_the_program_runs_it_whole() {
    let Some(rseq) = rseq_offset() else {
        panic!("glibc registers no rseq area here: the claiming entry cannot be tested");
    };
    let nr = 1024;
    let slots: Vec<[AtomicU32; 16]> = (0..nr).map(|_| std::array::from_fn(|_| AtomicU32::new(0))).collect();
    let mut a = Asm::new();
    // r6 = ctx[0]; stack[-8] = r6; if r6 > 5: r0 = r6 * 3 (via the stack), exit;
    // if r6 == 2: r0 = *(u64 *)0 (a fault); else r0 = sub(r6) + 1, exit.
    a.ldx(BPF_W, 6, 1, 0).stx(BPF_DW, 10, 6, -8);
    a.jmp(BPF_JGT, 6, 5, "big");
    a.jmp(BPF_JEQ, 6, 2, "fault");
    a.movx(1, 6).call_fn("sub").add(0, 1).exit();
    a.label("big").ldx(BPF_DW, 0, 10, -8).alu(BPF_MUL, 0, 3).exit();
    a.label("fault").mov(7, 0).ldx(BPF_DW, 0, 7, 0).exit();
    a.label("sub").movx(0, 1).alu(BPF_LSH, 0, 2).exit();
    let insns = a.build();
    let fault_pc = a.at("fault") + 1;
    TID.with(|t| t.set(4242));
    ACTIVE.with(|c| c.set(0));
    let claim = SlotClaim {
        slots: slots.as_ptr() as u64,
        nr,
        have_rseq: 1,
        rseq_cpu: rseq + 4,
        active: tls_offset(ACTIVE.with(|c| c.as_ptr())),
        tid: tls_offset(TID.with(|c| c.as_ptr()).cast()),
    };
    let opts = LoadOptions { helpers: registry(), ..Default::default() };
    let p = Program::load(&insns, &opts, None).expect("load");
    let j = JitProgram::compile_claiming(Arc::new(p), claim).expect("compile");
    let e = j.claim_entry_address().expect("a claiming entry");
    // SAFETY: the claiming entry's signature (JitProgram::claim_entry_address).
    let entry =
        unsafe { std::mem::transmute::<usize, unsafe extern "C" fn(u64, *const SlotClaim, *mut [u64; 3]) -> u64>(e) };
    for key in 0u32..10 {
        let mut ctx = key.to_ne_bytes();
        let mut rec = [0u64; 3];
        // SAFETY: the program reads its 4-byte context; its fault is contained.
        let r0 = unsafe { entry(ctx.as_mut_ptr() as u64, &SlotClaim::default(), &mut rec) };
        if key == 2 {
            assert_eq!((rec[0] != 0 && rec[0] != CLAIM_RETRY, rec[1], rec[2]), (true, fault_pc as u64, 0), "fault");
        } else {
            let want = if key > 5 { key as u64 * 3 } else { ((key as u64) << 2) + 1 };
            assert_eq!((r0, rec[0]), (want, 0), "key {key}");
        }
        assert!((0..nr as usize).all(|i| slots[i][0].load(SeqCst) == 0), "slots given back");
        assert_eq!(ACTIVE.with(|c| c.get()), 0, "run mark cleared");
    }
}
