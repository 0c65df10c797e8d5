//! The transfer function of each instruction and the checks it makes (the kernel's
//! `check_alu_op`, `check_mem_access`, `check_cond_jmp_op`, `check_helper_call`,
//! `check_func_call`, `prepare_func_exit`, `check_return_code`), with the kernel's messages.

use userbpf_isa::*;

use crate::MAX_CALL_FRAMES;
use crate::explore::{Fail, Next, Verifier};
use crate::helpers::{self, Arg, Ret};
use crate::reg::{Reg, RegType};
use crate::scalar::{AluOp, Rel, Scalar};
use crate::stack::{Byte, MAX_STACK, ReadError, SLOT, Stack, locate};
use crate::state::{Frame, RefState, State};

/// The kernel's `BPF_MAX_VAR_OFF`: largest variable offset a pointer may carry.
const MAX_VAR_OFF: i64 = 1 << 29;
/// The kernel's `BPF_MAX_VAR_SIZ`: largest size a helper memory argument may have.
const MAX_VAR_SIZ: u64 = 1 << 29;

/// The kernel's `bpf_alu_string`.
fn alu_str(code: u8) -> &'static str {
    match code {
        BPF_ADD => "+=",
        BPF_SUB => "-=",
        BPF_MUL => "*=",
        BPF_DIV => "/=",
        BPF_OR => "|=",
        BPF_AND => "&=",
        BPF_LSH => "<<=",
        BPF_RSH => ">>=",
        BPF_NEG => "neg",
        BPF_MOD => "%=",
        BPF_XOR => "^=",
        BPF_MOV => "=",
        BPF_ARSH => "s>>=",
        _ => "endian",
    }
}

/// Whether a memory access reads or writes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Access {
    Read,
    Write,
}

impl Verifier<'_> {
    /// Processes the instruction at `pc` on `st`.
    pub fn step(&mut self, st: &mut State, pc: usize) -> Result<Next, Fail> {
        let insn = self.insns[pc];
        match insn.class() {
            BPF_ALU | BPF_ALU64 => {
                self.check_alu(st, insn)?;
                Ok(Next::Goto(pc + 1))
            }
            BPF_LDX => {
                self.read_reg(st, insn.src)?;
                self.write_reg_check(insn.dst)?;
                let size = insn.size_bytes() as i64;
                let loaded = self.mem_access(st, pc, insn.src, insn.off as i64, size, Access::Read, None)?;
                let mut r = loaded.unwrap_or_else(Reg::unknown);
                if insn.mode() == BPF_MEMSX && r.is_scalar() {
                    r = Reg::scalar(r.val.sign_extend(size as u32));
                }
                st.cur_mut().regs[insn.dst as usize] = r;
                Ok(Next::Goto(pc + 1))
            }
            BPF_STX if insn.mode() == BPF_ATOMIC => {
                self.check_atomic(st, pc, insn)?;
                Ok(Next::Goto(pc + 1))
            }
            BPF_STX => {
                self.read_reg(st, insn.src)?;
                self.read_reg(st, insn.dst)?;
                let value = st.cur().regs[insn.src as usize];
                self.mem_access(
                    st,
                    pc,
                    insn.dst,
                    insn.off as i64,
                    insn.size_bytes() as i64,
                    Access::Write,
                    Some(value),
                )?;
                Ok(Next::Goto(pc + 1))
            }
            BPF_ST => {
                self.read_reg(st, insn.dst)?;
                let size = insn.size_bytes() as u32;
                let v = (insn.imm as i64 as u64) & if size == 8 { u64::MAX } else { (1u64 << (size * 8)) - 1 };
                self.mem_access(st, pc, insn.dst, insn.off as i64, size as i64, Access::Write, Some(Reg::constant(v)))?;
                Ok(Next::Goto(pc + 1))
            }
            BPF_LD => {
                if !insn.is_lddw() {
                    return Err("BPF_LD_[ABS|IND] instructions not allowed for this program type".into());
                }
                self.write_reg_check(insn.dst)?;
                let r = self.check_lddw(pc, insn)?;
                st.cur_mut().regs[insn.dst as usize] = r;
                Ok(Next::Goto(pc + 2))
            }
            _ => self.check_jmp(st, pc, insn),
        }
    }

    /// The value of register `r` (a scalar) decides safety here: it must be precise.
    fn demand_reg(&mut self, st: &State, r: u8) {
        if st.cur().regs[r as usize].is_scalar() {
            self.demand.regs |= 1 << r;
        }
    }

    /// `check_reg_arg(SRC_OP)`: a register read must have been written.
    fn read_reg(&self, st: &State, r: u8) -> Result<Reg, Fail> {
        let reg = st.cur().regs[r as usize];
        if reg.typ == RegType::NotInit {
            return Err(format!("R{r} !read_ok"));
        }
        Ok(reg)
    }

    /// `check_reg_arg(DST_OP)`: r10 cannot be written.
    fn write_reg_check(&self, r: u8) -> Result<(), Fail> {
        if r == FRAME_REG {
            return Err("frame pointer is read only".into());
        }
        Ok(())
    }

    fn map(&self, key: u32) -> Result<&crate::MapInfo, Fail> {
        if key & crate::INNER_MAP != 0 {
            let outer = key & !crate::INNER_MAP;
            let m = self.opts.maps.get(&outer).ok_or_else(|| format!("fd {outer} is not pointing to valid bpf_map"))?;
            return m
                .inner
                .as_deref()
                .ok_or_else(|| format!("the inner map of map {} ({}) is not known", outer, m.name));
        }
        self.opts.maps.get(&key).ok_or_else(|| format!("fd {key} is not pointing to valid bpf_map"))
    }

    fn check_lddw(&mut self, pc: usize, insn: Insn) -> Result<Reg, Fail> {
        let next = self.insns[pc + 1];
        match insn.src {
            0 => Ok(Reg::constant(insn.wide_imm(next))),
            BPF_PSEUDO_MAP_FD | BPF_PSEUDO_MAP_IDX => {
                let key = insn.imm as u32;
                self.map(key)?;
                Ok(Reg { map: key, ..Reg::pointer(RegType::MapPtr) })
            }
            BPF_PSEUDO_MAP_VALUE | BPF_PSEUDO_MAP_IDX_VALUE => {
                let key = insn.imm as u32;
                let m = self.map(key)?;
                if m.map_type != helpers::ARRAY {
                    return Err("no direct value access support for this map type".into());
                }
                let off = next.imm as u32;
                if off >= m.value_size {
                    return Err(format!("invalid access to map value pointer, value_size={} off={off}", m.value_size));
                }
                Ok(Reg { map: key, off: off as i32, ..Reg::pointer(RegType::MapValue) })
            }
            BPF_PSEUDO_FUNC => {
                let target = (pc as i64 + insn.imm as i64 + 1) as usize;
                Ok(Reg { off: target as i32, ..Reg::pointer(RegType::Func) })
            }
            BPF_PSEUDO_BTF_ID => Err("ksym (BPF_PSEUDO_BTF_ID) loads are not supported".into()),
            s => Err(format!("invalid bpf_ld_imm64 insn (src {s})")),
        }
    }

    // ---- ALU ----

    fn check_alu(&mut self, st: &mut State, insn: Insn) -> Result<(), Fail> {
        let alu64 = insn.class() == BPF_ALU64;
        let code = insn.code();
        let (d, s) = (insn.dst as usize, insn.src as usize);
        let privileged = self.opts.privileged;
        if code == BPF_NEG || code == BPF_END {
            let dst = self.read_reg(st, insn.dst)?;
            self.write_reg_check(insn.dst)?;
            if dst.is_pointer() && !privileged {
                return Err(format!("R{d} pointer arithmetic prohibited"));
            }
            let r = if !dst.is_scalar() {
                Reg::unknown()
            } else if code == BPF_NEG {
                Reg::scalar(Scalar::constant(0).alu(AluOp::Sub, &dst.val, alu64))
            } else if insn.source() == BPF_TO_LE && !alu64 {
                // To little endian on a little-endian machine: a truncation.
                match insn.imm {
                    16 => Reg::scalar(dst.val.alu(AluOp::And, &Scalar::constant(0xffff), true)),
                    32 => Reg::scalar(dst.val.zext32()),
                    _ => Reg::scalar(dst.val),
                }
            } else {
                Reg::scalar(Scalar::unknown_bytes(insn.imm as u32 / 8))
            };
            st.cur_mut().regs[d] = r;
            return Ok(());
        }
        if code == BPF_MOV {
            self.write_reg_check(insn.dst)?;
            let r = if insn.source() == BPF_X {
                let src = self.read_reg(st, insn.src)?;
                if insn.off != 0 {
                    // movsx
                    if !src.is_scalar() {
                        if !privileged {
                            return Err(format!("R{s} sign-extension part of pointer"));
                        }
                        Reg::unknown()
                    } else {
                        let v = src.val.sign_extend(insn.off as u32 / 8);
                        Reg::scalar(if alu64 { v } else { v.zext32() })
                    }
                } else if alu64 {
                    let mut src = src;
                    if src.is_scalar() && !src.val.is_const() && src.id == 0 {
                        // Link the copies: a bounds check on one bounds both.
                        src.id = self.new_id();
                        st.cur_mut().regs[s] = src;
                    }
                    src
                } else if src.is_scalar() {
                    Reg::scalar(src.val.zext32())
                } else {
                    if !privileged {
                        return Err(format!("R{s} partial copy of pointer"));
                    }
                    Reg::scalar(Scalar::UNKNOWN.zext32())
                }
            } else if alu64 {
                Reg::constant(insn.imm as i64 as u64)
            } else {
                Reg::constant(insn.imm as u32 as u64)
            };
            st.cur_mut().regs[d] = r;
            return Ok(());
        }
        let dst = self.read_reg(st, insn.dst)?;
        let src = if insn.source() == BPF_X {
            self.read_reg(st, insn.src)?
        } else {
            if matches!(code, BPF_DIV | BPF_MOD) && insn.imm == 0 {
                return Err("div by zero".into());
            }
            if matches!(code, BPF_LSH | BPF_RSH | BPF_ARSH) {
                let width = if alu64 { 64 } else { 32 };
                if insn.imm < 0 || insn.imm >= width {
                    return Err(format!("invalid shift {}", insn.imm));
                }
            }
            Reg::constant(if alu64 { insn.imm as i64 as u64 } else { insn.imm as u32 as u64 })
        };
        self.write_reg_check(insn.dst)?;
        let result = match (dst.is_pointer(), src.is_pointer()) {
            (true, true) => {
                if code == BPF_SUB && privileged {
                    Reg::unknown()
                } else {
                    return Err(format!("R{d} pointer {} pointer prohibited", alu_str(code)));
                }
            }
            (true, false) => {
                if insn.source() == BPF_X {
                    self.demand_reg(st, insn.src);
                }
                self.ptr_alu(d, &dst, &src, code, alu64, false)?
            }
            (false, true) => {
                self.demand_reg(st, insn.dst);
                self.ptr_alu(d, &src, &dst, code, alu64, true)?
            }
            (false, false) => {
                let op = match code {
                    BPF_ADD => Some(AluOp::Add),
                    BPF_SUB => Some(AluOp::Sub),
                    BPF_MUL => Some(AluOp::Mul),
                    BPF_AND => Some(AluOp::And),
                    BPF_OR => Some(AluOp::Or),
                    BPF_XOR => Some(AluOp::Xor),
                    BPF_LSH => Some(AluOp::Lsh),
                    BPF_RSH => Some(AluOp::Rsh),
                    BPF_ARSH => Some(AluOp::Arsh),
                    _ => None,
                };
                Reg::scalar(match op {
                    Some(op) => dst.val.alu(op, &src.val, alu64),
                    None if alu64 => Scalar::UNKNOWN,
                    None => Scalar::UNKNOWN.zext32(),
                })
            }
        };
        st.cur_mut().regs[d] = result;
        Ok(())
    }

    /// The kernel's `adjust_ptr_min_max_vals`: pointer plus or minus a scalar.
    fn ptr_alu(
        &mut self,
        d: usize,
        ptr: &Reg,
        off: &Reg,
        code: u8,
        alu64: bool,
        scalar_is_dst: bool,
    ) -> Result<Reg, Fail> {
        let name = ptr.typ.name();
        if !alu64 {
            if code == BPF_SUB && self.opts.privileged {
                return Ok(Reg::scalar(Scalar::UNKNOWN.zext32()));
            }
            return Err(format!("R{d} 32-bit pointer arithmetic prohibited"));
        }
        if ptr.typ.maybe_null() {
            return Err(format!("R{d} pointer arithmetic on {name} prohibited, null-check it first"));
        }
        let known = off.val.const_value();
        match ptr.typ {
            RegType::Ctx
            | RegType::MapValue
            | RegType::MapKey
            | RegType::Stack
            | RegType::Mem
            | RegType::RingbufMem
            | RegType::Func => {}
            RegType::MapPtr if known == Some(0) && code == BPF_ADD => {}
            _ => return Err(format!("R{d} pointer arithmetic on {name} prohibited")),
        }
        match code {
            BPF_ADD => {}
            BPF_SUB if scalar_is_dst => return Err(format!("R{d} tried to subtract pointer from scalar")),
            BPF_SUB if ptr.typ == RegType::Stack => {
                return Err(format!("R{d} subtraction from stack pointer prohibited"));
            }
            BPF_SUB => {}
            BPF_AND | BPF_OR | BPF_XOR => {
                return Err(format!("R{d} bitwise operator {} on pointer prohibited", alu_str(code)));
            }
            _ => return Err(format!("R{d} pointer arithmetic with {} operator prohibited", alu_str(code))),
        }
        // The kernel's check_reg_sane_offset on both operands.
        if let Some(v) = known {
            let v = v as i64;
            if v >= MAX_VAR_OFF || v <= -MAX_VAR_OFF {
                return Err(format!("math between {name} pointer and {v} is not allowed"));
            }
        }
        if off.val.smin <= -MAX_VAR_OFF {
            return Err(format!("value {} makes {name} pointer be out of bounds", off.val.smin));
        }
        if (ptr.off as i64) >= MAX_VAR_OFF || (ptr.off as i64) <= -MAX_VAR_OFF {
            return Err(format!("{name} pointer offset {} is not allowed", ptr.off));
        }
        let mut r = *ptr;
        match known {
            Some(v) => {
                let v = v as i64;
                let new = if code == BPF_ADD { ptr.off as i64 + v } else { ptr.off as i64 - v };
                if new >= MAX_VAR_OFF || new <= -MAX_VAR_OFF {
                    return Err(format!("{name} pointer offset {new} is not allowed"));
                }
                r.off = new as i32;
            }
            None => {
                let op = if code == BPF_ADD { AluOp::Add } else { AluOp::Sub };
                r.val = ptr.val.alu(op, &off.val, true);
                if r.val.smin <= -MAX_VAR_OFF || r.val.smin >= MAX_VAR_OFF {
                    // The kernel refuses such pointers when they are used; keep the bounds.
                }
            }
        }
        Ok(r)
    }

    // ---- memory ----

    /// The kernel's `check_mem_access`: an access of `size` bytes at `off` from register
    /// `regno`. Returns the value read.
    #[allow(clippy::too_many_arguments)]
    fn mem_access(
        &mut self,
        st: &mut State,
        pc: usize,
        regno: u8,
        off: i64,
        size: i64,
        access: Access,
        value: Option<Reg>,
    ) -> Result<Option<Reg>, Fail> {
        let reg = st.cur().regs[regno as usize];
        let write = access == Access::Write;
        let privileged = self.opts.privileged;
        if write
            && let Some(v) = value
            && v.is_pointer()
            && !privileged
            && reg.typ != RegType::Stack
        {
            return Err(format!(
                "R{regno} leaks addr into {}",
                if reg.typ == RegType::MapValue { "map" } else { "mem" }
            ));
        }
        match reg.typ {
            RegType::Ctx => {
                if !reg.val.is_const() {
                    return Err(format!("variable ctx access var_off={} disallowed", reg.val.var));
                }
                if reg.off != 0 || reg.val.var.value != 0 {
                    return Err(format!(
                        "dereference of modified ctx ptr R{regno} off={} disallowed",
                        reg.off as i64 + reg.val.var.value as i64
                    ));
                }
                let arg_write =
                    write && crate::overrides::arg_write_ok(self.opts.prog_type, self.opts.writable_args, off, size);
                if !arg_write && !self.opts.prog_type.ctx_access_ok(off, size, write) {
                    let hint =
                        if write { crate::overrides::ctx_write_hint(self.opts.prog_type, off, size) } else { "" };
                    return Err(format!("invalid bpf_context access off={off} size={size}{hint}"));
                }
                if arg_write && value.is_some_and(|v| v.is_pointer()) {
                    // The value's register: the source of the BPF_STX at `pc`.
                    return Err(format!("R{} leaks addr into ctx", self.insns[pc].src));
                }
                Ok(Some(Reg::scalar(Scalar::unknown_bytes(size as u32))))
            }
            RegType::Stack => self.stack_access(st, pc, regno, &reg, off, size, access, value),
            RegType::MapValue | RegType::MapKey => {
                let m = self.map(reg.map)?.clone();
                let (region, region_size) =
                    if reg.typ == RegType::MapKey { ("map key", m.key_size) } else { ("map value", m.value_size) };
                if write && reg.typ == RegType::MapValue && m.readonly {
                    return Err(format!(
                        "write into map forbidden, value_size={} off={} size={size}",
                        m.value_size,
                        reg.off as i64 + off
                    ));
                }
                let start = self.region_check(regno, &reg, off, size, region_size, |o| {
                    format!(
                        "invalid access to {region}, {}_size={region_size} off={o} size={size}",
                        if reg.typ == RegType::MapKey { "key" } else { "value" }
                    )
                })?;
                if !write
                    && let (Some(data), Some(start)) = (&m.frozen, start)
                    && let Some(bytes) = data.get(start as usize..(start + size) as usize)
                {
                    let mut b = [0u8; 8];
                    b[..size as usize].copy_from_slice(bytes);
                    return Ok(Some(Reg::constant(u64::from_le_bytes(b))));
                }
                Ok(Some(Reg::scalar(Scalar::unknown_bytes(size as u32))))
            }
            RegType::Mem | RegType::RingbufMem => {
                let mem_size = reg.mem_size;
                self.region_check(regno, &reg, off, size, mem_size, |o| {
                    format!("invalid access to memory, mem_size={mem_size} off={o} size={size}")
                })?;
                Ok(Some(Reg::scalar(Scalar::unknown_bytes(size as u32))))
            }
            RegType::NotInit => Err(format!("R{regno} !read_ok")),
            t => Err(format!("R{regno} invalid mem access '{}'", t.name())),
        }
    }

    /// Bounds of an access to a region of `region_size` bytes (the kernel's
    /// `check_mem_region_access`). Returns the start offset when it is constant.
    fn region_check(
        &self,
        regno: u8,
        reg: &Reg,
        off: i64,
        size: i64,
        region_size: u32,
        msg: impl Fn(i64) -> String,
    ) -> Result<Option<i64>, Fail> {
        let base = reg.off as i64 + off;
        if let Some(v) = reg.val.const_value() {
            let start = base + v as i64;
            if start < 0 || start + size > region_size as i64 {
                return Err(msg(start));
            }
            return Ok(Some(start));
        }
        if reg.val.smin < 0 && (reg.val.smin == i64::MIN || base + reg.val.smin < 0) {
            return Err(format!(
                "R{regno} min value is negative, either use unsigned index or do a if (index >=0) check."
            ));
        }
        if base + reg.val.smin < 0 {
            return Err(msg(base + reg.val.smin));
        }
        if reg.val.umax >= MAX_VAR_OFF as u64 {
            return Err(format!("R{regno} unbounded memory access, make sure to bound the register with and if/else"));
        }
        if base + reg.val.umax as i64 + size > region_size as i64 {
            return Err(msg(base + reg.val.umax as i64));
        }
        Ok(None)
    }

    /// Stack accesses: aligned, within the frame's 512 bytes, reads of initialised bytes
    /// (unless privileged), spills and fills of whole registers.
    #[allow(clippy::too_many_arguments)]
    fn stack_access(
        &mut self,
        st: &mut State,
        _pc: usize,
        regno: u8,
        reg: &Reg,
        off: i64,
        size: i64,
        access: Access,
        value: Option<Reg>,
    ) -> Result<Option<Reg>, Fail> {
        let write = access == Access::Write;
        let verb = if write { " write to" } else { " read from" };
        let base = reg.off as i64 + off;
        let frame = reg.frame as usize;
        self.touched_var_stack = !reg.val.is_const();
        if let Some(v) = reg.val.const_value() {
            let start = base + v as i64;
            if (-MAX_STACK..0).contains(&start) {
                self.touched_slot = Some((frame as u8, locate(start).0 as u8));
            }
            if start % size != 0 {
                return Err(format!("misaligned stack access off {}+{}+{off} size {size}", reg.val.var, reg.off));
            }
            if start < -MAX_STACK || start + size > 0 {
                return Err(format!("invalid{verb} stack R{regno} off={base} size={size}"));
            }
            self.note_depth(st, frame, start);
            let stack = &mut st.frames[frame].stack;
            if write {
                let v = value.expect("a write has a value");
                if size == SLOT as i64 && (v.is_pointer() || (v.is_scalar() && !v.is_null()) || v.is_null()) {
                    if v.is_null() {
                        stack.write_bytes(start, size, Byte::Zero);
                    } else {
                        stack.spill(start, v);
                    }
                } else {
                    if v.is_pointer() && !self.opts.privileged {
                        return Err(format!("R{regno} partial copy of pointer"));
                    }
                    match v.val.const_value().filter(|_| v.is_scalar() && start % SLOT as i64 == 0) {
                        Some(c) => stack.store_narrow_const(start, size, c),
                        None => stack.write_bytes(start, size, if v.is_null() { Byte::Zero } else { Byte::Misc }),
                    }
                }
                return Ok(None);
            }
            return match stack.read(start, size, self.opts.privileged) {
                Ok(r) => Ok(Some(r)),
                Err(ReadError::Uninit(o)) => {
                    Err(format!("invalid read from stack R{regno} off {}+{} size {size}", start, o - start))
                }
                Err(ReadError::PartialFill) => Err("invalid size of register fill".into()),
            };
        }
        // Variable offset.
        if reg.val.smax >= MAX_VAR_OFF || reg.val.smin <= -MAX_VAR_OFF {
            return Err(format!("invalid unbounded variable-offset{verb} stack R{regno}"));
        }
        let min = reg.val.smin + base;
        let max = reg.val.smax + base + size;
        if min < -MAX_STACK || max > 0 {
            return Err(format!(
                "invalid variable-offset{verb} stack R{regno} var_off={} off={base} size={size}",
                reg.val.var
            ));
        }
        if !reg.val.var.is_aligned(size as u64) || (base.rem_euclid(size)) != 0 {
            return Err(format!("misaligned stack access off {}+{}+{off} size {size}", reg.val.var, reg.off));
        }
        self.note_depth(st, frame, min);
        let stack = &mut st.frames[frame].stack;
        if write {
            let v = value.expect("a write has a value");
            let zero = v.is_null();
            for o in min..max {
                let b = stack.byte(o);
                let nb = if zero && b == Byte::Zero { Byte::Zero } else { Byte::Misc };
                stack.write_bytes(o, 1, nb);
            }
            return Ok(None);
        }
        for o in min..max {
            if stack.byte(o) == Byte::Invalid && !self.opts.privileged {
                return Err(format!(
                    "invalid variable-offset read from stack R{regno} var_off={} off={base} size={size}",
                    reg.val.var
                ));
            }
            let (s, _) = locate(o);
            let slot = stack.slot(s);
            if slot.is_spill() && slot.spilled.is_pointer() && !self.opts.privileged {
                return Err(format!("leaking pointer from stack off {o}"));
            }
        }
        Ok(Some(Reg::scalar(Scalar::unknown_bytes(size as u32))))
    }

    fn note_depth(&mut self, st: &State, frame: usize, off: i64) {
        let f = st.frames[frame].func;
        self.depth[f] = self.depth[f].max((-off) as u32);
    }

    fn check_atomic(&mut self, st: &mut State, pc: usize, insn: Insn) -> Result<(), Fail> {
        let op = insn.imm;
        let base_op = op & !BPF_FETCH;
        let known =
            matches!(base_op as u8, BPF_ADD | BPF_OR | BPF_AND | BPF_XOR) || op == BPF_XCHG || op == BPF_CMPXCHG;
        if !known {
            return Err(format!("BPF_ATOMIC uses invalid atomic opcode {op:02x}"));
        }
        if insn.size() != BPF_W && insn.size() != BPF_DW {
            return Err("invalid atomic operand size".into());
        }
        self.read_reg(st, insn.src)?;
        self.read_reg(st, insn.dst)?;
        if op == BPF_CMPXCHG {
            self.read_reg(st, 0)?;
            if st.cur().regs[0].is_pointer() && !self.opts.privileged {
                return Err("R0 leaks addr into mem".into());
            }
        }
        let src = st.cur().regs[insn.src as usize];
        if src.is_pointer() && !self.opts.privileged {
            return Err(format!("R{} leaks addr into mem", insn.src));
        }
        let dst = st.cur().regs[insn.dst as usize];
        if dst.typ == RegType::Ctx {
            return Err(format!("BPF_ATOMIC stores into R{} ctx is not allowed", insn.dst));
        }
        let size = insn.size_bytes() as i64;
        self.mem_access(st, pc, insn.dst, insn.off as i64, size, Access::Read, None)?;
        self.mem_access(st, pc, insn.dst, insn.off as i64, size, Access::Write, Some(Reg::unknown()))?;
        let out = Reg::scalar(Scalar::unknown_bytes(size as u32));
        if op == BPF_CMPXCHG {
            st.cur_mut().regs[0] = out;
        } else if op & BPF_FETCH != 0 {
            self.write_reg_check(insn.src)?;
            st.cur_mut().regs[insn.src as usize] = out;
        }
        Ok(())
    }

    // ---- jumps, calls, exits ----

    fn check_jmp(&mut self, st: &mut State, pc: usize, insn: Insn) -> Result<Next, Fail> {
        let is32 = insn.class() == BPF_JMP32;
        match insn.code() {
            BPF_JA => {
                let off = if is32 { insn.imm as i64 } else { insn.off as i64 };
                Ok(Next::Goto((pc as i64 + off + 1) as usize))
            }
            BPF_EXIT => self.check_exit(st, pc),
            BPF_CALL => {
                if insn.source() == BPF_X {
                    return Err("callx (call by register) is not supported".into());
                }
                match insn.src {
                    BPF_PSEUDO_CALL => self.check_func_call(st, pc, (pc as i64 + insn.imm as i64 + 1) as usize, false),
                    BPF_PSEUDO_KFUNC_CALL => Err("calling kernel functions is not supported".into()),
                    _ => self.check_helper(st, pc, insn.imm),
                }
            }
            code => {
                let rel = match code {
                    BPF_JEQ => Rel::Eq,
                    BPF_JNE => Rel::Ne,
                    BPF_JGT => Rel::Ugt,
                    BPF_JGE => Rel::Uge,
                    BPF_JLT => Rel::Ult,
                    BPF_JLE => Rel::Ule,
                    BPF_JSGT => Rel::Sgt,
                    BPF_JSGE => Rel::Sge,
                    BPF_JSLT => Rel::Slt,
                    BPF_JSLE => Rel::Sle,
                    BPF_JSET => Rel::Set,
                    c => return Err(format!("invalid BPF_JMP/JMP32 opcode {c:x}")),
                };
                let target = (pc as i64 + insn.off as i64 + 1) as usize;
                self.check_cond(st, pc, insn, rel, is32, target)
            }
        }
    }

    fn check_cond(
        &mut self,
        st: &mut State,
        pc: usize,
        insn: Insn,
        rel: Rel,
        is32: bool,
        target: usize,
    ) -> Result<Next, Fail> {
        let dst = self.read_reg(st, insn.dst)?;
        let src_is_reg = insn.source() == BPF_X;
        let src = if src_is_reg { self.read_reg(st, insn.src)? } else { Reg::constant(insn.imm as i64 as u64) };
        // Null checks of a pointer that may be NULL.
        let null_check = !is32 && matches!(rel, Rel::Eq | Rel::Ne);
        for (is_dst, p, other) in [(true, dst, src), (false, src, dst)] {
            if !src_is_reg && !is_dst {
                continue;
            }
            if p.is_pointer() && other.is_null() && null_check {
                if src_is_reg {
                    self.demand_reg(st, if is_dst { insn.src } else { insn.dst });
                }
                if p.typ.maybe_null() {
                    let mut null_state = st.clone();
                    mark_null_check(&mut null_state, &p, true);
                    mark_null_check(st, &p, false);
                    // Eq: taken when NULL.
                    return Ok(if rel == Rel::Eq {
                        Next::Fork(pc + 1, Box::new(null_state), target)
                    } else {
                        Next::Fork(pc + 1, Box::new(std::mem::replace(st, null_state)), target)
                    });
                }
                // A pointer that cannot be NULL.
                return Ok(Next::Goto(if rel == Rel::Eq { pc + 1 } else { target }));
            }
        }
        if dst.is_pointer() || src.is_pointer() {
            if !self.opts.privileged {
                return Err(format!(
                    "R{} pointer comparison prohibited",
                    if dst.is_pointer() { insn.dst } else { insn.src }
                ));
            }
            let other = Box::new(st.clone());
            return Ok(Next::Fork(pc + 1, other, target));
        }
        let decided = |v: &mut Self, st: &State| {
            v.demand_reg(st, insn.dst);
            if src_is_reg {
                v.demand_reg(st, insn.src);
            }
        };
        match Scalar::branch_taken(&dst.val, &src.val, rel, is32) {
            Some(true) => {
                decided(self, st);
                Ok(Next::Goto(target))
            }
            Some(false) => {
                decided(self, st);
                Ok(Next::Goto(pc + 1))
            }
            None => {
                let mut taken = st.clone();
                let ok_taken = refine(&mut taken, insn, src_is_reg, rel, is32);
                let ok_fall = refine(st, insn, src_is_reg, rel.negate(), is32);
                if !(ok_taken && ok_fall) {
                    decided(self, &taken);
                }
                match (ok_fall, ok_taken) {
                    (true, true) => Ok(Next::Fork(pc + 1, Box::new(taken), target)),
                    (true, false) => Ok(Next::Goto(pc + 1)),
                    (false, true) => {
                        *st = taken;
                        Ok(Next::Goto(target))
                    }
                    (false, false) => Err("both branches of a conditional jump are impossible (verifier bug)".into()),
                }
            }
        }
    }

    fn check_func_call(&mut self, st: &mut State, pc: usize, target: usize, callback: bool) -> Result<Next, Fail> {
        if st.frames.len() >= MAX_CALL_FRAMES {
            return Err(format!("the call stack of {} frames is too deep !", st.frames.len() + 1));
        }
        let func = self.cfg.func_of(target);
        let caller = st.cur().regs;
        let mut regs = [Reg::NOT_INIT; 11];
        let frame_no = st.frames.len() as u8;
        if !callback {
            regs[1..=5].copy_from_slice(&caller[1..=5]);
        }
        regs[10] = Reg { frame: frame_no, ..Reg::pointer(RegType::Stack) };
        st.frames.push(Frame { regs, stack: Stack::default(), callsite: pc, func, callback });
        Ok(Next::Goto(target))
    }

    fn check_exit(&mut self, st: &mut State, _pc: usize) -> Result<Next, Fail> {
        // As the kernel, a function may return without setting r0 (a void function): the
        // caller may not read it then.
        let r0 = st.cur().regs[0];
        if st.frames.len() == 1 || st.cur().callback {
            self.read_reg(st, 0)?;
        }
        if st.frames.len() > 1 {
            let callee = st.frames.pop().expect("more than one frame");
            if r0.typ == RegType::Stack && r0.frame as usize == st.frames.len() {
                return Err("cannot return stack pointer to the caller".into());
            }
            let caller = st.cur_mut();
            let ret = callee.callsite + 1;
            if callee.callback {
                self.demand.regs |= 1;
                if !r0.is_scalar() || r0.val.umax > 1 {
                    return Err(format!("At callback return the register R0 has {} should have been in [0, 1]", r0));
                }
                // Back to the helper call, which may call the callback again or return.
                return Ok(Next::Goto(callee.callsite));
            }
            caller.regs[0] = r0;
            for r in 1..=5 {
                caller.regs[r] = Reg::NOT_INIT;
            }
            return Ok(Next::Goto(ret));
        }
        if let Some(r) = st.refs.first() {
            return Err(format!("Unreleased reference id={} alloc_insn={}", r.id, r.insn));
        }
        if r0.is_pointer() && !self.opts.privileged {
            return Err("R0 leaks addr as return value".into());
        }
        Ok(Next::Done)
    }

    /// Pushes the frame of a `bpf_loop` callback: r1 the index, r2 the callback context.
    /// When the callback returns, the walk goes back to the helper call, which may call it
    /// again (with the state it left) or return: the kernel's model of callbacks as loops.
    fn enter_callback(&mut self, st: &mut State, callsite: usize, target: usize, cb_ctx: Reg) -> Result<(), Fail> {
        self.check_func_call(st, callsite, target, true)?;
        let f = st.cur_mut();
        f.regs[1] = Reg::scalar(Scalar::unknown_bytes(4));
        f.regs[2] = cb_ctx;
        Ok(())
    }

    /// `check_bpf_snprintf_call`: a format in a frozen map is checked when loading, with as
    /// many arguments as `data_len` (r5) gives; `data_len` must be a multiple of 8.
    fn check_snprintf_format(&self, st: &State, valid: fn(&[u8], usize) -> bool) -> Result<(), Fail> {
        let (fmt, len) = (self.read_reg(st, 3)?, self.read_reg(st, 5)?);
        let Some(data_len) = len.val.const_value() else { return Ok(()) };
        if data_len % 8 != 0 {
            return Err("Invalid format string: data_len is not a multiple of 8".into());
        }
        let m = self.map(fmt.map)?;
        let (Some(data), Some(v)) = (&m.frozen, fmt.val.const_value()) else { return Ok(()) };
        let start = (fmt.off as i64 + v as i64) as usize;
        let Some(text) = data.get(start..).and_then(|d| d.split(|&b| b == 0).next()) else { return Ok(()) };
        if !valid(text, (data_len / 8) as usize) {
            return Err("Invalid format string".into());
        }
        Ok(())
    }

    /// The kernel's `check_helper_call`.
    fn check_helper(&mut self, st: &mut State, pc: usize, id: i32) -> Result<Next, Fail> {
        let idu = id as u32;
        let Some(proto) = helpers::proto(idu) else {
            return Err(if userbpf_isa::helper_names::helper_name(idu).is_some() {
                format!("helper {} (id {id}) is not supported", helpers::name(idu))
            } else {
                format!("invalid func unknown#{id}")
            });
        };
        crate::overrides::helper_allowed(self.opts.prog_type, idu)?;
        if !self.opts.gpl_compatible && helpers::GPL_ONLY.contains(&idu) {
            return Err("cannot call GPL-restricted function from non-GPL compatible program".into());
        }
        let privileged = self.opts.privileged;
        let mut map: Option<u32> = None;
        let mut release: Option<u32> = None;
        let mut alloc_size: Option<u32> = None;
        let mut callback: Option<usize> = None;
        for (i, &arg) in proto.args.iter().enumerate() {
            let regno = (i + 1) as u8;
            if arg == Arg::DontCare {
                continue;
            }
            let reg = self.read_reg(st, regno)?;
            let type_err = |expected: &str| format!("R{regno} type={} expected={expected}", reg.typ.name());
            match arg {
                Arg::DontCare | Arg::Anything => {
                    if reg.is_pointer() && !privileged {
                        return Err(format!("R{regno} leaks addr into helper function"));
                    }
                }
                Arg::ConstMapPtr => {
                    if reg.typ != RegType::MapPtr {
                        return Err(type_err("map_ptr"));
                    }
                    map = Some(reg.map);
                }
                Arg::MapKey | Arg::MapValue | Arg::UninitMapValue => {
                    let Some(mk) = map else { return Err("invalid map_ptr to access map->key".into()) };
                    let m = self.map(mk)?;
                    let size = if arg == Arg::MapKey { m.key_size } else { m.value_size };
                    if !matches!(reg.typ, RegType::Stack | RegType::MapKey | RegType::MapValue) {
                        return Err(type_err("fp, pkt, pkt_meta, map_key, map_value"));
                    }
                    if size == 0 {
                        // A map without keys (ring buffer, queue) given to a keyed helper:
                        // the kernel finds the empty key before the map's type.
                        return Err("invalid zero-sized read".into());
                    }
                    let access = if arg == Arg::UninitMapValue { Access::Write } else { Access::Read };
                    self.helper_mem(st, pc, regno, size as u64, access, arg == Arg::UninitMapValue)?;
                }
                Arg::Mem { nullable, .. } => {
                    if nullable {
                        self.demand_reg(st, regno);
                    }
                    if reg.is_null() && nullable {
                        continue;
                    }
                    if !matches!(
                        reg.typ,
                        RegType::Stack | RegType::MapKey | RegType::MapValue | RegType::Mem | RegType::RingbufMem
                    ) {
                        return Err(type_err(
                            "fp, pkt, pkt_meta, map_key, map_value, mem, ringbuf_mem, buf, trusted_ptr_",
                        ));
                    }
                    // Checked with the size argument that follows.
                }
                Arg::ConstSize | Arg::ConstSizeOrZero => {
                    if !reg.is_scalar() {
                        return Err(type_err("scalar"));
                    }
                    self.demand_reg(st, regno);
                    let Arg::Mem { write, uninit, .. } = proto.args[i - 1] else {
                        unreachable!("a size follows a memory argument")
                    };
                    let mem = st.cur().regs[i];
                    if reg.val.smin < 0 {
                        return Err(format!("R{regno} min value is negative, either use unsigned or 'var &= const'"));
                    }
                    if reg.val.umin == 0 && arg == Arg::ConstSize {
                        return Err(format!(
                            "R{regno} invalid zero-sized read: u64=[{},{}]",
                            reg.val.umin, reg.val.umax
                        ));
                    }
                    if reg.val.umax >= MAX_VAR_SIZ {
                        return Err(format!(
                            "R{regno} unbounded memory access, use 'var &= const' or 'if (var < const)'"
                        ));
                    }
                    if mem.is_null() {
                        continue;
                    }
                    if reg.val.umax > 0 {
                        let access = if write { Access::Write } else { Access::Read };
                        self.helper_mem(st, pc, regno - 1, reg.val.umax, access, uninit)?;
                    }
                }
                Arg::Ctx => {
                    if reg.typ != RegType::Ctx {
                        return Err(type_err("ctx"));
                    }
                    if reg.off != 0 || reg.val.const_value() != Some(0) {
                        return Err(format!("dereference of modified ctx ptr R{regno} off={} disallowed", reg.off));
                    }
                }
                Arg::RingbufRelease => {
                    if reg.typ != RegType::RingbufMem {
                        return Err(type_err("ringbuf_mem"));
                    }
                    if reg.off != 0 || reg.val.const_value() != Some(0) {
                        return Err(format!("R{regno} must have zero offset when passed to release func"));
                    }
                    if reg.ref_obj_id == 0 || !st.refs.iter().any(|r| r.id == reg.ref_obj_id) {
                        return Err(format!("R{regno} reference has not been acquired before"));
                    }
                    release = Some(reg.ref_obj_id);
                }
                Arg::AllocSize => {
                    self.demand_reg(st, regno);
                    let Some(v) = reg.val.const_value().filter(|_| reg.is_scalar()) else {
                        return Err(format!("R{regno} is not a known constant'"));
                    };
                    alloc_size = Some(v as u32);
                }
                Arg::Func => {
                    if reg.typ != RegType::Func {
                        return Err(type_err("func"));
                    }
                    callback = Some(reg.off as usize);
                }
                Arg::StackOrNull => {
                    self.demand_reg(st, regno);
                    if !(reg.is_null() || reg.typ == RegType::Stack) {
                        return Err(type_err("fp"));
                    }
                }
                Arg::ConstStr => {
                    if reg.typ != RegType::MapValue {
                        return Err(type_err("map_value"));
                    }
                    let m = self.map(reg.map)?;
                    if !m.readonly {
                        return Err(format!("R{regno} does not point to a readonly map'"));
                    }
                    let Some(v) = reg.val.const_value() else {
                        return Err(format!("R{regno} is not a constant address'"));
                    };
                    if let Some(data) = &m.frozen {
                        let start = (reg.off as i64 + v as i64) as usize;
                        if !data.get(start..).is_some_and(|d| d.contains(&0)) {
                            return Err("string is not zero-terminated".into());
                        }
                    }
                }
                Arg::LongOut => {
                    if !matches!(reg.typ, RegType::Stack | RegType::MapValue | RegType::Mem | RegType::RingbufMem) {
                        return Err(type_err("fp, map_value, mem"));
                    }
                    self.helper_mem(st, pc, regno, 8, Access::Write, true)?;
                }
            }
        }
        if idu == 165
            && let Some(valid) = self.opts.snprintf_format
        {
            self.check_snprintf_format(st, valid)?;
        }
        // As the kernel, a lookup in an array with a constant key below max_entries cannot
        // fail: its result needs no null check.
        let (mut const_key, mut map_entries) = (None, 0u64);
        if let Some(mk) = map {
            let m = self.map(mk)?;
            helpers::check_map_compat(idu, m.map_type)?;
            if idu == 1 && matches!(m.map_type, helpers::ARRAY | helpers::PERCPU_ARRAY) {
                map_entries = m.max_entries as u64;
                const_key = self.const_stack_key(st, m.key_size as i64);
            }
        }
        if idu == 12 && !st.refs.is_empty() {
            return Err("tail_call would lead to reference leak".into());
        }
        if let Some(ref_id) = release {
            st.refs.retain(|r| r.id != ref_id);
            let replacement = if privileged { Reg::unknown() } else { Reg::NOT_INIT };
            st.for_each_reg(|r| {
                if r.ref_obj_id == ref_id {
                    *r = replacement;
                }
            });
        }
        if let Some(target) = callback {
            // bpf_loop: the callback runs with (index, callback context), possibly never.
            let cb_ctx = st.cur().regs[3];
            let mut after = st.clone();
            {
                let f = after.cur_mut();
                f.regs[0] = Reg::unknown();
                for r in 1..=5 {
                    f.regs[r] = Reg::NOT_INIT;
                }
            }
            self.enter_callback(st, pc, target, cb_ctx)?;
            return Ok(Next::Fork(target, Box::new(after), pc + 1));
        }
        let r0 = match proto.ret {
            Ret::Integer => Reg::unknown(),
            Ret::Void => Reg::NOT_INIT,
            Ret::MapValueOrNull => {
                let id = self.new_id();
                let key = map.unwrap_or(0);
                let outer_type = self.map(key)?.map_type;
                if matches!(outer_type, 12 | 13) {
                    // A map of maps: the result is an inner map.
                    self.map(key | crate::INNER_MAP)?;
                    Reg { map: key | crate::INNER_MAP, id, ..Reg::pointer(RegType::MapPtrOrNull) }
                } else {
                    let typ = if const_key.is_some_and(|k| k < map_entries) {
                        RegType::MapValue
                    } else {
                        RegType::MapValueOrNull
                    };
                    Reg { map: key, id, ..Reg::pointer(typ) }
                }
            }
            Ret::AllocMemOrNull => {
                let id = self.new_id();
                let ref_id = self.new_id();
                st.refs.push(RefState { id: ref_id, insn: pc });
                Reg {
                    id,
                    ref_obj_id: ref_id,
                    mem_size: alloc_size.unwrap_or(0),
                    ..Reg::pointer(RegType::RingbufMemOrNull)
                }
            }
        };
        let f = st.cur_mut();
        f.regs[0] = r0;
        for r in 1..=5 {
            f.regs[r] = Reg::NOT_INIT;
        }
        Ok(Next::Goto(pc + 1))
    }

    /// The constant a map key argument (r2) points to on the stack, if known.
    fn const_stack_key(&mut self, st: &State, size: i64) -> Option<u64> {
        let reg = st.cur().regs[2];
        if reg.typ != RegType::Stack || !(1..=8).contains(&size) {
            return None;
        }
        let off = reg.off as i64 + reg.val.const_value()? as i64;
        if off < -MAX_STACK || off + size > 0 || off % size != 0 {
            return None;
        }
        let (spi, _) = locate(off);
        let r = st.frames[reg.frame as usize].stack.read(off, size, false).ok()?;
        let key = if r.is_scalar() { r.val.const_value() } else { None }?;
        // The result's nullness depends on the key's value: precise, as the kernel's
        // `get_constant_map_key` marks it (only when the key is a known constant).
        self.demand.add_slot(reg.frame as usize, spi);
        Some(key)
    }

    /// Memory a helper reads or writes through register `regno`: `size` bytes from the
    /// pointer (the kernel's `check_helper_mem_access`). Writes of helpers that accept
    /// uninitialised memory (`uninit`) initialise the stack bytes; reads need initialised
    /// stack (unless privileged).
    fn helper_mem(
        &mut self,
        st: &mut State,
        pc: usize,
        regno: u8,
        size: u64,
        access: Access,
        uninit: bool,
    ) -> Result<(), Fail> {
        let reg = st.cur().regs[regno as usize];
        if reg.typ != RegType::Stack {
            if access == Access::Write && reg.typ == RegType::MapValue && self.map(reg.map)?.readonly {
                return Err(format!("R{regno} cannot write into rdonly map value"));
            }
            return self.mem_access_range(st, pc, regno, size, access);
        }
        // Stack: every byte the helper may touch.
        let base = reg.off as i64;
        let (min, max) = match reg.val.const_value() {
            Some(v) => (base + v as i64, base + v as i64 + size as i64),
            None => {
                if reg.val.smax >= MAX_VAR_OFF || reg.val.smin <= -MAX_VAR_OFF {
                    return Err(format!("invalid unbounded variable-offset indirect access to stack R{regno}"));
                }
                (base + reg.val.smin, base + reg.val.smax + size as i64)
            }
        };
        if min < -MAX_STACK || max > 0 {
            return Err(if reg.val.is_const() {
                format!("invalid indirect access to stack R{regno} off={min} size={size}")
            } else {
                format!(
                    "invalid variable-offset indirect access to stack R{regno} var_off={} off={base} size={size}",
                    reg.val.var
                )
            });
        }
        self.note_depth(st, reg.frame as usize, min);
        let stack = &mut st.frames[reg.frame as usize].stack;
        if access == Access::Write && uninit {
            if reg.val.is_const() {
                stack.write_bytes(min, max - min, Byte::Misc);
            } else {
                for o in min..max {
                    if stack.byte(o) != Byte::Invalid {
                        stack.write_bytes(o, 1, Byte::Misc);
                    }
                }
            }
            return Ok(());
        }
        for o in min..max {
            let b = stack.byte(o);
            let (s, _) = locate(o);
            let slot = stack.slot(s);
            if b == Byte::Invalid && !self.opts.privileged {
                return Err(if reg.val.is_const() {
                    format!("invalid indirect read from stack R{regno} off {}+{} size {size}", min, o - min)
                } else {
                    format!(
                        "invalid variable-offset indirect access to stack R{regno} var_off={} off={base} size={size}",
                        reg.val.var
                    )
                });
            }
            if slot.is_spill() && slot.spilled.is_pointer() && !self.opts.privileged {
                return Err(format!("R{regno} leaks addr into helper function"));
            }
        }
        if access == Access::Write {
            // Bytes the helper writes become unknown data (spills are broken).
            for o in min..max {
                let (s, _) = locate(o);
                if stack.slot(s).is_spill() {
                    stack.write_bytes(o, 1, Byte::Misc);
                }
            }
        }
        Ok(())
    }

    /// A helper's access to `size` bytes of a non-stack region.
    fn mem_access_range(
        &mut self,
        st: &mut State,
        pc: usize,
        regno: u8,
        size: u64,
        access: Access,
    ) -> Result<(), Fail> {
        let reg = st.cur().regs[regno as usize];
        let (region_size, what) = match reg.typ {
            RegType::MapValue => (self.map(reg.map)?.value_size, "map value"),
            RegType::MapKey => (self.map(reg.map)?.key_size, "map key"),
            RegType::Mem | RegType::RingbufMem => (reg.mem_size, "memory"),
            t => return Err(format!("R{regno} invalid mem access '{}'", t.name())),
        };
        let _ = (pc, access);
        let size = size as i64;
        let sz_name = match reg.typ {
            RegType::MapValue => "value_size",
            RegType::MapKey => "key_size",
            _ => "mem_size",
        };
        self.region_check(regno, &reg, 0, size, region_size, |o| {
            format!("invalid access to {what}, {sz_name}={region_size} off={o} size={size}")
        })?;
        Ok(())
    }
}

/// After a null check of `p`: on the NULL side every copy of it (same id) becomes the
/// scalar 0 and its reference is dropped; on the other side every copy becomes non-null.
fn mark_null_check(st: &mut State, p: &Reg, is_null: bool) {
    let id = p.id;
    if is_null && p.ref_obj_id != 0 {
        st.refs.retain(|r| r.id != p.ref_obj_id);
    }
    st.for_each_reg(|r| {
        if r.id == id && r.typ.maybe_null() {
            if is_null {
                *r = Reg::constant(0);
            } else {
                r.typ = r.typ.non_null();
            }
        }
    });
}

/// Refines both operands of a scalar comparison on one side of the branch, and every
/// register linked to them (same id). False when that side cannot happen.
fn refine(st: &mut State, insn: Insn, src_is_reg: bool, rel: Rel, is32: bool) -> bool {
    let f = st.cur_mut();
    let mut a = f.regs[insn.dst as usize];
    let mut b = if src_is_reg { f.regs[insn.src as usize] } else { Reg::constant(insn.imm as i64 as u64) };
    if !Scalar::refine(&mut a.val, &mut b.val, rel, is32) {
        return false;
    }
    f.regs[insn.dst as usize] = a;
    if src_is_reg {
        f.regs[insn.src as usize] = b;
    }
    for r in [a, b] {
        if r.id != 0 && r.is_scalar() && (src_is_reg || r == a) {
            let (id, val) = (r.id, r.val);
            st.for_each_reg(|x| {
                if x.id == id && x.is_scalar() {
                    x.val = val;
                }
            });
        }
    }
    true
}
