//! x86-64 code generation (iced-x86's assembler): the shared entry and return stubs and
//! the per-site stub. The displaced instructions they jump to are moved by [`crate::relocate`].
//!
//! ## Entry path
//! ```text
//! target:        jmp rel32 site_stub                      (5 bytes, patched)
//! site_stub:     jmp [rip+switch]         ; the site's switch word: `shared` below, or the
//!                                         ; stub generated for the site (see below)
//! shared:        lea rsp,[rsp-128]        ; step over the red zone (probes inside functions)
//!                push qword [rip+site]    ; the Site*
//!                call qword [rip+common]  ; common_full or common_light (function entries)
//!                lea rsp,[rsp+136]        ; normal resume: drop Site* + red zone
//!                jc planted               ; (function entries) CF: a return probe was planted
//!                jmp relocated
//! planted:       jo ret_now               ; CF and OF: the function is skipped (an override)
//!                lea rsp,[rsp+8]          ; drop the return address (in the shadow stack)
//!                call relocated           ; the landing's address takes its slot
//! landing:       jmp [rip+ret_tramp]      ; the function returned here
//! ret_now:       ret                      ; to the caller (predicted)
//! relocated:     <displaced instructions, relocated>
//!                jmp target+len
//! common_entry:  lea rsp,[rsp-168]        ; struct pt_regs at rsp, ret addr at +168, Site* at +176
//!                mov [rsp+off], reg  x15  ; every GPR but rsp
//!                flags -> [rsp+144]       ; pushfq (full), else rebuilt with lahf/seto
//!                                           (the status flags are dead at entries/returns)
//!                rbx = regs ; and rsp,-64 ; save FP state (full xsave64/fxsave64,
//!                                           or light: see FpSave)
//!                rdi = Site*, rsi = regs
//!                call entry_dispatch      ; -> rax = resume address, rdx = mode
//!                restore FP state ; rsp = rbx
//!                mode 0: restore GPRs (+flags when full) ; lea rsp,[rsp+168] ; ret
//!                        (back into the site stub: predicted by the return-stack buffer)
//!                mode 2: [rsp+176] = rax ; restore (flags when full +) GPRs ; lea rsp,[rsp+176] ; ret 128
//!                        (a handler changed ip; light stubs, when the code there is a bare
//!                        `ret`: restore GPRs, CF and OF set, ret into the site stub's ret_now)
//!                mode 1: restore (flags when full +) GPRs ; lea rsp,[rsp+312] ; ret   (skip the function:
//!                        return to the caller with the handler-set ax)
//! ```
//! The light stub first tries the lean path (`lean_entry_path`: the site's only probe has
//! a `LeanHandler`, called directly with no FP save inside an RCU section; a handler that
//! calls out gets the live vector registers kept, `lean_call_out`, and the recursion guard
//! held; one that keeps the vector registers itself, `LEAN_GUARD_ONLY`, the guard alone) and the return-only fast path (`ret_only_fast_path`). The return trampoline has a
//! lean path too (`lean_ret_path`). A lean handler may hand the hit to the general path
//! (`LEAN_RETRY`).
//!
//! ## Generated stubs
//! A function entry whose only probe is an entry probe with a [`crate::LeanHandler`] that
//! reads at most the registers, changes no `ip` and calls out not at all (or keeps the vector
//! registers itself, [`crate::LEAN_GUARD_ONLY`]), with no return probe, gets a stub of its own
//! ([`fast_stub`], made when the site's probes change, in a page of its own), and the site's
//! switch word points at it. It does what the lean path of the shared light stub does for that
//! handler with the handler's properties built in: no `Site*` pushed and no call into a shared
//! stub, no checks of the handler, its `reads_all`, `calls_out` or the site's return probes,
//! a direct call of the handler, and only the registers a call may change (and the
//! callee-saved ones the program reads, `LeanHandler::regs_read`) stored and restored (the
//! handler keeps the others: it follows the C calling convention). It keeps the statistics
//! gate's byte compare, the RCU read-side section, the recursion guard and "ours" state, the
//! failure record and the retry. Whenever the site's probes change (`publish`, under the
//! registry lock) the switch word is set to the new target before `publish` waits for the
//! read-side sections, and a generated stub checks inside its section that the switch still
//! holds its own address (else the shared path): so no handler runs after its `detach`
//! returned, as on the shared paths. Generated stubs, like site pages, are never freed (a
//! thread may still be inside one); a site keeps the ones it made, by handler, and reuses them.
//!
//! ## Return path
//! `ret_tramp` is reached from a site stub's landing, where the probed function's `ret`
//! came back (the stub called the function's relocated start, so the return-stack buffer
//! predicts that return): it builds a pt_regs the same way (slot for the real return
//! address at rsp+168), calls `ret_dispatch` which pops the shadow stack and runs the return
//! handlers, then `ret`s to the original return address, which the return-stack buffer
//! predicts too (the caller's entry is back on top). With `USERBPF_HOOK_FULL_FPSAVE=1` the
//! entry path writes the trampoline's address over the return address instead (no CF
//! signal from the full stub, whose `popfq` restores the flags).

use iced_x86::code_asm::*;

/// Offsets inside `struct pt_regs`.
pub(crate) const REG_OFFSETS: [(AsmRegister64, i32); 15] = [
    (r15, 0),
    (r14, 8),
    (r13, 16),
    (r12, 24),
    (rbp, 32),
    (rbx, 40),
    (r11, 48),
    (r10, 56),
    (r9, 64),
    (r8, 72),
    (rax, 80),
    (rcx, 88),
    (rdx, 96),
    (rsi, 104),
    (rdi, 112),
];
pub(crate) const FLAGS_OFF: i32 = 144;
pub(crate) const PT_REGS_SIZE: i32 = 168;
/// Distance from the pt_regs of the entry path to the probed rsp:
/// pt_regs, the return address into the site stub, the Site*, the red zone.
pub(crate) const ENTRY_FRAME: usize = 168 + 8 + 8 + 128;

/// How the FP/vector state is saved around handlers.
///
/// ## Which state must be saved (the "light" save)
/// Handlers are compiled Rust and libc (memcpy & co. use SSE/AVX/AVX-512),
/// so any vector register, MXCSR and the x87 state may be clobbered by them;
/// whatever is live at the probe must be saved. What is live depends on where
/// the probe is:
///
/// * **Inside a function** (`!is_entry`): anything may be live. Full
///   `xsave64`/`xrstor64` of every XCR0-enabled component (or `fxsave64`).
/// * **At a function entry**: by the System V x86-64 ABI every vector
///   register (xmm/ymm/zmm 0-31), the opmask registers and the x87 stack
///   are caller-saved (dead at the call) *except* the argument registers
///   xmm0-7 (at full width: `__m256`/`__m512` arguments travel in ymm/zmm
///   0-7); MXCSR control bits and the x87 control word are callee-saved.
///   So the light save stores zmm0-7 (AVX-512 enabled in XCR0), else
///   ymm0-7 (AVX enabled), else xmm0-7, plus MXCSR and the x87 control word.
/// * **At a function return** (the return trampoline): only the return
///   registers carry values: rax/rdx (saved with every GPR), xmm0/xmm1 at
///   full width (ymm0/zmm0 for `__m256`/`__m512` returns), st0/st1 (long
///   double / complex long double), plus the callee-saved MXCSR and x87
///   control word. The light save stores vector registers 0-1 (same width
///   rule), MXCSR and the control word.
///
/// x87: the ABI requires an empty x87 stack at a call, except for return
/// values at a return, and the handler (compiled code) assumes an empty
/// stack. The light save reads the status word (`fnstsw`, non-waiting):
/// when TOP != 0 the stack is not empty (a long double return value, or
/// non-ABI code) and the whole x87 environment and stack are saved with
/// `fnsave` (which also empties the stack for the handler) and restored
/// with `frstor`. TOP == 0 with a non-empty stack would mean eight values
/// pushed, impossible at an ABI boundary.
///
/// Caveat: the entry rule assumes every caller obeys the ABI at the call.
/// Inter-procedural register allocation (GCC `-fipa-ra`, on by default at
/// -O2, for callees that bind locally) lets a caller keep values in
/// caller-saved vector registers across a call to a callee known not to
/// touch them. Probing such a callee with a handler that clobbers those
/// registers would corrupt the caller. Set `USERBPF_HOOK_FULL_FPSAVE=1`
/// (read once at initialisation) to use the full save at every site.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FpSave {
    pub xsave: bool,
    /// bytes, multiple of 64
    pub size: i32,
    /// XCR0 enables AVX (ymm upper halves).
    pub avx: bool,
    /// XCR0 enables AVX-512 (opmask, ZMM_Hi256, Hi16_ZMM).
    pub avx512: bool,
    /// `xgetbv` with ecx = 1 (XINUSE) is supported: the light save asks whether the upper
    /// halves of the vector registers are in use (see [`fp_save`]).
    pub xinuse: bool,
}

pub(crate) fn detect_fpsave() -> FpSave {
    let l1 = core::arch::x86_64::__cpuid(1);
    let osxsave = l1.ecx & (1 << 27) != 0;
    if osxsave {
        let (lo, _hi): (u32, u32);
        // SAFETY: OSXSAVE is set, so xgetbv(0) (read XCR0) is allowed in user mode.
        unsafe {
            core::arch::asm!("xgetbv", in("ecx") 0u32, out("eax") lo, out("edx") _hi,
                options(nomem, nostack, preserves_flags))
        };
        let avx = lo & 0b110 == 0b110;
        let avx512 = avx && lo & 0xE0 == 0xE0;
        // Leaf 0xD exists when OSXSAVE is set; ebx = size for the enabled XCR0.
        let d = core::arch::x86_64::__cpuid_count(0xD, 0);
        let size = (d.ebx as i32).max(576);
        let xinuse = core::arch::x86_64::__cpuid_count(0xD, 1).eax & (1 << 2) != 0;
        return FpSave { xsave: true, size: (size + 63) & !63, avx, avx512, xinuse };
    }
    FpSave { xsave: false, size: 512, avx: false, avx512: false, xinuse: false }
}

/// Which part of the FP state a stub saves (see [`FpSave`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SaveKind {
    /// Everything (xsave64 / fxsave64).
    Full,
    /// Vector registers 0..n, MXCSR, x87 control word (+ x87 stack if not empty).
    Light(usize),
}

/// Stores every GPR but rsp and the flags into the pt_regs at rsp.
///
/// `exact` (the full stubs, whose flags are restored with `popfq`): the flags by `pushfq`.
/// Otherwise (function entries and returns, where the ABI leaves DF clear and the status
/// flags dead, and nothing restores them): the same value rebuilt from `lahf`/`seto` (the
/// status flags, IF and the reserved bit 1). `pushfq` measured ~10 ns a hit on this
/// project's (virtualised) machine, against a fraction of a nanosecond for these.
fn save_gprs_f(a: &mut CodeAssembler, exact: bool) -> Result<(), IcedError> {
    for (r, off) in REG_OFFSETS {
        a.mov(qword_ptr(rsp + off), r)?;
    }
    if exact {
        a.pushfq()?;
        a.pop(qword_ptr(rsp + FLAGS_OFF))?;
    } else {
        // rax and rcx are saved above. lahf: AH = SF ZF 0 AF 0 PF 1 CF.
        a.lahf()?;
        a.seto(al)?;
        a.movzx(ecx, al)?;
        a.shl(ecx, 11)?;
        a.shr(eax, 8)?;
        a.and(eax, 0xD5)?;
        a.or(eax, ecx)?;
        a.or(eax, 0x202)?;
        a.mov(qword_ptr(rsp + FLAGS_OFF), rax)?;
    }
    Ok(())
}

/// `flags`: also restore rflags (popfq, ~20 cycles). Light stubs skip it on
/// their common path: at a function entry or return the status flags are
/// dead by the ABI, DF is clear before and after (the handlers are ABI code)
/// and the stub touches no other flag; a handler's change of `regs.flags`
/// is then not applied.
fn restore_gprs_f(a: &mut CodeAssembler, flags: bool) -> Result<(), IcedError> {
    if flags {
        a.push(qword_ptr(rsp + FLAGS_OFF))?;
        a.popfq()?;
    }
    for (r, off) in REG_OFFSETS {
        a.mov(r, qword_ptr(rsp + off))?;
    }
    Ok(())
}

const XMMS: [AsmRegisterXmm; 8] = [xmm0, xmm1, xmm2, xmm3, xmm4, xmm5, xmm6, xmm7];
const YMMS: [AsmRegisterYmm; 8] = [ymm0, ymm1, ymm2, ymm3, ymm4, ymm5, ymm6, ymm7];
const ZMMS: [AsmRegisterZmm; 8] = [zmm0, zmm1, zmm2, zmm3, zmm4, zmm5, zmm6, zmm7];

/// Light save area layout (from the 64-aligned rsp): vectors at 64*i,
/// then MXCSR, FCW, an x87 flag byte, then the fnsave area.
const L_MXCSR: i32 = 512;
const L_FCW: i32 = 516;
const L_WIDE: i32 = 520;
const L_X87: i32 = 521;
const L_TMP: i32 = 524;
const L_FNSAVE: i32 = 576;
const L_SIZE: i32 = 576 + 128;

/// XINUSE bits (xgetbv with ecx = 1) of the upper halves of vector registers 0-15: bits
/// 128-255 (YMM_Hi128) and 256-511 (ZMM_Hi256). (Opmasks and registers 16-31 are dead at
/// the places the light save is used.)
const XINUSE_UPPER: i32 = (1 << 2) | (1 << 6);

/// Emits: rbx = rsp (pt_regs); align; save FP state. Clobbers rax/rcx/rdx.
///
/// The light save with AVX first asks XINUSE whether the upper halves are in use. Usually
/// they are not (compiled code ends its AVX parts with `vzeroupper`): then only the xmm
/// registers are saved, with legacy SSE moves, and restored after a `vzeroupper`, which puts
/// the upper halves back in their initial (zero) state whatever the handlers did. Saving and
/// restoring full-width registers instead would leave the upper state *dirty* after every
/// hit, and every legacy SSE instruction of the probed program would then pay for it (an
/// AVX-SSE transition or a false dependency on the upper halves, until its next
/// `vzeroupper`: measured, a quarter of fio's time went to one `pxor` after each probe hit),
/// and 512-bit moves keep the core in its AVX-512 frequency licence.
fn fp_save(a: &mut CodeAssembler, fp: FpSave, kind: SaveKind) -> Result<(), IcedError> {
    a.mov(rbx, rsp)?;
    a.and(rsp, -64)?;
    let n = match kind {
        SaveKind::Light(n) => n,
        SaveKind::Full => {
            a.sub(rsp, fp.size)?;
            if fp.xsave {
                // XRSTOR faults on a non-zero XCOMP_BV / reserved header bytes, and
                // XSAVE does not write them: zero the 64-byte header first.
                a.xor(eax, eax)?;
                for i in 0..8 {
                    a.mov(qword_ptr(rsp + (512 + 8 * i)), rax)?;
                }
                a.mov(eax, -1)?;
                a.mov(edx, -1)?;
                a.xsave64(ptr(rsp))?;
            } else {
                a.fxsave64(ptr(rsp))?;
            }
            return Ok(());
        }
    };
    a.sub(rsp, L_SIZE)?;
    let mut wide = a.create_label();
    let mut saved = a.create_label();
    if fp.xinuse && (fp.avx || fp.avx512) {
        a.mov(ecx, 1)?;
        a.xgetbv()?;
        a.test(eax, XINUSE_UPPER)?;
        a.jnz(wide)?;
        // Packed (16 bytes apart): two cache lines of stack instead of eight.
        for (i, r) in XMMS.iter().take(n).enumerate() {
            a.movdqu(xmmword_ptr(rsp + 16 * i as i32), *r)?;
        }
        a.mov(byte_ptr(rsp + L_WIDE), 0)?;
        a.jmp(saved)?;
    }
    a.set_label(&mut wide)?;
    a.mov(byte_ptr(rsp + L_WIDE), 1)?;
    if fp.avx512 {
        // Always the full zmm width: cheaper than asking XINUSE (xgetbv
        // costs more than the eight wider stores) and exact either way.
        for (i, r) in ZMMS.iter().take(n).enumerate() {
            a.vmovdqu64(zmmword_ptr(rsp + 64 * i as i32), *r)?;
        }
    } else if fp.avx {
        for (i, r) in YMMS.iter().take(n).enumerate() {
            a.vmovdqu(ymmword_ptr(rsp + 64 * i as i32), *r)?;
        }
    } else {
        for (i, r) in XMMS.iter().take(n).enumerate() {
            a.movdqu(xmmword_ptr(rsp + 64 * i as i32), *r)?;
        }
    }
    if fp.avx || fp.avx512 {
        // The handlers are compiled Rust and libc using legacy SSE encodings: with the upper
        // halves of the vector registers dirty, every such instruction pays the AVX-SSE
        // transition (measured: most of a hit). Their upper halves are dead here by the same
        // ABI rule that makes the light save sound (registers 0-n are saved whole above and
        // restored whole below).
        a.vzeroupper()?;
    }
    a.set_label(&mut saved)?;
    a.stmxcsr(dword_ptr(rsp + L_MXCSR))?;
    a.fnstcw(word_ptr(rsp + L_FCW))?;
    let mut empty = a.create_label();
    let mut done = a.create_label();
    a.fnstsw(ax)?;
    a.test(ax, 0x3800)?; // TOP
    a.jz(empty)?;
    a.mov(byte_ptr(rsp + L_X87), 1)?;
    a.fnsave(ptr(rsp + L_FNSAVE))?;
    a.jmp(done)?;
    a.set_label(&mut empty)?;
    a.mov(byte_ptr(rsp + L_X87), 0)?;
    a.set_label(&mut done)?;
    Ok(())
}

/// Restores what `fp_save` saved; rsp = rbx. Clobbers rax/rdx and flags.
fn fp_restore(a: &mut CodeAssembler, fp: FpSave, kind: SaveKind) -> Result<(), IcedError> {
    let n = match kind {
        SaveKind::Light(n) => n,
        SaveKind::Full => {
            if fp.xsave {
                a.mov(eax, -1)?;
                a.mov(edx, -1)?;
                a.xrstor64(ptr(rsp))?;
            } else {
                a.fxrstor64(ptr(rsp))?;
            }
            a.mov(rsp, rbx)?;
            return Ok(());
        }
    };
    restore_x87_and_control_words(a, L_X87, L_FNSAVE, L_TMP, L_FCW, L_MXCSR)?;
    let mut done = a.create_label();
    if fp.xinuse && (fp.avx || fp.avx512) {
        let mut wide = a.create_label();
        a.cmp(byte_ptr(rsp + L_WIDE), 0)?;
        a.jne(wide)?;
        // The upper halves were in their initial state at the save: back to it.
        a.vzeroupper()?;
        for (i, r) in XMMS.iter().take(n).enumerate() {
            a.movdqu(*r, xmmword_ptr(rsp + 16 * i as i32))?;
        }
        a.jmp(done)?;
        a.set_label(&mut wide)?;
    }
    if fp.avx512 {
        for (i, r) in ZMMS.iter().take(n).enumerate() {
            a.vmovdqu64(*r, zmmword_ptr(rsp + 64 * i as i32))?;
        }
    } else if fp.avx {
        for (i, r) in YMMS.iter().take(n).enumerate() {
            a.vmovdqu(*r, ymmword_ptr(rsp + 64 * i as i32))?;
        }
    } else {
        for (i, r) in XMMS.iter().take(n).enumerate() {
            a.movdqu(*r, xmmword_ptr(rsp + 64 * i as i32))?;
        }
    }
    a.set_label(&mut done)?;
    a.mov(rsp, rbx)?;
    Ok(())
}

/// The shared entry stub, assembled for address `ip`. Reached by a `call`
/// from the site stub: [rsp] = return address into the site stub, [rsp+8] =
/// Site*. `entry_dispatch` returns rax = resume address, rdx = mode:
/// 0 = resume at the relocated code (`ret` back into the site stub, which
/// the return-stack buffer predicts), 2 = resume at rax, 1 = skip the function.
pub(crate) fn common_entry(ip: u64, fp: FpSave, kind: SaveKind, dispatch: u64) -> Result<Vec<u8>, IcedError> {
    let mut a = CodeAssembler::new(64)?;
    let mut saved = a.create_label();
    let mut redirect = a.create_label();
    if kind != SaveKind::Full {
        let mut ret_only = a.create_label();
        lean_entry_path(&mut a, fp, &mut saved, &mut redirect, &mut ret_only)?;
        ret_only_fast_path(&mut a)?;
    }
    a.lea(rsp, ptr(rsp - PT_REGS_SIZE))?;
    save_gprs_f(&mut a, kind == SaveKind::Full)?;
    a.set_label(&mut saved)?;
    fp_save(&mut a, fp, kind)?;
    a.mov(rdi, qword_ptr(rbx + (PT_REGS_SIZE + 8)))?;
    a.mov(rsi, rbx)?;
    a.mov(rax, dispatch)?;
    a.call(rax)?;
    a.mov(r12, rax)?;
    a.mov(r13, rdx)?;
    fp_restore(&mut a, fp, kind)?;
    let mut skip = a.create_label();
    a.cmp(r13, 1)?;
    a.je(skip)?;
    a.cmp(r13, 2)?;
    a.je(redirect)?;
    let mut planted = a.create_label();
    if kind != SaveKind::Full {
        a.cmp(r13, 3)?;
        a.je(planted)?;
    }
    restore_gprs_f(&mut a, kind == SaveKind::Full)?;
    a.lea(rsp, ptr(rsp + PT_REGS_SIZE))?;
    if kind != SaveKind::Full {
        // CF tells the site stub whether to call the relocated code (a return probe was
        // planted) or jump to it; the status flags are dead at a function entry.
        a.clc()?;
    }
    a.ret()?; // back into the site stub
    let mut tail = a.create_label();
    if kind != SaveKind::Full {
        a.set_label(&mut planted)?;
        // CF set, OF clear (0 + 1; see `return_now_if_ret`, which enters at `tail` with 0x7f).
        a.mov(byte_ptr(rsp + ORIG_AX_OFF), 0)?;
        a.set_label(&mut tail)?;
        restore_gprs_f(&mut a, false)?;
        a.add(byte_ptr(rsp + ORIG_AX_OFF), 1)?;
        a.lea(rsp, ptr(rsp + PT_REGS_SIZE))?;
        a.stc()?;
        a.ret()?;
    }
    // A changed ip or a skipped function: at a function entry (the light stubs) the status
    // flags are dead and DF is clear, as after the function's own return, so no popfq.
    a.set_label(&mut redirect)?;
    if kind != SaveKind::Full {
        return_now_if_ret(&mut a, tail)?;
    }
    a.mov(qword_ptr(rsp + (PT_REGS_SIZE + 8)), r12)?;
    restore_gprs_f(&mut a, kind == SaveKind::Full)?;
    a.lea(rsp, ptr(rsp + (PT_REGS_SIZE + 8)))?;
    a.ret_1(128)?; // pops the target (rsp = orig-128), then skips the red zone
    a.set_label(&mut skip)?;
    restore_gprs_f(&mut a, kind == SaveKind::Full)?;
    a.lea(rsp, ptr(rsp + ENTRY_FRAME as i32))?;
    a.ret()?;
    a.assemble(ip)
}

/// The light stubs' resume at a changed ip (r12; rsp = pt_regs) when the code there is a bare
/// `ret`, as `bpf_override_return` leaves it (the kernel's `just_return_func`): returning to
/// the caller from the site stub instead makes both returns the ones the return-stack buffer
/// predicts, where `ret 128` to the `ret` is mispredicted (measured: about a quarter of an
/// overridden call). It goes to `tail` (the `planted` path's) with 0x7f in pt_regs' orig_ax
/// byte (dead scratch by then), which the tail's byte add turns into OF: CF and OF set send
/// the site stub's `planted` path straight to a `ret`. Every other return into the site stub
/// with CF set has OF clear. Anything else falls through.
fn return_now_if_ret(a: &mut CodeAssembler, tail: CodeLabel) -> Result<(), IcedError> {
    let mut other = a.create_label();
    a.cmp(byte_ptr(r12), 0xC3)?;
    a.jne(other)?;
    a.mov(byte_ptr(rsp + ORIG_AX_OFF), 0x7f)?;
    a.jmp(tail)?;
    a.set_label(&mut other)?;
    Ok(())
}

/// The start of the light entry stub (function entries, where the status flags are dead): a
/// hit on a site with return handlers and no entry handler only pushes the shadow-stack
/// entry and plants the return trampoline, which this does in a few instructions without
/// saving any state or calling anything. Anything unusual (entry handlers, no return
/// handler, no thread state yet or not in the first slot of its hash, a handler running,
/// no pthread destructor registered yet, a full shadow stack, stale entries to drop) falls
/// through to the general path, which does what `entry_dispatch` does. Clobbers only flags.
///
/// At the start: [rsp] = return address into the site stub, [rsp+8] = Site*, then the
/// 128-byte red-zone gap, then the probed function's return address (its entry rsp).
fn ret_only_fast_path(a: &mut CodeAssembler) -> Result<(), IcedError> {
    use std::mem::offset_of;
    let t = crate::thread::table_layout();
    let has_entry = offset_of!(crate::Site, has_entry) as i32;
    let has_ret = offset_of!(crate::Site, has_ret) as i32;
    // After the four pushes below.
    const SITE: i32 = 32 + 8;
    const FN_SP: i32 = 32 + 8 + 8 + 128;
    let mut slow = a.create_label();
    a.push(rax)?;
    a.push(rcx)?;
    a.push(rdx)?;
    a.push(rsi)?;
    let mut entry_done = a.create_label();
    a.mov(rax, qword_ptr(rsp + SITE))?;
    // A tagged Site* (low bit set, by the lean entry path): the entry handlers already ran.
    a.test(al, 1)?;
    a.jnz(entry_done)?;
    a.cmp(byte_ptr(rax + has_entry), 0)?;
    a.jne(slow)?;
    a.set_label(&mut entry_done)?;
    a.and(rax, -2)?;
    a.cmp(byte_ptr(rax + has_ret), 0)?;
    a.je(slow)?;
    // The thread's state: the first slot of hash(fs:[0]) (thread::current).
    thread_slot(a, rsi, slow)?;
    a.mov(rsi, qword_ptr(rsi + t.state))?;
    a.test(rsi, rsi)?;
    a.jz(slow)?;
    plant_return(
        a,
        FN_SP,
        |a| {
            a.mov(rdx, qword_ptr(rsp + SITE))?;
            a.and(rdx, -2)
        },
        |a| {
            a.pop(rsi)?;
            a.pop(rdx)?;
            a.pop(rcx)?;
            a.pop(rax)
        },
        slow,
    )?;
    a.set_label(&mut slow)?;
    a.pop(rsi)?;
    a.pop(rdx)?;
    a.pop(rcx)?;
    a.pop(rax)?;
    Ok(())
}

const ORIG_AX_OFF: i32 = 120;
const IP_OFF: i32 = 128;
const CS_OFF: i32 = 136;
const SP_OFF: i32 = 152;
const SS_OFF: i32 = 160;

/// `slot` = this thread's slot in the thread table: the slot its static-TLS hint names
/// (`thread::slot_hint`) when that slot's key is this thread's (one load and a compare), else
/// the first slot of hash(fs:[0]), as `thread::current` finds it; jumps to `fail` when that
/// slot is another thread's too. Clobbers rcx, rdx, flags (and `slot`).
fn thread_slot(a: &mut CodeAssembler, slot: AsmRegister64, fail: CodeLabel) -> Result<(), IcedError> {
    let t = crate::thread::table_layout();
    let mut hashed = a.create_label();
    let mut found = a.create_label();
    a.mov(slot, qword_ptr(crate::thread::slot_hint_tls_offset() as i64 as u64).fs())?;
    a.mov(rcx, qword_ptr(0u64).fs())?;
    a.test(slot, slot)?;
    a.jz(hashed)?;
    a.cmp(qword_ptr(slot + t.key), rcx)?;
    a.je(found)?;
    a.set_label(&mut hashed)?;
    a.mov(rdx, rcx)?;
    a.shr(rdx, 6)?;
    a.mov(slot, t.mul)?;
    a.imul_2(rdx, slot)?;
    a.shr(rdx, t.shift)?;
    a.and(edx, t.mask)?;
    a.imul_3(rdx, rdx, t.slot_size)?;
    a.mov(slot, t.table)?;
    a.add(slot, rdx)?;
    a.cmp(qword_ptr(slot + t.key), rcx)?;
    a.jne(fail)?;
    a.set_label(&mut found)?;
    Ok(())
}

/// Starts an RCU read-side section for the lean paths, as `thread::read_lock` does:
/// r12 = the thread's table slot (the first of its hash), r13 = the odd generation announced.
/// Jumps to `fail` (nothing announced) when the thread has no slot there or is already inside
/// a section (a hit in a signal handler that interrupted a handler: the general path then
/// counts it as missed). Clobbers rax, rcx, rdx, flags.
fn lean_rcu_enter(a: &mut CodeAssembler, fail: CodeLabel) -> Result<(), IcedError> {
    let t = crate::thread::table_layout();
    let mut plain = a.create_label();
    let mut done = a.create_label();
    thread_slot(a, r12, fail)?;
    a.mov(r13, qword_ptr(r12 + t.rcu))?;
    a.test(r13b, 1)?;
    a.jnz(fail)?;
    a.add(r13, 1)?;
    a.mov(rax, t.asym)?;
    a.cmp(byte_ptr(rax), 0)?;
    a.jne(plain)?;
    a.mov(rax, r13)?;
    a.xchg(qword_ptr(r12 + t.rcu), rax)?;
    a.jmp(done)?;
    // Asymmetric fences: the writer's membarrier orders this store before the loads below.
    a.set_label(&mut plain)?;
    a.mov(qword_ptr(r12 + t.rcu), r13)?;
    a.set_label(&mut done)?;
    Ok(())
}

/// Ends the section of [`lean_rcu_enter`] (a release store). Clobbers rax.
fn lean_rcu_exit(a: &mut CodeAssembler) -> Result<(), IcedError> {
    let t = crate::thread::table_layout();
    a.lea(rax, ptr(r13 + 1))?;
    a.mov(qword_ptr(r12 + t.rcu), rax)?;
    Ok(())
}

/// Calls the lean handler at r14 on the pt_regs at rsp (16-byte aligned stack, a zeroed
/// failure record), counts a failure; rsp is back at the pt_regs after. A handler that ran
/// nothing and asks for the general path ([`crate::LEAN_RETRY`] in the record) jumps to
/// `retry` instead (rsp at the pt_regs). Clobbers every caller-saved register and rbx.
fn lean_call(a: &mut CodeAssembler, retry: CodeLabel) -> Result<(), IcedError> {
    use std::mem::offset_of;
    let func = offset_of!(crate::LeanHandler, func) as i32;
    let arg = offset_of!(crate::LeanHandler, arg) as i32;
    let failures = offset_of!(crate::LeanHandler, failures) as i32;
    let mut ok = a.create_label();
    a.mov(rbx, rsp)?;
    a.and(rsp, -16)?;
    a.sub(rsp, 32)?;
    a.mov(qword_ptr(rsp), 0)?;
    a.mov(rdi, rbx)?;
    a.mov(rsi, qword_ptr(r14 + arg))?;
    a.mov(rdx, rsp)?;
    a.call(qword_ptr(r14 + func))?;
    a.cmp(qword_ptr(rsp), 0)?;
    a.je(ok)?;
    let mut failed = a.create_label();
    a.cmp(qword_ptr(rsp), -1)?;
    a.jne(failed)?;
    a.mov(rsp, rbx)?;
    a.jmp(retry)?;
    a.set_label(&mut failed)?;
    a.mov(rax, qword_ptr(r14 + failures))?;
    a.lock().inc(qword_ptr(rax))?;
    a.set_label(&mut ok)?;
    a.mov(rsp, rbx)?;
    Ok(())
}

/// Calls the lean handler at r14 as [`lean_call`] does, for a handler that calls out
/// (`LeanHandler::calls_out`): vector registers 0..n (those the System V ABI lets be live at a
/// function entry, n = 8, or return, n = 2) are kept at their full width around the call.
///
/// Without `xgetbv` (XINUSE measured ~12 ns a hit on this project's virtualised machine):
/// the upper halves of registers 0..n are OR-ed into scratch registers 8-10 (dead at entries
/// and returns, as every register above n) and tested. Usually they are all zero (compiled
/// code ends its AVX parts with `vzeroupper`): only the xmm parts are saved, `vzeroupper`
/// puts the upper state back to its initial (clean) state for the handler, and the restore
/// after a second `vzeroupper` gives the registers exactly their values (upper halves zero)
/// with the upper state clean, as `fp_save` does after XINUSE says "not in use". Otherwise
/// the registers are saved and restored whole (ymm, or zmm with AVX-512). MXCSR, the x87
/// control word and stack are left to the handler, which must not change them. Ends with ZF
/// set when the handler asked for the general path ([`crate::LEAN_RETRY`]), rsp at the
/// pt_regs. Clobbers every caller-saved register and rbx.
fn lean_call_out(a: &mut CodeAssembler, fp: FpSave, n: usize) -> Result<(), IcedError> {
    use std::mem::offset_of;
    let func = offset_of!(crate::LeanHandler, func) as i32;
    let arg = offset_of!(crate::LeanHandler, arg) as i32;
    let failures = offset_of!(crate::LeanHandler, failures) as i32;
    // From the 64-aligned rsp: the failure record, the "saved whole" flag, the registers.
    const WIDE: i32 = 32;
    const VECS: i32 = 64;
    let mut ok = a.create_label();
    let mut wide = a.create_label();
    let mut call = a.create_label();
    let mut wide_back = a.create_label();
    let mut back = a.create_label();
    let avx = fp.avx || fp.avx512;
    a.mov(rbx, rsp)?;
    a.and(rsp, -64)?;
    a.sub(rsp, VECS + 64 * n as i32)?;
    a.mov(qword_ptr(rsp), 0)?;
    if fp.avx512 {
        a.vmovdqa64(zmm8, zmm0)?;
        for r in ZMMS.iter().take(n).skip(1) {
            a.vpord(zmm8, zmm8, *r)?;
        }
        a.vextracti64x4(ymm9, zmm8, 1)?;
        a.vextracti128(xmm10, ymm8, 1)?;
        a.vpor(ymm9, ymm9, ymm10)?;
        a.vptest(ymm9, ymm9)?;
        a.jnz(wide)?;
    } else if fp.avx {
        a.vmovdqa(ymm8, ymm0)?;
        for r in YMMS.iter().take(n).skip(1) {
            a.vpor(ymm8, ymm8, *r)?;
        }
        a.vextracti128(xmm9, ymm8, 1)?;
        a.vptest(xmm9, xmm9)?;
        a.jnz(wide)?;
    }
    if avx {
        // Upper halves all zero: clean again for the handler's legacy SSE code (the test above
        // dirtied the scratch registers' upper halves).
        a.vzeroupper()?;
    }
    for (i, r) in XMMS.iter().take(n).enumerate() {
        a.movdqu(xmmword_ptr(rsp + (VECS + 16 * i as i32)), *r)?;
    }
    // Without AVX there are no upper halves: no whole-register path (its labels would fall
    // on the next instruction with nothing between them), and no flag saying which was taken.
    if avx {
        a.mov(byte_ptr(rsp + WIDE), 0)?;
        a.jmp(call)?;
        a.set_label(&mut wide)?;
        a.mov(byte_ptr(rsp + WIDE), 1)?;
        if fp.avx512 {
            for (i, r) in ZMMS.iter().take(n).enumerate() {
                a.vmovdqu64(zmmword_ptr(rsp + (VECS + 64 * i as i32)), *r)?;
            }
        } else {
            for (i, r) in YMMS.iter().take(n).enumerate() {
                a.vmovdqu(ymmword_ptr(rsp + (VECS + 64 * i as i32)), *r)?;
            }
        }
        a.vzeroupper()?;
    }
    a.set_label(&mut call)?;
    a.mov(rdi, rbx)?;
    a.mov(rsi, qword_ptr(r14 + arg))?;
    a.mov(rdx, rsp)?;
    a.call(qword_ptr(r14 + func))?;
    a.cmp(qword_ptr(rsp), 0)?;
    a.je(ok)?;
    a.cmp(qword_ptr(rsp), -1)?;
    a.je(ok)?;
    a.mov(rax, qword_ptr(r14 + failures))?;
    a.lock().inc(qword_ptr(rax))?;
    a.set_label(&mut ok)?;
    if avx {
        a.cmp(byte_ptr(rsp + WIDE), 0)?;
        a.jne(wide_back)?;
        a.vzeroupper()?;
    }
    for (i, r) in XMMS.iter().take(n).enumerate() {
        a.movdqu(*r, xmmword_ptr(rsp + (VECS + 16 * i as i32)))?;
    }
    if avx {
        a.jmp(back)?;
        a.set_label(&mut wide_back)?;
        if fp.avx512 {
            for (i, r) in ZMMS.iter().take(n).enumerate() {
                a.vmovdqu64(*r, zmmword_ptr(rsp + (VECS + 64 * i as i32)))?;
            }
        } else {
            for (i, r) in YMMS.iter().take(n).enumerate() {
                a.vmovdqu(*r, ymmword_ptr(rsp + (VECS + 64 * i as i32)))?;
            }
        }
    }
    a.set_label(&mut back)?;
    a.cmp(qword_ptr(rsp), -1)?;
    a.mov(rsp, rbx)?;
    Ok(())
}

/// [`lean_call`] or [`lean_call_out`], as the lean handler at r14 says (`calls_out`: 0 or
/// [`crate::LEAN_GUARD_ONLY`], the handler keeps the vector registers; else the stub keeps
/// them). The caller holds the recursion guard.
fn lean_call_any(a: &mut CodeAssembler, fp: FpSave, n: usize, retry: CodeLabel) -> Result<(), IcedError> {
    let calls_out = std::mem::offset_of!(crate::LeanHandler, calls_out) as i32;
    let mut out = a.create_label();
    let mut plain = a.create_label();
    let mut done = a.create_label();
    a.cmp(qword_ptr(r14 + calls_out), 0)?;
    a.je(plain)?;
    a.cmp(qword_ptr(r14 + calls_out), crate::LEAN_GUARD_ONLY as i32)?;
    a.jne(out)?;
    a.set_label(&mut plain)?;
    lean_call(a, retry)?;
    a.jmp(done)?;
    a.set_label(&mut out)?;
    lean_call_out(a, fp, n)?;
    a.je(retry)?;
    a.set_label(&mut done)?;
    Ok(())
}

/// The lean path of the light entry stub: when the site's only probe has a [`LeanHandler`]
/// (`Site::lean_entry`) whose gate is closed, builds the pt_regs (the registers, the flags as
/// lahf/seto give them; the fields after the registers and the flags in rflags' layout only
/// for a handler that reads them, `LeanHandler::reads_all`, or the general path), calls it directly (no FP
/// state saved: the lean handler touches none; no Rust in between; or, for a handler that
/// calls out, only the vector registers, with the thread's recursion guard held as
/// `entry_dispatch` holds it) inside an RCU read-side section (so `detach` still waits for
/// it), and resumes. A thread whose recursion guard is held (inside a handler, or doing
/// userbpf's own work: `thread::ours`) goes to the general path, which runs nothing. Anything
/// else goes to the general
/// path: `saved` (pt_regs built, GPRs saved) or, before anything is saved, the code after
/// this. `redirect`: the general path's resume at r12 (a changed `regs.ip`), rsp = pt_regs.
///
/// At the start: [rsp] = return address into the site stub, [rsp+8] = Site*.
fn lean_entry_path(
    a: &mut CodeAssembler,
    fp: FpSave,
    saved: &mut CodeLabel,
    redirect: &mut CodeLabel,
    ret_only: &mut CodeLabel,
) -> Result<(), IcedError> {
    use std::mem::offset_of;
    let lean_entry = offset_of!(crate::Site, lean_entry) as i32;
    let has_ret = offset_of!(crate::Site, has_ret) as i32;
    let mut plant = a.create_label();
    let site_addr = offset_of!(crate::Site, addr) as i32;
    let gate = offset_of!(crate::LeanHandler, gate) as i32;
    let mut unlock_general = a.create_label();
    // The status flags are dead at a function entry (and the other paths of the light stub
    // test and branch before they save them too): a compare, the lean path inline.
    a.push(rcx)?;
    a.mov(rcx, qword_ptr(rsp + 16))?;
    a.cmp(qword_ptr(rcx + lean_entry), 0)?;
    a.pop(rcx)?;
    a.je(*ret_only)?;
    a.lea(rsp, ptr(rsp - PT_REGS_SIZE))?;
    for (r, off) in REG_OFFSETS {
        a.mov(qword_ptr(rsp + off), r)?;
    }
    // The status flags as lahf/seto give them (AH, AL = OF), made into rflags' layout only
    // where something reads them (`raw_flags_fix`: the general path, a handler that reads
    // the whole pt_regs).
    a.lahf()?;
    a.seto(al)?;
    a.mov(qword_ptr(rsp + FLAGS_OFF), rax)?;
    let mut general = a.create_label();
    lean_rcu_enter(a, general)?;
    // The recursion guard, which also keeps probes off for userbpf's own work
    // (`thread::ours`): held (or no state yet) → the general path decides.
    let in_handler = offset_of!(crate::thread::ThreadState, in_handler) as i32;
    let registered = offset_of!(crate::thread::ThreadState, registered) as i32;
    let t = crate::thread::table_layout();
    a.mov(rsi, qword_ptr(r12 + t.state))?;
    a.test(rsi, rsi)?;
    a.jz(unlock_general)?;
    a.cmp(dword_ptr(rsi + in_handler), 0)?;
    a.jne(unlock_general)?;
    a.mov(r15, qword_ptr(rsp + (PT_REGS_SIZE + 8)))?;
    a.mov(r14, qword_ptr(r15 + lean_entry))?;
    a.test(r14, r14)?;
    a.jz(unlock_general)?;
    a.mov(rax, qword_ptr(r14 + gate))?;
    a.cmp(byte_ptr(rax), 0)?;
    a.jne(unlock_general)?;
    // The fields after the registers, for a handler that reads them.
    let reads_all = offset_of!(crate::LeanHandler, reads_all) as i32;
    let mut gprs_only = a.create_label();
    a.cmp(qword_ptr(r14 + reads_all), 0)?;
    a.je(gprs_only)?;
    raw_flags_fix(a)?;
    a.mov(rax, qword_ptr(r15 + site_addr))?;
    a.mov(qword_ptr(rsp + IP_OFF), rax)?;
    a.lea(rax, ptr(rsp + ENTRY_FRAME as i32))?;
    a.mov(qword_ptr(rsp + SP_OFF), rax)?;
    a.mov(qword_ptr(rsp + CS_OFF), 0x33)?;
    a.mov(qword_ptr(rsp + SS_OFF), 0x2b)?;
    a.mov(qword_ptr(rsp + ORIG_AX_OFF), -1)?;
    a.set_label(&mut gprs_only)?;
    let calls_out = offset_of!(crate::LeanHandler, calls_out) as i32;
    let mut plain = a.create_label();
    let mut called = a.create_label();
    a.cmp(qword_ptr(r14 + calls_out), 0)?;
    a.je(plain)?;
    // A handler that calls out: the recursion guard, as entry_dispatch holds it (the state's
    // pthread destructor not registered yet: the general path).
    a.cmp(dword_ptr(rsi + registered), 0)?;
    a.je(unlock_general)?;
    a.mov(dword_ptr(rsi + in_handler), 1)?;
    // A handler that keeps the vector registers itself (`LEAN_GUARD_ONLY`): the guard alone.
    let mut guarded = a.create_label();
    let mut guarded_retry = a.create_label();
    a.cmp(qword_ptr(r14 + calls_out), crate::LEAN_GUARD_ONLY as i32)?;
    a.je(guarded)?;
    lean_call_out(a, fp, 8)?;
    // (The loads and stores keep lean_call_out's flags: ZF = go to the general path.)
    a.mov(rsi, qword_ptr(r12 + t.state))?;
    a.mov(dword_ptr(rsi + in_handler), 0)?;
    a.je(unlock_general)?;
    a.jmp(called)?;
    a.set_label(&mut guarded)?;
    lean_call(a, guarded_retry)?;
    a.mov(rsi, qword_ptr(r12 + t.state))?;
    a.mov(dword_ptr(rsi + in_handler), 0)?;
    a.jmp(called)?;
    a.set_label(&mut guarded_retry)?;
    a.mov(rsi, qword_ptr(r12 + t.state))?;
    a.mov(dword_ptr(rsi + in_handler), 0)?;
    a.jmp(unlock_general)?;
    a.set_label(&mut plain)?;
    lean_call(a, unlock_general)?;
    a.set_label(&mut called)?;
    // The thread's state for planting the return below (r12 is reused for a changed ip).
    a.mov(rsi, qword_ptr(r12 + t.state))?;
    lean_rcu_exit(a)?;
    // A handler that reads only the registers neither reads nor writes `ip` (r14 is
    // callee-saved: still the handler).
    let mut same_ip = a.create_label();
    a.cmp(qword_ptr(r14 + reads_all), 0)?;
    a.je(same_ip)?;
    a.mov(r12, qword_ptr(rsp + IP_OFF))?;
    a.cmp(r12, qword_ptr(r15 + site_addr))?;
    let changed = a.create_label();
    a.jne(changed)?;
    a.set_label(&mut same_ip)?;
    let mut no_ret = a.create_label();
    let mut plant_slow = a.create_label();
    a.cmp(byte_ptr(r15 + has_ret), 0)?;
    a.je(no_ret)?;
    plant_inline(a, plant_slow)?;
    a.set_label(&mut no_ret)?;
    restore_gprs_f(a, false)?;
    a.lea(rsp, ptr(rsp + PT_REGS_SIZE))?;
    a.ret()?; // back into the site stub
    // Return probes too, when the shadow stack could not take the entry here: the return-only
    // path plants the trampoline (or its general fallback does), told by the tagged Site*
    // (low bit) that the entry handlers ran (its general fallback then skips them).
    a.set_label(&mut plant_slow)?;
    restore_gprs_f(a, false)?;
    a.lea(rsp, ptr(rsp + PT_REGS_SIZE))?;
    a.set_label(&mut plant)?;
    a.or(qword_ptr(rsp + 8), 1)?;
    a.jmp(*ret_only)?;
    a.set_label(&mut unlock_general)?;
    lean_rcu_exit(a)?;
    a.set_label(&mut general)?;
    raw_flags_fix(a)?;
    a.jmp(*saved)?;
    lean_ip_changed(a, changed, &general, redirect)?;
    // Not lean: the return-only path (which falls through to the general one) follows.
    a.set_label(ret_only)?;
    Ok(())
}

/// Plants the return trampoline for a frame (rsi = the thread's state; the function's rsp at
/// `[rsp + fn_sp]`, its return address there): when the thread's state has its destructor
/// registered, the recursion guard is free and the shadow stack has room, pushes the frame's
/// entry with the guard held (a probe hit in a signal handler meanwhile pushes nothing),
/// `site` putting the Site* in rdx, then `restore`s the registers and returns into the site
/// stub with CF set and OF clear (it calls the relocated code, whose return lands in the
/// trampoline: see `return_now_if_ret`). Anything else, or a dead frame (longjmp'd over) at or
/// below this one, which the general path drops, jumps to `slow` with the guard free and the
/// stack as it was. Clobbers rax, rcx, rdx.
fn plant_return(
    a: &mut CodeAssembler,
    fn_sp: i32,
    site: impl FnOnce(&mut CodeAssembler) -> Result<(), IcedError>,
    restore: impl FnOnce(&mut CodeAssembler) -> Result<(), IcedError>,
    slow: CodeLabel,
) -> Result<(), IcedError> {
    use crate::thread::{ShadowEntry, ThreadState};
    use std::mem::{offset_of, size_of};
    const _: () = assert!(size_of::<ShadowEntry>() == 32);
    let site_addr = offset_of!(crate::Site, addr) as i32;
    let in_handler = offset_of!(ThreadState, in_handler) as i32;
    let registered = offset_of!(ThreadState, registered) as i32;
    let top = offset_of!(ThreadState, top) as i32;
    let entries = offset_of!(ThreadState, entries) as i32;
    let e_ret = entries + offset_of!(ShadowEntry, ret) as i32;
    let e_site = entries + offset_of!(ShadowEntry, site) as i32;
    let e_func = entries + offset_of!(ShadowEntry, func_ip) as i32;
    let e_sp = entries + offset_of!(ShadowEntry, sp) as i32;
    let mut push = a.create_label();
    let mut dead = a.create_label();
    a.cmp(dword_ptr(rsi + in_handler), 0)?;
    a.jne(slow)?;
    a.cmp(dword_ptr(rsi + registered), 0)?;
    a.je(slow)?;
    a.mov(rdx, qword_ptr(rsi + top))?;
    a.cmp(rdx, crate::thread::SHADOW_CAPACITY as i32)?;
    a.jae(slow)?;
    a.mov(dword_ptr(rsi + in_handler), 1)?;
    a.lea(rcx, ptr(rsp + fn_sp))?;
    // rax = &entries[top] - entries.
    a.mov(rax, rdx)?;
    a.shl(rax, 5)?;
    a.add(rax, rsi)?;
    a.test(rdx, rdx)?;
    a.jz(push)?;
    a.cmp(qword_ptr(rax + (e_sp - 32)), rcx)?;
    a.jbe(dead)?;
    a.set_label(&mut push)?;
    a.mov(rdx, qword_ptr(rcx))?;
    a.mov(qword_ptr(rax + e_ret), rdx)?;
    site(a)?;
    a.mov(qword_ptr(rax + e_site), rdx)?;
    a.mov(rdx, qword_ptr(rdx + site_addr))?;
    a.mov(qword_ptr(rax + e_func), rdx)?;
    a.mov(qword_ptr(rax + e_sp), rcx)?;
    a.add(qword_ptr(rsi + top), 1)?;
    a.mov(dword_ptr(rsi + in_handler), 0)?;
    restore(a)?;
    a.test(rsp, rsp)?;
    a.stc()?;
    a.ret()?;
    a.set_label(&mut dead)?;
    a.mov(dword_ptr(rsi + in_handler), 0)?;
    a.jmp(slow)?;
    Ok(())
}

/// The lean entry path's planting of the return trampoline, after the handler ran (rsp = the
/// pt_regs, rsi = the thread's state, r15 = Site*), as the return-only path plants it; then
/// back into the site stub with the registers restored. Anything else jumps to `slow` (rsp
/// still at the pt_regs).
fn plant_inline(a: &mut CodeAssembler, slow: CodeLabel) -> Result<(), IcedError> {
    plant_return(
        a,
        ENTRY_FRAME as i32,
        |a| a.mov(rdx, r15),
        |a| {
            restore_gprs_f(a, false)?;
            a.lea(rsp, ptr(rsp + PT_REGS_SIZE))
        },
        slow,
    )
}

/// Turns the flags the lean entry path stored at `FLAGS_OFF` (lahf's AH and seto's AL) into
/// rflags' layout there. Clobbers rax, rcx, flags.
fn raw_flags_fix(a: &mut CodeAssembler) -> Result<(), IcedError> {
    // AH = SF ZF 0 AF 0 PF 1 CF, AL = OF.
    a.mov(rax, qword_ptr(rsp + FLAGS_OFF))?;
    a.movzx(ecx, al)?;
    a.shl(ecx, 11)?;
    a.shr(eax, 8)?;
    a.and(eax, 0xD5)?;
    a.or(eax, ecx)?;
    a.or(eax, 0x202)?;
    a.mov(qword_ptr(rsp + FLAGS_OFF), rax)?;
    Ok(())
}

/// The lean handler changed `regs.ip` (rsp = pt_regs, r15 = Site*, r12 = the new ip): resume
/// there (`redirect`), unless the site has return probes, which must still see the frame
/// return (a `bpf_override_return` resumes at a bare `ret`): then the general path
/// (`saved`), told by the tagged Site* (bit 1) that the entry handlers ran and `regs.ip` is
/// theirs, plants the return trampoline before resuming at `regs.ip`.
fn lean_ip_changed(
    a: &mut CodeAssembler,
    mut changed: CodeLabel,
    saved: &CodeLabel,
    redirect: &CodeLabel,
) -> Result<(), IcedError> {
    let has_ret = std::mem::offset_of!(crate::Site, has_ret) as i32;
    a.set_label(&mut changed)?;
    a.cmp(byte_ptr(r15 + has_ret), 0)?;
    a.je(*redirect)?;
    a.or(qword_ptr(rsp + (PT_REGS_SIZE + 8)), 2)?;
    a.jmp(*saved)?;
    Ok(())
}

/// The lean path of the light return trampoline (after the GPRs are saved, pt_regs at rsp,
/// the slot for the real return address at rsp+168): when the top shadow-stack entry is
/// this frame's and its site's only return probe has a [`LeanHandler`] whose gate is closed,
/// pops the entry, calls the lean handler inside an RCU read-side section with the recursion
/// guard held (as `ret_dispatch` does), and returns to the real return address. Anything
/// else (stale entries, no state, a guard held) falls through to the general path.
fn lean_ret_path(a: &mut CodeAssembler, fp: FpSave) -> Result<(), IcedError> {
    use crate::thread::{ShadowEntry, ThreadState};
    use std::mem::{offset_of, size_of};
    const _: () = assert!(size_of::<ShadowEntry>() == 32);
    let t = crate::thread::table_layout();
    let lean_ret = offset_of!(crate::Site, lean_ret) as i32;
    let gate = offset_of!(crate::LeanHandler, gate) as i32;
    let in_handler = offset_of!(ThreadState, in_handler) as i32;
    let top = offset_of!(ThreadState, top) as i32;
    let entries = offset_of!(ThreadState, entries) as i32;
    let e_ret = entries + offset_of!(ShadowEntry, ret) as i32 - 32;
    let e_site = entries + offset_of!(ShadowEntry, site) as i32 - 32;
    let e_sp = entries + offset_of!(ShadowEntry, sp) as i32 - 32;
    let mut general = a.create_label();
    let mut unlock_general = a.create_label();
    lean_rcu_enter(a, general)?;
    a.mov(rsi, qword_ptr(r12 + t.state))?;
    a.test(rsi, rsi)?;
    a.jz(unlock_general)?;
    a.cmp(dword_ptr(rsi + in_handler), 0)?;
    a.jne(unlock_general)?;
    a.mov(rdx, qword_ptr(rsi + top))?;
    a.test(rdx, rdx)?;
    a.jz(unlock_general)?;
    // rax = the top entry's address - `entries` + 32 (folded into the offsets above).
    a.mov(rax, rdx)?;
    a.shl(rax, 5)?;
    a.add(rax, rsi)?;
    a.lea(rcx, ptr(rsp + PT_REGS_SIZE))?;
    a.cmp(qword_ptr(rax + e_sp), rcx)?;
    a.jne(unlock_general)?;
    a.mov(r15, qword_ptr(rax + e_site))?;
    a.mov(r14, qword_ptr(r15 + lean_ret))?;
    a.test(r14, r14)?;
    a.jz(unlock_general)?;
    a.mov(rcx, qword_ptr(r14 + gate))?;
    a.cmp(byte_ptr(rcx), 0)?;
    a.jne(unlock_general)?;
    // Pop the entry, guard held while the handler runs.
    a.mov(dword_ptr(rsi + in_handler), 1)?;
    a.sub(rdx, 1)?;
    a.mov(qword_ptr(rsi + top), rdx)?;
    a.mov(r15, rsi)?;
    a.mov(rcx, qword_ptr(rax + e_ret))?;
    a.mov(qword_ptr(rsp + PT_REGS_SIZE), rcx)?;
    a.mov(qword_ptr(rsp + IP_OFF), rcx)?;
    a.lea(rcx, ptr(rsp + (PT_REGS_SIZE + 8)))?;
    a.mov(qword_ptr(rsp + SP_OFF), rcx)?;
    a.mov(qword_ptr(rsp + CS_OFF), 0x33)?;
    a.mov(qword_ptr(rsp + SS_OFF), 0x2b)?;
    a.mov(qword_ptr(rsp + ORIG_AX_OFF), -1)?;
    let mut retry = a.create_label();
    lean_call_any(a, fp, 2, retry)?;
    a.mov(dword_ptr(r15 + in_handler), 0)?;
    lean_rcu_exit(a)?;
    restore_gprs_f(a, false)?;
    // The real return address is in the slot at rsp+168: `ret` to it, which the return-stack
    // buffer predicts (the stub's call and the function's return paired off).
    a.lea(rsp, ptr(rsp + PT_REGS_SIZE))?;
    a.ret()?;
    // The handler ran nothing and asks for the general path: the entry back on the shadow
    // stack (popped above, still in place) and the guard released, for ret_dispatch.
    a.set_label(&mut retry)?;
    a.mov(dword_ptr(r15 + in_handler), 0)?;
    a.add(qword_ptr(r15 + top), 1)?;
    a.set_label(&mut unlock_general)?;
    lean_rcu_exit(a)?;
    a.set_label(&mut general)?;
    Ok(())
}

/// The shared return trampoline, assembled for address `ip`.
pub(crate) fn ret_tramp(ip: u64, fp: FpSave, kind: SaveKind, dispatch: u64) -> Result<Vec<u8>, IcedError> {
    let mut a = CodeAssembler::new(64)?;
    a.lea(rsp, ptr(rsp - (PT_REGS_SIZE + 8)))?;
    save_gprs_f(&mut a, kind == SaveKind::Full)?;
    if kind != SaveKind::Full {
        lean_ret_path(&mut a, fp)?;
    }
    fp_save(&mut a, fp, kind)?;
    a.mov(rdi, rbx)?;
    a.mov(rax, dispatch)?;
    a.call(rax)?;
    a.mov(r12, rax)?;
    fp_restore(&mut a, fp, kind)?;
    a.mov(qword_ptr(rsp + PT_REGS_SIZE), r12)?;
    restore_gprs_f(&mut a, kind == SaveKind::Full)?;
    // `ret` to the real return address (in the slot at rsp+168): with the site stub's call
    // planting, the return-stack buffer holds the caller's entry here and predicts it.
    a.lea(rsp, ptr(rsp + PT_REGS_SIZE))?;
    a.ret()?;
    a.assemble(ip)
}

/// Offset of the site stub inside a site page: not the page's start. Level-1 caches (data and
/// instructions) choose the set by the address bits within the page, so every page-aligned
/// object of the target competes for the set of offset 0; the stub's code and the words it
/// loads (Site*, the common entry) are on every hit's path. Measured in fio under callgrind's
/// cache model (2026-11-26): each of the probe's per-hit lines at page offset 0 cost a miss
/// per I/O in fio's own lines. 64-aligned, even (a breakpoint's trap address is the stub's
/// with bit 0 set).
pub(crate) const SITE_STUB_AT: usize = 0x6c0;

/// Offset of the relocated code inside a site page (after the site stub).
pub(crate) const RELOC_OFF: usize = SITE_STUB_AT + 128;
const _: () = assert!(RELOC_OFF + 256 <= 4096 && SITE_STUB_AT.is_multiple_of(64));

/// The per-site stub (placed at [`SITE_STUB_AT`] in the site page): calls the
/// common entry, which normally returns here; then the relocated code runs.
///
/// With `ret_tramp` (function entries with the light stubs), the common entry says with CF
/// that a return probe was planted (the shadow-stack entry holds the return address): the
/// stub then drops the return address and *calls* the relocated code, so the function's
/// frame looks as before (the call writes the stub's landing into the same slot) and its
/// `ret` comes back to the landing as the return-stack buffer predicts; the landing jumps to
/// the shared return trampoline, whose final `ret` to the real return address is predicted
/// too (the caller's own entry is back on top). Writing the trampoline's address into the
/// slot instead would cost a mispredicted return on every hit.
///
/// The stub starts with `jmp [rip+switch]`: the site's switch word (`Site::switch`, in a
/// data page near the stub) holds where hits go, the rest of this stub (at [`SHARED_AT`] past
/// its start, the shared path) or the site's generated stub ([`fast_stub`]).
pub(crate) fn site_stub(
    ip: u64,
    switch: u64,
    site: u64,
    common: u64,
    reloc: u64,
    ret_tramp: Option<u64>,
) -> Result<Vec<u8>, String> {
    let Ok(rel) = i32::try_from(switch as i64 - (ip as i64 + 6)) else {
        return Err("the site's switch word is out of rel32 reach".into());
    };
    site_stub_asm(ip, rel, site, common, reloc, ret_tramp).map_err(|e| e.to_string())
}

fn site_stub_asm(
    ip: u64,
    rel: i32,
    site: u64,
    common: u64,
    reloc: u64,
    ret_tramp: Option<u64>,
) -> Result<Vec<u8>, IcedError> {
    let mut a = CodeAssembler::new(64)?;
    let mut jmp = vec![0xFF, 0x25];
    jmp.extend_from_slice(&rel.to_le_bytes());
    a.db(&jmp)?;
    a.db(&[0xCC; SHARED_AT as usize - 6])?;
    let mut site_l = a.create_label();
    let mut common_l = a.create_label();
    let mut tramp_l = a.create_label();
    let mut planted = a.create_label();
    a.lea(rsp, ptr(rsp - 128))?;
    a.push(qword_ptr(site_l))?;
    a.call(qword_ptr(common_l))?;
    a.lea(rsp, ptr(rsp + 136))?; // drop the Site* and the red-zone gap (no flags change)
    if ret_tramp.is_some() {
        a.jb(planted)?;
    }
    a.jmp(reloc)?;
    if ret_tramp.is_some() {
        let mut ret_now = a.create_label();
        a.set_label(&mut planted)?;
        // CF and OF: the function is skipped (see `return_now_if_ret`).
        a.jo(ret_now)?;
        a.lea(rsp, ptr(rsp + 8))?;
        a.call(reloc)?;
        // The landing: the function returned here.
        a.jmp(qword_ptr(tramp_l))?;
        a.set_label(&mut ret_now)?;
        a.ret()?;
    }
    a.int3()?;
    a.set_label(&mut site_l)?;
    a.dq(&[site])?;
    a.set_label(&mut common_l)?;
    a.dq(&[common])?;
    if let Some(t) = ret_tramp {
        a.set_label(&mut tramp_l)?;
        a.dq(&[t])?;
    }
    a.assemble(ip)
}

/// Where the shared path starts inside a site stub (after its `jmp [rip+switch]`).
pub(crate) const SHARED_AT: u64 = 16;

/// Offset of a generated stub ([`fast_stub`]) inside its page: away from offset 0 and from
/// [`SITE_STUB_AT`] (see there: level-1 sets).
pub(crate) const FAST_STUB_AT: usize = 0x9c0;
/// Offset of the switch words inside their pages (see [`SITE_STUB_AT`]).
pub(crate) const SWITCH_AT: usize = 0xb40;

/// What a generated stub has built in: one entry probe alone at a function entry, with no
/// return probe, whose [`crate::LeanHandler`] reads at most the 15 registers and changes no
/// `ip` (`reads_all == 0`), calling out not at all (`calls_out == 0`) or keeping the vector
/// registers itself ([`crate::LEAN_GUARD_ONLY`]).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fast {
    pub func: u64,
    pub arg: u64,
    pub gate: u64,
    pub failures: u64,
    /// `calls_out == LEAN_GUARD_ONLY`: hold the recursion guard around the call.
    pub guard: bool,
    /// The pt_regs words the handler may read (bits 0-14, see `LeanHandler::regs_read`).
    pub regs_read: u64,
    /// The site's switch word, which holds this stub's address while it serves the site.
    pub switch: u64,
    /// The site stub's shared path, where anything unusual goes.
    pub shared: u64,
    /// The relocated instructions.
    pub reloc: u64,
    /// Readers announce an RCU section with a plain store (`thread::ASYM`, never cleared).
    pub asym: bool,
}

/// The frame of a generated stub: pt_regs at rsp, the failure record (three words) after it;
/// 200 bytes keep rsp 16-byte aligned at the call when it was 8 mod 16 at the function's entry
/// (the ABI's).
const FAST_FRAME: i32 = PT_REGS_SIZE + 32;
const FAST_RECORD: i32 = PT_REGS_SIZE;
/// pt_regs words of the registers a call may change (r11, r10, r9, r8, rax, rcx, rdx, rsi,
/// rdi): saved and restored by every generated stub. rbx (word 5) too: it holds the thread's
/// table slot across the call.
const CALLER_SAVED_WORDS: u64 = 0x7fc0;
const RBX_WORD: u64 = 1 << 5;

/// A stub generated for one site at attach time (placed at [`FAST_STUB_AT`] of its own page,
/// reached through the site's switch word), doing what the light entry stub's lean path does
/// for the handler it was made for, with the handler's properties built in:
///
/// ```text
/// lea rsp,[rsp-200]                ; no red zone to step over at a function entry
/// mov [rsp+off], reg               ; the 9 caller-saved registers, rbx, and the callee-saved
///                                  ; ones the program reads (`regs_read`), at their pt_regs
///                                  ; offsets: the handler (compiled code) keeps the others
/// cmp byte [gate], 0 ; jne shared  ; run statistics on: the shared path
/// (guard) rsp 16-byte aligned?     ; else shared (which realigns)
/// rbx = the thread's table slot (static-TLS hint) ; else shared
/// RCU section announced (odd generation) ; already in one: shared
/// [switch] == this stub?           ; else the site changed meanwhile: shared (detach waits
///                                  ; for sections, so no handler runs after it returned)
/// state, recursion guard free      ; else shared (userbpf's own work, a nested hit)
/// (guard) destructor registered, guard held
/// call handler(regs, arg, record)  ; a direct call
/// (guard) guard released
/// record: 0 ok, -1 retry (shared), else a failure counted
/// section left ; registers back ; lea rsp,[rsp+200] ; jmp relocated
/// ```
/// The shared path (`shared`) is entered with every register and rsp as at the function's
/// entry, and does all the above again its own way (the general path included). The status
/// flags are dead at a function entry and DF is clear; nothing here restores them.
pub(crate) fn fast_stub(ip: u64, f: &Fast) -> Result<Vec<u8>, IcedError> {
    use crate::thread::ThreadState;
    use std::mem::offset_of;
    let t = crate::thread::table_layout();
    let in_handler = offset_of!(ThreadState, in_handler) as i32;
    let mut a = CodeAssembler::new(64)?;
    let mut start = a.create_label();
    let mut slow = a.create_label();
    let mut unlock_slow = a.create_label();
    let mut check = a.create_label();
    let mut back = a.create_label();
    let mut shared_l = a.create_label();
    let mut reloc_l = a.create_label();
    let mut func_l = a.create_label();
    let saved = |w: u64| w & (CALLER_SAVED_WORDS | RBX_WORD) != 0;
    a.set_label(&mut start)?;
    a.lea(rsp, ptr(rsp - FAST_FRAME))?;
    for (i, (r, off)) in REG_OFFSETS.iter().enumerate() {
        let w = 1u64 << i;
        if saved(w) || f.regs_read & w != 0 {
            a.mov(qword_ptr(rsp + *off), *r)?;
        }
    }
    a.mov(rax, f.gate)?;
    a.cmp(byte_ptr(rax), 0)?;
    a.jne(slow)?;
    if f.guard {
        // Compiled code is called out to, on the ABI's 16-byte aligned stack: rsp was 8 mod 16
        // at the function's entry (the ABI's), or the shared path realigns.
        a.test(esp, 15)?;
        a.jnz(slow)?;
    }
    a.mov(rbx, qword_ptr(crate::thread::slot_hint_tls_offset() as i64 as u64).fs())?;
    a.mov(rcx, qword_ptr(0u64).fs())?;
    a.test(rbx, rbx)?;
    a.jz(slow)?;
    a.cmp(qword_ptr(rbx + t.key), rcx)?;
    a.jne(slow)?;
    a.mov(rax, qword_ptr(rbx + t.rcu))?;
    a.test(al, 1)?;
    a.jnz(slow)?;
    a.add(rax, 1)?;
    if f.asym {
        // Asymmetric fences: the writer's membarrier orders this store before the loads below.
        a.mov(qword_ptr(rbx + t.rcu), rax)?;
    } else {
        a.xchg(qword_ptr(rbx + t.rcu), rax)?;
    }
    // Inside the section: still this site's stub? (`publish` switches before it waits.)
    a.mov(rcx, f.switch)?;
    a.lea(rdx, ptr(start))?;
    a.cmp(qword_ptr(rcx), rdx)?;
    a.jne(unlock_slow)?;
    a.mov(rdx, qword_ptr(rbx + t.state))?;
    a.test(rdx, rdx)?;
    a.jz(unlock_slow)?;
    if f.guard {
        // The guard free and, as on the shared lean path, the state's pthread destructor
        // registered (the general path registers it): both words at once.
        const _: () = assert!(offset_of!(ThreadState, registered) == offset_of!(ThreadState, in_handler) + 4);
        a.mov(rax, 1u64 << 32)?;
        a.cmp(qword_ptr(rdx + in_handler), rax)?;
        a.jne(unlock_slow)?;
        a.mov(dword_ptr(rdx + in_handler), 1)?;
    } else {
        a.cmp(dword_ptr(rdx + in_handler), 0)?;
        a.jne(unlock_slow)?;
    }
    let record = qword_ptr(rsp + FAST_RECORD);
    a.mov(record, 0)?;
    a.mov(rdi, rsp)?;
    a.lea(rdx, ptr(rsp + FAST_RECORD))?;
    a.mov(rsi, f.arg)?;
    let call_rel = f.func as i64 - ip as i64;
    if call_rel.abs() < (1 << 30) {
        a.call(f.func)?;
    } else {
        a.call(qword_ptr(func_l))?;
    }
    if f.guard {
        a.mov(rcx, qword_ptr(rbx + t.state))?;
        a.mov(dword_ptr(rcx + in_handler), 0)?;
    }
    a.cmp(record, 0)?;
    a.jne(check)?;
    a.set_label(&mut back)?;
    // Leave the section (only this thread writes its generation; a store is a release).
    a.add(qword_ptr(rbx + t.rcu), 1)?;
    for (i, (r, off)) in REG_OFFSETS.iter().enumerate() {
        if saved(1u64 << i) {
            a.mov(*r, qword_ptr(rsp + *off))?;
        }
    }
    a.lea(rsp, ptr(rsp + FAST_FRAME))?;
    if (f.reloc as i64 - ip as i64).abs() < (1 << 30) {
        a.jmp(f.reloc)?;
    } else {
        a.jmp(qword_ptr(reloc_l))?;
    }
    a.set_label(&mut check)?;
    a.cmp(record, -1)?;
    a.je(unlock_slow)?;
    a.mov(rax, f.failures)?;
    a.lock().inc(qword_ptr(rax))?;
    a.jmp(back)?;
    // Leave the section, then the shared path (the site changed, no usable thread state or
    // the guard held, or the handler ran nothing and asks for the general path).
    a.set_label(&mut unlock_slow)?;
    a.add(qword_ptr(rbx + t.rcu), 1)?;
    a.set_label(&mut slow)?;
    for (i, (r, off)) in REG_OFFSETS.iter().enumerate() {
        if saved(1u64 << i) {
            a.mov(*r, qword_ptr(rsp + *off))?;
        }
    }
    a.lea(rsp, ptr(rsp + FAST_FRAME))?;
    a.jmp(qword_ptr(shared_l))?;
    a.int3()?;
    a.set_label(&mut shared_l)?;
    a.dq(&[f.shared])?;
    a.set_label(&mut reloc_l)?;
    a.dq(&[f.reloc])?;
    a.set_label(&mut func_l)?;
    a.dq(&[f.func])?;
    a.assemble(ip)
}

/// The FP/vector save of the rewritten system call sites (`crate::rewrite`), unless the full
/// one is asked for (`USERBPF_HOOK_FULL_FPSAVE=1`): xmm0-15, MXCSR, the x87 control word, and
/// the x87 environment and stack when not empty (as the light save). Why that is enough at a
/// `syscall` of libc's: libc's code is compiled for the x86-64 baseline (its AVX/AVX-512
/// variants are string functions, which make no system call), so only the legacy SSE
/// registers (their low 128 bits), MXCSR and x87 can hold its values there; the upper halves
/// of the vector registers, registers 16-31 and the opmasks belong to whoever called libc,
/// and are dead across that call by the System V ABI (every vector register is caller-saved).
/// They are put in their initial state (`vzeroupper`) before the handlers run, so these run
/// without AVX-SSE transitions, and stay so after. Layout from the 64-aligned rsp: xmm i at
/// 16*i, MXCSR at 256, the control word at 260, the x87 flag at 264, scratch at 268, the
/// `fnsave` area at 320 (108 bytes).
const S_MXCSR: i32 = 256;
const S_FCW: i32 = 260;
const S_X87: i32 = 264;
const S_TMP: i32 = 268;
const S_FNSAVE: i32 = 320;
const S_SIZE: i32 = 448;
const XMM16: [AsmRegisterXmm; 16] =
    [xmm0, xmm1, xmm2, xmm3, xmm4, xmm5, xmm6, xmm7, xmm8, xmm9, xmm10, xmm11, xmm12, xmm13, xmm14, xmm15];

/// Emits the system call sites' save (see [`S_SIZE`]): rbx = rsp (pt_regs), then the save on
/// the aligned stack. Clobbers rax.
fn syscall_fp_save(a: &mut CodeAssembler, fp: FpSave) -> Result<(), IcedError> {
    a.mov(rbx, rsp)?;
    a.and(rsp, -64)?;
    a.sub(rsp, S_SIZE)?;
    for (i, r) in XMM16.iter().enumerate() {
        a.movaps(xmmword_ptr(rsp + 16 * i as i32), *r)?;
    }
    if fp.avx || fp.avx512 {
        a.vzeroupper()?;
    }
    a.stmxcsr(dword_ptr(rsp + S_MXCSR))?;
    a.fnstcw(word_ptr(rsp + S_FCW))?;
    let mut empty = a.create_label();
    let mut done = a.create_label();
    a.fnstsw(ax)?;
    a.test(ax, 0x3800)?; // TOP
    a.jz(empty)?;
    a.mov(byte_ptr(rsp + S_X87), 1)?;
    a.fnsave(ptr(rsp + S_FNSAVE))?;
    a.jmp(done)?;
    a.set_label(&mut empty)?;
    a.mov(byte_ptr(rsp + S_X87), 0)?;
    a.set_label(&mut done)?;
    Ok(())
}

/// Restores the x87 state saved at `rsp + fnsave` when the byte at `rsp + x87` says it was
/// saved, then the x87 control word and MXCSR saved at `rsp + fcw` / `rsp + mxcsr`, each only
/// when a handler changed it (fldcw and ldmxcsr are slow, the checks are not; `rsp + tmp` is
/// scratch). Clobbers rax and the flags.
fn restore_x87_and_control_words(
    a: &mut CodeAssembler,
    x87: i32,
    fnsave: i32,
    tmp: i32,
    fcw: i32,
    mxcsr: i32,
) -> Result<(), IcedError> {
    let mut nox87 = a.create_label();
    a.cmp(byte_ptr(rsp + x87), 0)?;
    a.je(nox87)?;
    a.frstor(ptr(rsp + fnsave))?;
    a.set_label(&mut nox87)?;
    let mut fcw_ok = a.create_label();
    let mut mxcsr_ok = a.create_label();
    a.fnstcw(word_ptr(rsp + tmp))?;
    a.movzx(eax, word_ptr(rsp + tmp))?;
    a.cmp(ax, word_ptr(rsp + fcw))?;
    a.je(fcw_ok)?;
    a.fldcw(word_ptr(rsp + fcw))?;
    a.set_label(&mut fcw_ok)?;
    a.stmxcsr(dword_ptr(rsp + tmp))?;
    a.mov(eax, dword_ptr(rsp + tmp))?;
    a.cmp(eax, dword_ptr(rsp + mxcsr))?;
    a.je(mxcsr_ok)?;
    a.ldmxcsr(dword_ptr(rsp + mxcsr))?;
    a.set_label(&mut mxcsr_ok)?;
    Ok(())
}

/// Restores what [`syscall_fp_save`] saved; rsp = rbx. Clobbers rax and the flags.
fn syscall_fp_restore(a: &mut CodeAssembler, fp: FpSave) -> Result<(), IcedError> {
    restore_x87_and_control_words(a, S_X87, S_FNSAVE, S_TMP, S_FCW, S_MXCSR)?;
    if fp.avx || fp.avx512 {
        a.vzeroupper()?;
    }
    for (i, r) in XMM16.iter().enumerate() {
        a.movaps(*r, xmmword_ptr(rsp + 16 * i as i32))?;
    }
    a.mov(rsp, rbx)?;
    Ok(())
}

/// The stub shared by the rewritten system call sites of `crate::rewrite`, assembled for
/// address `ip`. A site's trampoline reaches it with `lea rsp,[rsp-128]` (over the red zone)
/// and a `call`, so `[rsp]` is the site's data (the return address, never returned to):
///
/// ```text
/// rax < 512 and sud::FAST[rax]?  ; no callback wants the call, nothing else to do:
///   call page's `syscall; ret` ; r11 = data.back ; rsp back ; jmp r11
/// lea rsp,[rsp-168]              ; struct pt_regs at rsp, data at +168
/// every GPR and the flags (rebuilt from lahf/seto) into it
/// rbx = regs ; FP save            ; see `syscall_fp_save` (or the full one)
/// dispatch(regs, data) -> rax    ; where to resume: after the `syscall`, or at it
/// [rbx+168] = rax
/// FP restore ; every GPR back from pt_regs (the call's result in rax; the flags are dead)
/// r11 = [rsp+168] ; rsp back over the frame, the data slot and the red zone ; jmp r11
/// ```
///
/// `r11` (and `rcx`) are the registers the `syscall` instruction clobbers itself, so the
/// program keeps nothing in them across the site; the dispatcher puts in `rcx` what the
/// kernel would (the address after the `syscall`).
pub(crate) fn syscall_common(
    ip: u64,
    fp: FpSave,
    full: bool,
    dispatch: u64,
    fast: u64,
    gadget: u64,
) -> Result<Vec<u8>, IcedError> {
    let mut a = CodeAssembler::new(64)?;
    let mut slow = a.create_label();
    // A call no callback wants and that needs nothing else (`sud::FAST`): made here, from the
    // page's `syscall; ret`, with the program's registers as they are (rcx and r11 are the
    // scratch registers: `syscall` clobbers them itself).
    a.cmp(rax, 511)?;
    a.ja(slow)?;
    a.mov(rcx, fast)?;
    a.mov(r11, rax)?;
    a.shr(r11, 6)?;
    a.mov(r11, qword_ptr(rcx + r11 * 8))?;
    a.bt(r11, rax)?;
    a.jnc(slow)?;
    a.mov(rcx, gadget)?;
    a.call(rcx)?;
    a.mov(r11, qword_ptr(rsp))?;
    a.mov(r11, qword_ptr(r11))?;
    a.lea(rsp, ptr(rsp + (8 + 128)))?;
    a.jmp(r11)?;
    a.set_label(&mut slow)?;
    a.lea(rsp, ptr(rsp - PT_REGS_SIZE))?;
    // The flags are rebuilt (lahf/seto), not saved exactly, and not restored: the status
    // flags are dead across a `syscall` of libc's (GCC's x86 inline assembly always clobbers
    // them; glibc's assembly tests the result after the call), DF is clear before and after
    // (System V), and nothing here changes another flag. `pushfq`/`popfq` cost tens of
    // cycles on this project's virtualised machine.
    save_gprs_f(&mut a, false)?;
    if full {
        fp_save(&mut a, fp, SaveKind::Full)?;
    } else {
        syscall_fp_save(&mut a, fp)?;
    }
    a.mov(rdi, rbx)?;
    a.mov(rsi, qword_ptr(rbx + PT_REGS_SIZE))?;
    a.mov(rax, dispatch)?;
    a.call(rax)?;
    a.mov(qword_ptr(rbx + PT_REGS_SIZE), rax)?;
    if full {
        fp_restore(&mut a, fp, SaveKind::Full)?;
    } else {
        syscall_fp_restore(&mut a, fp)?;
    }
    restore_gprs_f(&mut a, false)?;
    a.mov(r11, qword_ptr(rsp + PT_REGS_SIZE))?;
    a.lea(rsp, ptr(rsp + (PT_REGS_SIZE + 8 + 128)))?;
    a.jmp(r11)?;
    a.assemble(ip)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every combination of FP state the machine may have (no XSAVE: `fxsave64`; XSAVE with
    /// x87/SSE only, with AVX, with AVX-512; with and without XINUSE) makes every shared stub.
    #[test]
    fn shared_stubs_assemble_for_every_fp_state() {
        let states = [
            FpSave { xsave: false, size: 512, avx: false, avx512: false, xinuse: false },
            FpSave { xsave: true, size: 576, avx: false, avx512: false, xinuse: false },
            FpSave { xsave: true, size: 576, avx: false, avx512: false, xinuse: true },
            FpSave { xsave: true, size: 832, avx: true, avx512: false, xinuse: false },
            FpSave { xsave: true, size: 832, avx: true, avx512: false, xinuse: true },
            FpSave { xsave: true, size: 2688, avx: true, avx512: true, xinuse: true },
        ];
        let at = 0x7f00_0000_0000u64;
        for fp in states {
            for kind in [SaveKind::Full, SaveKind::Light(8), SaveKind::Light(2)] {
                let entry = common_entry(at, fp, kind, at + 0x10_0000);
                assert!(entry.is_ok_and(|c| !c.is_empty()), "entry stub, {fp:?}, {kind:?}");
                let ret = ret_tramp(at, fp, kind, at + 0x10_0000);
                assert!(ret.is_ok_and(|c| !c.is_empty()), "return trampoline, {fp:?}, {kind:?}");
            }
        }
    }
}
