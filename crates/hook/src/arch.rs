//! x86-64 code generation: the shared entry/return stubs, the per-site stub,
//! and relocation of the displaced instructions (iced-x86).
//!
//! ## Entry path
//! ```text
//! target:        jmp rel32 site_stub                      (5 bytes, patched)
//! site_stub:     lea rsp,[rsp-128]        ; step over the red zone (probes inside functions)
//!                push qword [rip+site]    ; the Site*
//!                jmp  qword [rip+common]
//! relocated:     <displaced instructions, relocated>
//!                jmp target+len
//! common_entry:  lea rsp,[rsp-168]        ; struct pt_regs at rsp, Site* at rsp+168
//!                mov [rsp+off], reg  x15  ; every GPR but rsp
//!                pushfq / pop [rsp+144]   ; flags (nothing before touched them)
//!                rdi = Site*, rsi = regs, rbx = regs
//!                and rsp,-64 ; sub rsp,XSAVE ; xsave64/fxsave64 [rsp]   ; all FP/SSE/AVX state
//!                call entry_dispatch      ; -> rax = resume address, rdx = mode
//!                xrstor64/fxrstor64 ; rsp = rbx
//!                mode 0: [rsp+168] = rax ; restore flags+GPRs ; lea rsp,[rsp+168] ; ret 128
//!                mode 1: restore flags+GPRs ; lea rsp,[rsp+304] ; ret   (skip the function:
//!                        return to the caller with the handler-set ax)
//! ```
//! ## Return path
//! `ret_tramp` is reached by the probed function's `ret` (its return address
//! was replaced): it builds a pt_regs the same way (slot for the real return
//! address at rsp+168), calls `ret_dispatch` which pops the shadow stack and
//! runs the return handlers, then `ret`s to the original return address.

use iced_x86::code_asm::*;
use iced_x86::{
    BlockEncoder, BlockEncoderOptions, Code, Decoder, DecoderOptions, FlowControl, Instruction,
    InstructionBlock,
};

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
/// Distance from the pt_regs of the entry path to the probed rsp.
pub(crate) const ENTRY_FRAME: usize = 168 + 8 + 128;

/// How the FP/vector state is saved around handlers.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FpSave {
    pub xsave: bool,
    /// bytes, multiple of 64
    pub size: i32,
}

pub(crate) fn detect_fpsave() -> FpSave {
    let l1 = core::arch::x86_64::__cpuid(1);
    let osxsave = l1.ecx & (1 << 27) != 0;
    if osxsave {
        // Leaf 0xD exists when OSXSAVE is set; ebx = size for the enabled XCR0.
        let d = core::arch::x86_64::__cpuid_count(0xD, 0);
        let size = (d.ebx as i32).max(576);
        return FpSave {
            xsave: true,
            size: (size + 63) & !63,
        };
    }
    FpSave {
        xsave: false,
        size: 512,
    }
}

fn save_gprs(a: &mut CodeAssembler) -> Result<(), IcedError> {
    for (r, off) in REG_OFFSETS {
        a.mov(qword_ptr(rsp + off), r)?;
    }
    a.pushfq()?;
    a.pop(qword_ptr(rsp + FLAGS_OFF))?;
    Ok(())
}

fn restore_gprs(a: &mut CodeAssembler) -> Result<(), IcedError> {
    a.push(qword_ptr(rsp + FLAGS_OFF))?;
    a.popfq()?;
    for (r, off) in REG_OFFSETS {
        a.mov(r, qword_ptr(rsp + off))?;
    }
    Ok(())
}

/// Emits: rbx = rsp (pt_regs); align; save FP state. Leaves rdi/rsi intact.
fn fp_save(a: &mut CodeAssembler, fp: FpSave) -> Result<(), IcedError> {
    a.mov(rbx, rsp)?;
    a.and(rsp, -64)?;
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
    Ok(())
}

fn fp_restore(a: &mut CodeAssembler, fp: FpSave) -> Result<(), IcedError> {
    if fp.xsave {
        a.mov(eax, -1)?;
        a.mov(edx, -1)?;
        a.xrstor64(ptr(rsp))?;
    } else {
        a.fxrstor64(ptr(rsp))?;
    }
    a.mov(rsp, rbx)?;
    Ok(())
}

/// The shared entry stub, assembled for address `ip`.
pub(crate) fn common_entry(ip: u64, fp: FpSave, dispatch: u64) -> Result<Vec<u8>, IcedError> {
    let mut a = CodeAssembler::new(64)?;
    a.lea(rsp, ptr(rsp - PT_REGS_SIZE))?;
    save_gprs(&mut a)?;
    a.mov(rdi, qword_ptr(rsp + PT_REGS_SIZE))?;
    a.mov(rsi, rsp)?;
    fp_save(&mut a, fp)?;
    a.mov(rax, dispatch)?;
    a.call(rax)?;
    a.mov(r12, rax)?;
    a.mov(r13, rdx)?;
    fp_restore(&mut a, fp)?;
    let mut skip = a.create_label();
    a.test(r13, r13)?;
    a.jnz(skip)?;
    a.mov(qword_ptr(rsp + PT_REGS_SIZE), r12)?;
    restore_gprs(&mut a)?;
    a.lea(rsp, ptr(rsp + PT_REGS_SIZE))?;
    a.ret_1(128)?; // pops the target (rsp = orig-128), then skips the red zone
    a.set_label(&mut skip)?;
    restore_gprs(&mut a)?;
    a.lea(rsp, ptr(rsp + ENTRY_FRAME as i32))?;
    a.ret()?;
    a.assemble(ip)
}

/// The shared return trampoline, assembled for address `ip`.
pub(crate) fn ret_tramp(ip: u64, fp: FpSave, dispatch: u64) -> Result<Vec<u8>, IcedError> {
    let mut a = CodeAssembler::new(64)?;
    a.lea(rsp, ptr(rsp - (PT_REGS_SIZE + 8)))?;
    save_gprs(&mut a)?;
    a.mov(rdi, rsp)?;
    fp_save(&mut a, fp)?;
    a.mov(rax, dispatch)?;
    a.call(rax)?;
    a.mov(r12, rax)?;
    fp_restore(&mut a, fp)?;
    a.mov(qword_ptr(rsp + PT_REGS_SIZE), r12)?;
    restore_gprs(&mut a)?;
    a.lea(rsp, ptr(rsp + PT_REGS_SIZE))?;
    a.ret()?;
    a.assemble(ip)
}

/// Offset of the relocated code inside a site page.
pub(crate) const RELOC_OFF: usize = 64;

/// The per-site stub (placed at the start of the site page).
pub(crate) fn site_stub(ip: u64, site: u64, common: u64) -> Result<Vec<u8>, IcedError> {
    let mut a = CodeAssembler::new(64)?;
    let mut site_l = a.create_label();
    let mut common_l = a.create_label();
    a.lea(rsp, ptr(rsp - 128))?;
    a.push(qword_ptr(site_l))?;
    a.jmp(qword_ptr(common_l))?;
    a.int3()?;
    a.set_label(&mut site_l)?;
    a.dq(&[site])?;
    a.set_label(&mut common_l)?;
    a.dq(&[common])?;
    a.assemble(ip)
}

/// The instructions displaced by the 5-byte jump.
pub(crate) struct Displaced {
    pub instrs: Vec<Instruction>,
    /// bytes covered (>= 5)
    pub len: usize,
}

pub(crate) const JMP_LEN: usize = 5;

/// Decodes whole instructions at `addr` covering at least 5 bytes, refusing
/// what cannot be moved. `code` is the readable code from `addr` (up to the
/// end of the mapping or of the function).
pub(crate) fn decode_displaced(addr: u64, code: &[u8]) -> Result<Displaced, String> {
    let mut dec = Decoder::with_ip(64, code, addr, DecoderOptions::NONE);
    let mut instrs = Vec::new();
    let mut len = 0usize;
    while len < JMP_LEN {
        if !dec.can_decode() {
            return Err(format!(
                "function too short: only {len} bytes of code before its end"
            ));
        }
        let ins = dec.decode();
        if ins.is_invalid() {
            return Err(format!("invalid instruction at offset {len}"));
        }
        let end = len + ins.len();
        match ins.flow_control() {
            FlowControl::Return
            | FlowControl::UnconditionalBranch
            | FlowControl::IndirectBranch
                if end < JMP_LEN =>
            {
                return Err(format!(
                    "function too short: `{:?}` at offset {len} ends the code flow inside the first {JMP_LEN} bytes",
                    ins.mnemonic()
                ));
            }
            FlowControl::Call | FlowControl::IndirectCall => {
                return Err(format!(
                    "a call at offset {len} is among the displaced instructions (its return address would point into the patch)"
                ));
            }
            FlowControl::Interrupt | FlowControl::Exception => {
                return Err(format!(
                    "`{:?}` at offset {len} (breakpoint/trap) cannot be relocated",
                    ins.mnemonic()
                ));
            }
            FlowControl::XbeginXabortXend => {
                return Err(format!(
                    "transactional `{:?}` at offset {len} cannot be relocated",
                    ins.mnemonic()
                ));
            }
            _ => {}
        }
        instrs.push(ins);
        len = end;
    }
    Ok(Displaced { instrs, len })
}

/// Scans the function `[start, start+code.len())` for a branch whose target
/// lies strictly inside the patched bytes `(addr, addr+len)`.
pub(crate) fn check_branches_into(
    start: u64,
    code: &[u8],
    addr: u64,
    len: usize,
) -> Result<(), String> {
    let mut dec = Decoder::with_ip(64, code, start, DecoderOptions::NONE);
    let lo = addr + 1;
    let hi = addr + len as u64;
    while dec.can_decode() {
        let ins = dec.decode();
        if ins.is_invalid() {
            continue;
        }
        let is_branch = ins.is_jcc_short_or_near()
            || ins.is_jmp_short_or_near()
            || ins.is_call_near()
            || ins.is_loop()
            || ins.is_loopcc()
            || ins.is_jcx_short();
        if is_branch {
            let t = ins.near_branch_target();
            if t >= lo && t < hi {
                return Err(format!(
                    "the instruction at {:#x} branches to {t:#x}, inside the {len} patched bytes",
                    ins.ip()
                ));
            }
        }
    }
    Ok(())
}

/// Relocates the displaced instructions to `at`, followed by a jump back to
/// `back`. Returns the code and the new address of each displaced instruction.
pub(crate) fn relocate(d: &Displaced, at: u64, back: u64) -> Result<(Vec<u8>, Vec<u64>), String> {
    let mut instrs = d.instrs.clone();
    let jmp = Instruction::with_branch(Code::Jmp_rel32_64, back).map_err(|e| e.to_string())?;
    instrs.push(jmp);
    let block = InstructionBlock::new(&instrs, at);
    let res = BlockEncoder::encode(
        64,
        block,
        BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS,
    )
    .map_err(|e| format!("cannot relocate the displaced instructions: {e}"))?;
    let mut addrs = Vec::with_capacity(d.instrs.len());
    for (i, off) in res
        .new_instruction_offsets
        .iter()
        .take(d.instrs.len())
        .enumerate()
    {
        if *off == u32::MAX {
            return Err(format!(
                "instruction {i} of the displaced bytes could not be placed"
            ));
        }
        addrs.push(at + u64::from(*off));
    }
    Ok((res.code_buffer, addrs))
}
