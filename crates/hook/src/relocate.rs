//! Moving the instructions a patch displaces out of line (iced-x86's decoder and block
//! encoder): which instructions may move ([`decode_displaced`]), and their re-encoding at the
//! site page with RIP-relative operands and branches fixed up ([`relocate`]). A `call` moved
//! last is emulated (push of the original return address, then a jump) unless the thread has
//! a shadow stack. Errors are the reason, as text, that a probe cannot be placed there.

use iced_x86::{
    BlockEncoder, BlockEncoderOptions, Code, Decoder, DecoderOptions, FlowControl, Instruction, InstructionBlock,
};

/// The instructions displaced by a patch (see `placement`), moved out of line.
pub(crate) struct Displaced {
    pub instrs: Vec<Instruction>,
    /// bytes covered
    pub len: usize,
}

pub(crate) const JMP_LEN: usize = 5;

/// The reason given for an `int3` met where a probe would go: it is not the program's (code
/// does not contain breakpoints), so someone planted it at run time.
pub(crate) fn int3_holder(at: u64) -> String {
    format!(
        "the byte at {at:#x} is already `int3` (0xCC): most likely a kernel uprobe (the kernel \
         writes int3 over the first byte of the instruction it probes) or a debugger's breakpoint \
         holds this address; remove it, or probe another instruction"
    )
}

/// Decodes whole instructions at `addr` covering at least `need` bytes of `code` (the
/// readable code from `addr` up to the end of the function or mapping), refusing what
/// cannot be run out of line: the code flow ending (`ret`, `jmp`) before `need` bytes, a
/// `call` whose return address would land inside them (a call is moved only as the last
/// displaced instruction: its return address is then the original next instruction), traps,
/// transactional instructions.
pub(crate) fn decode_displaced(addr: u64, code: &[u8], need: usize) -> Result<Displaced, String> {
    let mut dec = Decoder::with_ip(64, code, addr, DecoderOptions::NONE);
    let mut instrs = Vec::new();
    let mut len = 0usize;
    while len < need {
        if !dec.can_decode() {
            return Err(format!(
                "too short: only {len} bytes of code from the probed address to the function's end, {need} needed"
            ));
        }
        let ins = dec.decode();
        if ins.is_invalid() {
            return Err(format!("invalid instruction at offset {len}"));
        }
        let end = len + ins.len();
        match ins.flow_control() {
            FlowControl::Return | FlowControl::UnconditionalBranch | FlowControl::IndirectBranch if end < need => {
                return Err(format!(
                    "too short: `{:?}` at offset {len} ends the code flow inside the first {need} bytes",
                    ins.mnemonic()
                ));
            }
            FlowControl::Call | FlowControl::IndirectCall if is_syscall(&ins) && end < need => {
                return Err(format!(
                    "a system call (`{:?}`) at offset {len} is among the displaced instructions (a thread blocked in it would resume inside the patch)",
                    ins.mnemonic()
                ));
            }
            FlowControl::Call | FlowControl::IndirectCall if is_syscall(&ins) => {}
            FlowControl::Call | FlowControl::IndirectCall if end < need => {
                return Err(format!(
                    "a call at offset {len} is among the displaced instructions (its return address would point into the patch)"
                ));
            }
            FlowControl::Call | FlowControl::IndirectCall
                if !matches!(ins.code(), Code::Call_rel32_64 | Code::Call_rm64) =>
            {
                return Err(format!("the far call at offset {len} cannot be moved"));
            }
            FlowControl::Interrupt | FlowControl::Exception if ins.code() == Code::Int3 => {
                return Err(int3_holder(ins.ip()));
            }
            FlowControl::Interrupt | FlowControl::Exception => {
                return Err(format!("`{:?}` at offset {len} (breakpoint/trap) cannot be relocated", ins.mnemonic()));
            }
            FlowControl::XbeginXabortXend => {
                return Err(format!("transactional `{:?}` at offset {len} cannot be relocated", ins.mnemonic()));
            }
            _ => {}
        }
        instrs.push(ins);
        len = end;
    }
    Ok(Displaced { instrs, len })
}

/// `syscall` and its kin: classed as calls, but they return to the next instruction wherever
/// they run, so a relocated one works (a thread blocked in it resumes in the copy).
fn is_syscall(ins: &Instruction) -> bool {
    use iced_x86::Mnemonic::*;
    matches!(ins.mnemonic(), Syscall | Sysenter)
}

/// A moved `call` (the last displaced instruction): the original return address is pushed
/// (without touching the flags: `lea`, two 32-bit stores), then a `jmp` to the callee, so the
/// callee returns to the original code after the patch and the stack holds what the `call`
/// would have pushed (backtraces and return probes see the real caller).
fn emulate_call(ins: &Instruction) -> Result<Vec<Instruction>, String> {
    use iced_x86::{MemoryOperand, Register};
    let e = |x: iced_x86::IcedError| x.to_string();
    let ret = ins.next_ip();
    let at_rsp = |d: i64| MemoryOperand::with_base_displ(Register::RSP, d);
    let mut out = vec![
        Instruction::with2(Code::Lea_r64_m, Register::RSP, at_rsp(-8)).map_err(e)?,
        Instruction::with2(Code::Mov_rm32_imm32, at_rsp(0), ret as u32).map_err(e)?,
        Instruction::with2(Code::Mov_rm32_imm32, at_rsp(4), (ret >> 32) as u32).map_err(e)?,
    ];
    let jmp = if ins.code() == Code::Call_rel32_64 {
        Instruction::with_branch(Code::Jmp_rel32_64, ins.near_branch_target()).map_err(e)?
    } else {
        let mut j = *ins;
        j.set_code(Code::Jmp_rm64);
        if j.op0_kind() == iced_x86::OpKind::Register && j.op0_register() == Register::RSP {
            return Err("`call rsp` cannot be moved".into());
        }
        if j.op0_kind() == iced_x86::OpKind::Memory && j.memory_base() == Register::RSP {
            // rsp is 8 lower after the push: the operand is 8 further.
            j.set_memory_displacement64(j.memory_displacement64().wrapping_add(8));
            j.set_memory_displ_size(4);
        }
        j
    };
    out.push(jmp);
    for i in &mut out {
        i.set_ip(0);
    }
    Ok(out)
}

/// Whether this thread runs with a CET shadow stack (`arch_prctl(ARCH_SHSTK_STATUS)`, Linux
/// 6.6+; enabled by glibc 2.39+ for binaries marked for it). A moved `call` is then a real
/// `call` from the relocated copy (its return address points there and the copy's jump takes
/// the thread back), since a return address pushed by hand is not on the shadow stack and
/// the callee's `ret` would fault.
fn shadow_stack() -> bool {
    const ARCH_SHSTK_STATUS: i32 = 0x5005;
    let mut features = 0u64;
    // SAFETY: arch_prctl writes the feature mask into the local; an older kernel fails with
    // EINVAL and writes nothing.
    let r = unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_SHSTK_STATUS, &mut features as *mut u64) };
    r == 0 && features & 1 != 0
}

/// Relocates the displaced instructions to `at`, followed by a jump back to
/// `back`. Returns the code and the new address of each displaced instruction.
///
/// A branch from one displaced instruction to another (not the first) goes to its moved
/// copy; a branch to the first goes to the original address, through the probe again, as
/// it would with the kernel's uprobe (the first instruction's ip is hidden from the block
/// encoder for that).
pub(crate) fn relocate(d: &Displaced, at: u64, back: u64) -> Result<(Vec<u8>, Vec<u64>), String> {
    let mut instrs = Vec::with_capacity(d.instrs.len() + 5);
    let mut first_of = Vec::with_capacity(d.instrs.len());
    for (i, ins) in d.instrs.iter().enumerate() {
        first_of.push(instrs.len());
        if matches!(ins.flow_control(), FlowControl::Call | FlowControl::IndirectCall)
            && !is_syscall(ins)
            && !shadow_stack()
        {
            instrs.extend(emulate_call(ins)?);
        } else {
            let mut ins = *ins;
            if i == 0 {
                ins.set_ip(0);
            }
            instrs.push(ins);
        }
    }
    let jmp = Instruction::with_branch(Code::Jmp_rel32_64, back).map_err(|e| e.to_string())?;
    instrs.push(jmp);
    let block = InstructionBlock::new(&instrs, at);
    let res = BlockEncoder::encode(64, block, BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS)
        .map_err(|e| format!("cannot relocate the displaced instructions: {e}"))?;
    let mut addrs = Vec::with_capacity(d.instrs.len());
    for (i, k) in first_of.iter().enumerate() {
        let off = res.new_instruction_offsets[*k];
        if off == u32::MAX {
            return Err(format!("instruction {i} of the displaced bytes could not be placed"));
        }
        addrs.push(at + u64::from(off));
    }
    Ok((res.code_buffer, addrs))
}
