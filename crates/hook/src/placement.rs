//! Where and how a probe is planted: the choice between an inline jump, a jump extending into
//! the alignment padding after the function, and a breakpoint.
//!
//! 1. **Inline jump** ([`Method::Jump`]): the 5-byte `jmp rel32` over whole instructions at the
//!    probed address, which run from their relocated copy after the handlers. It needs 5 bytes
//!    of the function from the probed address in which the code flow does not end (`ret`,
//!    `jmp`), a `call` only as the last of them (it is moved as a push of the original return
//!    address and a jump, see `relocate::relocate`), and no branch from elsewhere in the function
//!    landing strictly inside the 5 bytes (it would land in the middle of the `jmp`). Branches
//!    between displaced instructions are moved with them; a branch to the probed address
//!    itself goes through the probe again, as with the kernel.
//! 2. **Padding** ([`Method::Padding`]): when the code from the probed address to the
//!    function's end is shorter than 5 bytes and ends the code flow (`ret`, `jmp`: a 1-byte
//!    `ret`, `lea eax,[rdi+rdi*2]; ret`), the `jmp` extends into the bytes after the function
//!    when they are alignment padding: the symbol table (`.symtab`, else `.dynsym`) must show
//!    no symbol between the function's end and the next symbol, and every byte there must
//!    decode as `int3` or `nop` (see `symbols::gap_after`). The whole rest of the function is
//!    relocated.
//! 3. **Breakpoint** ([`Method::Breakpoint`]): otherwise a one-byte `int3` at the probed
//!    address. The engine's `SIGTRAP` handler (`patch`) recognises the address and sends the
//!    thread to the site's stub, the same stub a jump reaches: the handlers run there (after
//!    the signal returned), then the displaced instruction from its relocated copy. The cost
//!    of a hit is the signal's delivery and `rt_sigreturn`, two kernel entries, never a
//!    kernel uprobe.
//!
//! System call wrappers: a thread meeting a breakpoint pays a signal delivery and
//! `rt_sigreturn` on every call (the agent's own threads call `read`, `write`, `futex`... all
//! the time), about a hundred times the jump's cost. With glibc 2.36 (x86-64) every wrapper a
//! system call tracepoint hooks takes the inline jump (the instructions before the `syscall`,
//! such as `mov eax, NR` or the test of `__libc_single_threaded`, give the five bytes); the
//! breakpoint stays the fallback for a libc whose
//! wrapper has no room, as nothing else in the process sees a call libc makes from its own
//! text (system call user dispatch leaves libc's range alone).
//!
//! The function's code is analysed from its symbol's extent with iced-x86: instructions are
//! decoded by following the code flow from the function's start (every direct branch and
//! fall-through), and by a linear sweep of the whole extent (which
//! reaches blocks only an indirect jump leads to); the branch targets of both are checked. A
//! probe address inside an instruction is refused. What the analysis cannot see: targets of
//! indirect jumps (jump tables), which compilers place at case labels, never within the first
//! bytes of a function.
//!
//! `endbr64`: a function starting with it keeps it (the patch goes after it), so an indirect
//! call or jump still lands on an `endbr64` should indirect-branch tracking be enforced (Linux
//! does not enforce IBT in user space today, and this machine's CPU reports neither IBT nor
//! shadow stacks). A user shadow stack (Linux 6.6+, glibc 2.39+) is kept consistent: the
//! stubs pair their calls and returns, a SIGTRAP's frame is the kernel's, and a moved `call`
//! stays a real `call` when the thread has a shadow stack (`relocate::relocate`). The registers are the same before and after `endbr64`, so
//! handlers see the function's address as `ip`.
//!
//! Bytes of another site's patch are read as their original bytes.
//!
//! Limits: a kernel uprobe registered on the same file *after* a probe was planted here (the
//! kernel writes its `int3` into every process mapping the file) takes over a breakpoint site
//! (the kernel handles the trap, the SIGTRAP never comes) and breaks a jump (its `int3` lands
//! on the `jmp`'s first byte and the kernel then runs the file's original instruction followed
//! by the jump's remaining bytes); one registered before is detected and named. Under a
//! debugger, a breakpoint probe's SIGTRAP stops the debugger, which must pass it on (gdb:
//! `handle SIGTRAP nostop noprint pass`).

use std::collections::BTreeSet;

use iced_x86::{Decoder, DecoderOptions, FlowControl, Instruction};

use crate::FuncExtent;
use crate::relocate::{self, Displaced, JMP_LEN};

/// How a probe is planted (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Method {
    /// A 5-byte `jmp` over whole instructions of the function.
    Jump,
    /// A 5-byte `jmp` over the function's last instructions and the padding after it.
    Padding,
    /// A one-byte `int3` handled by the engine's `SIGTRAP` handler.
    Breakpoint,
}

impl Method {
    /// The bytes the patch writes.
    pub fn patch_len(self) -> usize {
        match self {
            Method::Jump | Method::Padding => JMP_LEN,
            Method::Breakpoint => 1,
        }
    }
}

pub(crate) struct Placement {
    pub method: Method,
    /// Where the patch goes (the probed address, or after its `endbr64`).
    pub patch_at: usize,
    pub disp: Displaced,
}

/// What `choose` needs to know about the code.
pub(crate) struct Code<'a> {
    /// The probed address.
    pub addr: usize,
    /// The function, when its extent is known.
    pub func: Option<FuncExtent>,
    /// Original bytes from `base` (at least to the function's end, or up to 64 bytes from
    /// `addr`), with other sites' patches undone.
    pub base: usize,
    pub bytes: &'a [u8],
    /// Whether the probe is at a function entry.
    pub is_entry: bool,
    /// Bytes of alignment padding after the function (0: none proven).
    pub padding: usize,
    /// Ranges `[start, end)` patched by other sites: a new patch must not overlap them.
    pub taken: &'a [(usize, usize)],
}

impl Code<'_> {
    fn at(&self, a: usize) -> &[u8] {
        self.bytes.get(a.saturating_sub(self.base)..).unwrap_or(&[])
    }
    fn end(&self) -> usize {
        self.func.map(|f| f.start + f.len).unwrap_or(self.base + self.bytes.len()).min(self.base + self.bytes.len())
    }
}

const ENDBR64: [u8; 4] = [0xF3, 0x0F, 0x1E, 0xFA];

/// The function's instructions and branches (see the module docs).
struct Flow {
    /// Instruction starts found by following the code flow.
    starts: BTreeSet<u64>,
    /// Bytes covered by those instructions (start, end).
    covered: Vec<(u64, u64)>,
    /// Instruction starts of the linear sweep.
    linear: BTreeSet<u64>,
    /// (branch instruction, its length, target) of both decodes.
    branches: Vec<(u64, u64, u64)>,
}

fn is_direct_branch(ins: &Instruction) -> bool {
    ins.is_jcc_short_or_near()
        || ins.is_jmp_short_or_near()
        || ins.is_call_near()
        || ins.is_loop()
        || ins.is_loopcc()
        || ins.is_jcx_short()
}

fn analyse(start: u64, code: &[u8], roots: &[u64]) -> Flow {
    let end = start + code.len() as u64;
    let mut f = Flow { starts: BTreeSet::new(), covered: Vec::new(), linear: BTreeSet::new(), branches: Vec::new() };
    let mut work: Vec<u64> = roots.to_vec();
    while let Some(mut ip) = work.pop() {
        while ip >= start && ip < end && !f.starts.contains(&ip) {
            let mut dec = Decoder::with_ip(64, &code[(ip - start) as usize..], ip, DecoderOptions::NONE);
            let ins = dec.decode();
            if ins.is_invalid() {
                break;
            }
            f.starts.insert(ip);
            f.covered.push((ip, ins.next_ip()));
            if is_direct_branch(&ins) {
                f.branches.push((ip, ins.len() as u64, ins.near_branch_target()));
                if !ins.is_call_near() {
                    work.push(ins.near_branch_target());
                }
            }
            match ins.flow_control() {
                FlowControl::Return
                | FlowControl::UnconditionalBranch
                | FlowControl::IndirectBranch
                | FlowControl::Interrupt
                | FlowControl::Exception => break,
                _ => ip = ins.next_ip(),
            }
        }
    }
    let mut dec = Decoder::with_ip(64, code, start, DecoderOptions::NONE);
    while dec.can_decode() {
        let ins = dec.decode();
        if ins.is_invalid() {
            continue;
        }
        f.linear.insert(ins.ip());
        if is_direct_branch(&ins) {
            f.branches.push((ins.ip(), ins.len() as u64, ins.near_branch_target()));
        }
    }
    f
}

/// Whether `addr` starts an instruction of the function: the flow-following decode decides
/// when it covers the byte, the linear sweep otherwise.
fn boundary_error(flow: &Flow, addr: u64, fstart: u64) -> Option<String> {
    if flow.starts.contains(&addr) {
        return None;
    }
    if let Some((s, e)) = flow.covered.iter().find(|(s, e)| *s < addr && addr < *e) {
        return Some(format!(
            "offset {} is not an instruction boundary: it is inside the instruction at offset {} ({} bytes)",
            addr - fstart,
            s - fstart,
            e - s
        ));
    }
    if flow.linear.contains(&addr) {
        return None;
    }
    let near: Vec<String> =
        flow.starts.range(addr.saturating_sub(16)..addr + 16).map(|s| format!("+{}", s - fstart)).collect();
    Some(format!(
        "offset {} is not an instruction boundary of the function (instructions nearby start at {})",
        addr - fstart,
        near.join(", ")
    ))
}

/// A branch from outside `[lo, lo+dlen)` landing strictly inside `(lo, lo+plen)` (the
/// patched bytes). Instructions starting inside the patched bytes are reached only through
/// their relocated copy, where their branches go to the copies; the original bytes of any
/// later instruction stay in place (a displaced instruction's tail, or the function's tail
/// when the padding method moves it) and may still be entered from elsewhere (a `.cold`
/// part, a jump table), so their branches count.
fn branch_into(flow: Option<&Flow>, lo: u64, dlen: u64, plen: u64) -> Result<(), String> {
    let Some(flow) = flow else { return Ok(()) };
    for &(src, _len, t) in &flow.branches {
        let inside_src = src >= lo && src < lo + dlen;
        if t > lo && t < lo + plen && !inside_src {
            return Err(format!(
                "the instruction at {src:#x} branches to {t:#x}, inside the {plen} bytes a jump would take"
            ));
        }
    }
    Ok(())
}

fn overlap(c: &Code, lo: usize, hi: usize) -> Result<(), String> {
    match c.taken.iter().find(|(s, e)| *s < hi && lo < *e) {
        Some((s, _)) => Err(format!("overlaps the patch of the probe at {s:#x}")),
        None => Ok(()),
    }
}

/// Picks the cheapest method that can be used at `c.addr` (see the module docs).
pub(crate) fn choose(c: &Code) -> Result<Placement, String> {
    let addr = c.addr;
    if c.at(addr).first() == Some(&0xCC) {
        return Err(relocate::int3_holder(addr as u64));
    }
    if c.taken.iter().any(|(s, e)| *s <= addr && addr < *e) {
        return Err("the address is inside the patched bytes of another probe".into());
    }
    let end = c.end();
    let flow = c.func.map(|f| {
        let code = &c.bytes[f.start - c.base..end - c.base];
        analyse(f.start as u64, code, &[f.start as u64])
    });
    if let (Some(fl), Some(f)) = (&flow, c.func)
        && let Some(e) = boundary_error(fl, addr as u64, f.start as u64)
    {
        return Err(e);
    }
    let patch_at = if c.is_entry && c.at(addr).starts_with(&ENDBR64) && end > addr + 4 { addr + 4 } else { addr };
    let code = &c.at(patch_at)[..end.saturating_sub(patch_at).min(c.at(patch_at).len())];
    let p = patch_at as u64;
    let mut why = Vec::new();
    // 1. Inline jump.
    match relocate::decode_displaced(p, code, JMP_LEN).and_then(|d| {
        branch_into(flow.as_ref(), p, JMP_LEN as u64, d.len as u64)?;
        overlap(c, patch_at, patch_at + d.len)?;
        Ok(d)
    }) {
        Ok(disp) => return Ok(Placement { method: Method::Jump, patch_at, disp }),
        Err(e) => why.push(format!("inline jump: {e}")),
    }
    // 2. Padding after the function.
    let pad = (|| {
        if c.func.is_none() {
            return Err("the function's extent is unknown".to_string());
        }
        let rest = end - patch_at;
        if rest + c.padding < JMP_LEN {
            return Err(format!(
                "{rest} bytes to the function's end and {} bytes of padding proven free after it",
                c.padding
            ));
        }
        let d = relocate::decode_displaced(p, code, rest)?;
        let last = d.instrs.last().ok_or("no instruction")?;
        if !matches!(
            last.flow_control(),
            FlowControl::Return | FlowControl::UnconditionalBranch | FlowControl::IndirectBranch
        ) {
            return Err("the function's last instruction falls through into the padding".into());
        }
        branch_into(flow.as_ref(), p, JMP_LEN as u64, JMP_LEN as u64)?;
        overlap(c, patch_at, patch_at + JMP_LEN)?;
        Ok(d)
    })();
    match pad {
        Ok(disp) => return Ok(Placement { method: Method::Padding, patch_at, disp }),
        Err(e) => why.push(format!("padding: {e}")),
    }
    // 3. Breakpoint.
    match relocate::decode_displaced(p, code, 1) {
        Ok(disp) => Ok(Placement { method: Method::Breakpoint, patch_at, disp }),
        Err(e) => {
            why.push(format!("breakpoint: {e}"));
            Err(format!("no way to place the probe ({})", why.join("; ")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AT: usize = 0x40_1000;

    fn pick(bytes: &[u8], off: usize, padding: usize, taken: &[(usize, usize)]) -> Result<(Method, usize), String> {
        let c = Code {
            addr: AT + off,
            func: Some(FuncExtent { start: AT, len: bytes.len() }),
            base: AT,
            bytes,
            is_entry: off == 0,
            padding,
            taken,
        };
        choose(&c).map(|p| (p.method, p.patch_at - AT))
    }

    #[test]
    fn each_method_where_it_fits() {
        // push rbp; mov rbp, rsp; pop rbp; ret
        let frame = [0x55, 0x48, 0x89, 0xE5, 0x5D, 0xC3];
        assert_eq!(pick(&frame, 0, 0, &[]), Ok((Method::Jump, 0)));
        assert_eq!(pick(&[0xC3], 0, 15, &[]), Ok((Method::Padding, 0)));
        assert_eq!(pick(&[0xC3], 0, 3, &[]), Ok((Method::Breakpoint, 0)));
        // lea eax, [rdi+rdi*2]; ret: 4 bytes, one byte of padding is enough.
        assert_eq!(pick(&[0x8D, 0x04, 0x7F, 0xC3], 0, 1, &[]), Ok((Method::Padding, 0)));
        assert_eq!(pick(&[0x8D, 0x04, 0x7F, 0xC3], 3, 1, &[]), Ok((Method::Breakpoint, 3)));
        assert_eq!(pick(&[0x8D, 0x04, 0x7F, 0xC3], 3, 4, &[]), Ok((Method::Padding, 3)));
    }

    #[test]
    fn endbr64_stays_in_front() {
        let f = [0xF3, 0x0F, 0x1E, 0xFA, 0xC3];
        assert_eq!(pick(&f, 0, 11, &[]), Ok((Method::Padding, 4)));
        assert_eq!(pick(&f, 0, 0, &[]), Ok((Method::Breakpoint, 4)));
        let g = [0xF3, 0x0F, 0x1E, 0xFA, 0x55, 0x48, 0x89, 0xE5, 0x5D, 0xC3];
        assert_eq!(pick(&g, 0, 0, &[]), Ok((Method::Jump, 4)));
    }

    #[test]
    fn a_branch_into_the_first_bytes_takes_a_breakpoint() {
        // xor eax, eax; 1: inc rax; dec rdi; jnz 1b; ret
        let f = [0x31, 0xC0, 0x48, 0xFF, 0xC0, 0x48, 0xFF, 0xCF, 0x75, 0xF8, 0xC3];
        assert_eq!(pick(&f, 0, 5, &[]), Ok((Method::Breakpoint, 0)));
        // The loop head itself: the jump back lands on the patch's first byte.
        assert_eq!(pick(&f, 2, 5, &[]), Ok((Method::Jump, 2)));
        let e = pick(&f, 3, 5, &[]).unwrap_err();
        assert!(e.contains("offset 3 is not an instruction boundary"), "{e}");
    }

    #[test]
    fn an_int3_is_named() {
        let e = pick(&[0xCC, 0x48, 0x89, 0xE5, 0x5D, 0xC3], 0, 0, &[]).unwrap_err();
        assert!(e.contains("kernel uprobe") && e.contains("debugger"), "{e}");
        // On the second instruction (a uprobe there): the first still takes a breakpoint.
        assert_eq!(pick(&[0x55, 0xCC, 0x89, 0xE5, 0x5D, 0xC3], 0, 0, &[]), Ok((Method::Breakpoint, 0)));
    }

    #[test]
    fn other_patches_are_not_overlapped() {
        let frame = [0x55, 0x48, 0x89, 0xE5, 0x5D, 0xC3];
        // Another site's patch at +4: a jump at 0 would cover it.
        assert_eq!(pick(&frame, 0, 0, &[(AT + 4, AT + 5)]), Ok((Method::Breakpoint, 0)));
        let e = pick(&frame, 4, 0, &[(AT, AT + 5)]).unwrap_err();
        assert!(e.contains("inside the patched bytes of another probe"), "{e}");
    }

    #[test]
    fn what_cannot_be_placed_says_why() {
        // xbegin at the entry: no method can move it.
        let e = pick(&[0xC7, 0xF8, 0, 0, 0, 0, 0xC3], 0, 0, &[]).unwrap_err();
        assert!(
            e.starts_with("no way to place the probe (inline jump: ") && e.contains("breakpoint: transactional"),
            "{e}"
        );
    }
}
