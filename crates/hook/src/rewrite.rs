//! System calls of libc at the cost of a function call: while system call dispatch is on
//! (`sud`, a system call tracepoint attached), libc's `syscall` sites are rewritten into jumps
//! to per-site trampolines that run the programs and make the call without a signal.
//!
//! ## Which sites
//! libc's executable `PT_LOAD` segment is decoded (iced-x86, a linear sweep of the file's
//! bytes, which holds only code in glibc) and every `syscall` instruction is a site: glibc
//! 2.36 has 526 `syscall`s, 436 of them right after `mov eax, NR` (five bytes: `getpid`,
//! `__close_nocancel`, the `openat` of `fopen`, `write`...), and the generic `syscall()`
//! ends with `mov r9, [rsp+8]; syscall`. The instruction before the `syscall` (the
//! *window*) becomes a `jmp rel32` to the site's trampoline; the `syscall` itself stays
//! where it is. So:
//! * no branch can land inside the patch: it replaces one whole instruction (a branch to its
//!   start goes through the trampoline, a branch to the `syscall` runs the original one);
//! * a thread blocked in the call when the site is rewritten, or one the kernel restarts
//!   (`-ERESTARTSYS` with `SA_RESTART`, `restart_syscall`: the kernel moves `rip` back onto
//!   the `syscall`), runs the original `syscall`, which dispatch handles;
//! * sites whose number is known (`mov eax, NR`) and is `clone`, `clone3`, `vfork` or `fork`
//!   are left to dispatch (`sud::needs_dispatch`: the child returns where the parent called,
//!   on the program's stack); a site whose number is only known when it runs (`syscall()`)
//!   sends those calls to its own `syscall`;
//! * `rt_sigreturn` (libc's `__restore_rt`, the return of every handler installed through
//!   libc) runs the enter programs and resumes, with the registers as they were, at
//!   dispatch's page's own `rt_sigreturn` (`sud::sigreturn_at_site`): no `SIGSYS` per
//!   handler return, and none pushed on an alternate signal stack already in use.
//!
//! Where the instruction before the `syscall` is shorter (`xor eax, eax; syscall` in `read`,
//! `mov eax, r8d; syscall` in the futex code), the window takes the instructions before it
//! too, up to five bytes (at most six instructions, 32 bytes), each falling through to the
//! next or a conditional branch (moved with its target kept), none a call: then no branch
//! anywhere in libc may land between them. The targets are found in the same pass over the
//! text (`Targets`): direct branches and calls, RIP-relative code addresses, every entry of
//! every jump table a RIP-relative `lea` points at (read while it lands in the text: more
//! than the real entries, never fewer), `endbr64`s and exported functions. A thread between
//! two window instructions when the jump goes in is moved to their copy (by `patch`'s
//! fixup handler, through `fixup`).
//! The scan (tens of milliseconds) is kept in `/dev/shm/.userbpf-libc-sites-UID-...` for the
//! next process, keyed by the file's device, inode, size and time, each window decoded again
//! and checked when read back.
//!
//! Not rewritten (left to dispatch, each call a `SIGSYS`): in glibc 2.36, 9 of the 526
//! `syscall`s: `clone` (twice), `clone3`, `vfork` (by design), the exit
//! loops of `_exit` and of the start code (their instructions are a loop head), and
//! `__read_nocancel` (its `syscall` is its second instruction); every other object (the
//! executable, other libraries, the dynamic loader, JIT code); and a window that overlaps a
//! probe of the hook's (the probe keeps its place, the site is left to dispatch). A probe
//! attached later over a rewritten window takes it back (`yield_range`).
//!
//! ## The trampoline
//! ```text
//! tramp:  <the window's instruction, relocated>  ; e.g. mov eax, NR
//!         lea rsp,[rsp-128]                       ; over the red zone
//!         call syscall_common                     ; [rsp] = the site's data
//! data:   .quad after_syscall, syscall_addr
//! ```
//! `stubs::syscall_common` saves every register and the FP state libc may have live there
//! (xmm0-15, MXCSR, x87: `stubs::syscall_fp_save` says why; the whole state with
//! `USERBPF_HOOK_FULL_FPSAVE=1`), and calls
//! `dispatch`, which runs the enter programs, makes the call from dispatch's page (the one
//! range dispatch allows) and runs the exit programs (`sud::site_call`: the same rules as a
//! dispatched call, the agent's own calls never seen), then resumes after the `syscall` with
//! the result in `rax` (`rcx` = that address, as the kernel leaves it; `r11` clobbered, as by
//! `syscall`). Signals arriving during the call run the program's handlers as usual, their
//! calls traced; a restarted call restarts at the page's `syscall`.
//!
//! ## Patching
//! The windows are written with the hook's live-patching protocol (`patch`), batched over
//! every site: `int3` on each first byte, a broadcast (threads between two instructions of a
//! window are moved to the trampoline's copies), the four other bytes, a broadcast, the `jmp`
//! opcodes: two `mprotect`s of libc's text per step, two broadcasts in all. A thread meeting an `int3` meanwhile goes to the trampoline (the site is
//! registered with the `SIGTRAP` handler). `remove` (the last system call tracepoint
//! detached, `userbpf detach`) writes the original bytes back the same way; trampolines stay
//! mapped (a thread may be inside one, blocked in its call) and are reused by the next
//! `apply`. A forked child keeps the rewritten text and its trampolines.
//!
//! `USERBPF_SYSCALL_REWRITE=0` (read at each `apply`) leaves every site to dispatch (for
//! comparisons).

use std::sync::Mutex;

use iced_x86::{BlockEncoder, BlockEncoderOptions, Code, Decoder, DecoderOptions, FlowControl, Instruction, Mnemonic};

use crate::{PtRegs, patch, stubs};

/// A rewritten site's data, right after its trampoline's `call` (its return address).
#[repr(C)]
struct SiteData {
    /// The address after the `syscall`: where the call returns.
    back: u64,
    /// The `syscall` instruction: where a call left to dispatch goes.
    sys: u64,
}

struct Site {
    /// The window: the instructions before the `syscall`.
    at: usize,
    len: usize,
    orig: [u8; MAX_WINDOW],
    /// Where a thread between two of the window's instructions is moved (see `patch`):
    /// offset in the window, address in the trampoline. Empty for one instruction.
    fix: FixMap,
    jmp: [u8; 5],
    /// Rewritten now.
    patched: bool,
    /// Taken back for a probe of the hook (not rewritten again).
    yielded: bool,
}

/// libc's text: its range (whole pages) and protection.
type Text = (usize, usize, i32);
/// Where a thread between two window instructions goes: offset in the window, address.
type FixMap = Vec<(usize, usize)>;

struct State {
    sites: Vec<Site>,
    text: Text,
}

static STATE: Mutex<Option<Result<State, String>>> = Mutex::new(None);

/// Called by a trampoline (through `stubs::syscall_common`) with the registers at the
/// `syscall` (`ax` = the number); returns where to resume.
unsafe extern "C" fn dispatch(regs: *mut PtRegs, data: *const SiteData) -> u64 {
    // SAFETY: `data` is the site's data in its trampoline (never freed); `regs` the pt_regs
    // the stub built on this thread's stack.
    let (d, regs) = unsafe { (&*data, &mut *regs) };
    let nr = regs.ax;
    if crate::sud::needs_dispatch(nr) {
        return d.sys;
    }
    regs.orig_ax = nr;
    regs.ip = d.back;
    regs.sp = regs as *mut PtRegs as u64 + (stubs::PT_REGS_SIZE as u64 + 8 + 128);
    regs.cs = 0x33;
    regs.ss = 0x2b;
    if nr == libc::SYS_rt_sigreturn as u64 {
        return crate::sud::sigreturn_at_site(regs);
    }
    crate::sud::site_call(regs);
    regs.cx = d.back;
    d.back
}

/// A `syscall` site found in the file: its window.
struct Found {
    at: usize,
    len: usize,
    /// The window's instructions (one, or a few when the one before the `syscall` is short).
    instrs: Vec<Instruction>,
    /// The window's bytes in the file.
    orig: [u8; 32],
}

/// The most bytes a window takes.
const MAX_WINDOW: usize = 32;

fn static_nr(ins: &Instruction) -> Option<u64> {
    use iced_x86::Register::{EAX, RAX};
    match ins.code() {
        Code::Mov_r32_imm32 | Code::Mov_rm32_imm32 if ins.op0_register() == EAX => Some(ins.immediate32() as u64),
        Code::Mov_rm64_imm32 if ins.op0_register() == RAX => Some(ins.immediate32to64() as u64),
        _ => None,
    }
}

/// The sites of libc's text (see the module docs), with the text's mapping. One pass of the
/// decoder over the executable segment, keeping the last few instructions before each
/// `syscall` and every address control may reach other than by falling through (see
/// [`Targets`]); the windows are chosen after it.
fn scan() -> Result<(Vec<Found>, Text), String> {
    scan_with(true)
}

/// [`scan`], with the cache of an earlier scan (`cached`) or without.
fn scan_with(cached: bool) -> Result<(Vec<Found>, Text), String> {
    use object::{Object, ObjectSegment, ObjectSymbol, SegmentFlags};
    let libc = crate::symbols::loaded_objects()
        .into_iter()
        .find(|o| o.path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("libc.so")))
        .ok_or("libc is not loaded in this process")?;
    let data = std::fs::read(&libc.path).map_err(|e| format!("{}: {e}", libc.path.display()))?;
    let file = object::File::parse(&*data).map_err(|e| format!("{}: {e}", libc.path.display()))?;
    let bias = libc.bias as u64;
    let seg = file
        .segments()
        .find(|s| matches!(s.flags(), SegmentFlags::Elf { p_flags } if p_flags & object::elf::PF_X != 0))
        .ok_or("libc has no executable segment")?;
    let bytes = seg.data().map_err(|e| format!("{}: {e}", libc.path.display()))?;
    let start = bias + seg.address();
    let map = patch::mapping_of(start as usize).ok_or("libc's text is not mapped")?;
    // The segment, whole pages (its mapping may be split by earlier patches).
    let text: Text =
        ((start as usize) & !(PAGE - 1), (start as usize + bytes.len() + PAGE - 1) & !(PAGE - 1), map.prot);
    let end = start + bytes.len() as u64;
    let cache = if cached { cache_path(&libc.path) } else { None };
    if let Some(found) = cache.as_deref().and_then(|c| from_cache(c, bytes, start)) {
        return Ok((found, text));
    }
    // Other segments' bytes by address, for the jump tables.
    let segs: Vec<(u64, &[u8])> = file.segments().filter_map(|s| Some((bias + s.address(), s.data().ok()?))).collect();
    let read_i32 = |a: u64| -> Option<i32> {
        let (base, d) = segs.iter().find(|(b, d)| a >= *b && a + 4 <= b + d.len() as u64)?;
        let o = (a - base) as usize;
        Some(i32::from_le_bytes(d[o..o + 4].try_into().ok()?))
    };
    let mut targets = Targets { start, bits: vec![0u64; bytes.len() / 64 + 1] };
    let mut ring = [Instruction::default(); RING];
    let mut n = 0usize;
    let mut cands: Vec<(Vec<Instruction>, u64)> = Vec::new();
    let mut dec = Decoder::with_ip(64, bytes, start, DecoderOptions::NONE);
    let mut ins = Instruction::default();
    while dec.can_decode() {
        dec.decode_out(&mut ins);
        if ins.is_invalid() {
            n = 0;
            continue;
        }
        match ins.mnemonic() {
            Mnemonic::Syscall => {
                let k = n.min(RING);
                let prev: Vec<Instruction> = (0..k).map(|i| ring[(n - k + i) % RING]).collect();
                cands.push((prev, ins.ip()));
            }
            Mnemonic::Endbr64 => targets.add(ins.ip()),
            _ => {}
        }
        if ins.is_jcc_short_or_near()
            || ins.is_jmp_short_or_near()
            || ins.is_call_near()
            || ins.is_loop()
            || ins.is_loopcc()
            || ins.is_jcx_short()
        {
            targets.add(ins.near_branch_target());
        }
        if ins.is_ip_rel_memory_operand() {
            let a = ins.ip_rel_memory_address();
            if a >= start && a < end {
                targets.add(a);
            } else if ins.mnemonic() == Mnemonic::Lea {
                // A jump table's entries are relative to its start.
                for k in 0..4096u64 {
                    match read_i32(a + 4 * k).map(|e| a.wrapping_add(e as i64 as u64)) {
                        Some(t) if t >= start && t < end => targets.add(t),
                        _ => break,
                    }
                }
            }
        }
        ring[n % RING] = ins;
        n += 1;
    }
    for sym in file.dynamic_symbols().chain(file.symbols()) {
        if sym.kind() == object::SymbolKind::Text {
            targets.add(bias + sym.address());
        }
    }
    // Code addresses in data (function pointer tables such as FILE's jump tables), which
    // the dynamic loader relocates: their addends.
    if let Some(relocs) = file.dynamic_relocations() {
        for (_, r) in relocs {
            if r.kind() == object::RelocationKind::Relative || r.target() == object::RelocationTarget::Absolute {
                targets.add(bias.wrapping_add(r.addend() as u64));
            }
        }
    }
    let mut found = Vec::new();
    for (prev, sys) in cands {
        if sys + 2 > end {
            continue;
        }
        let Some(w) = window(&prev, sys, &targets) else { continue };
        if w.len() == 1 && static_nr(&w[0]).is_some_and(crate::sud::needs_dispatch) {
            continue;
        }
        let at = w[0].ip();
        let len = (sys - at) as usize;
        let off = (at - start) as usize;
        let mut orig = [0u8; MAX_WINDOW];
        orig[..len].copy_from_slice(&bytes[off..off + len]);
        found.push(Found { at: at as usize, len, instrs: w, orig });
    }
    if let Some(c) = cache {
        to_cache(&c, &found, start);
    }
    Ok((found, text))
}

/// Where the windows found in a libc file are kept for the next process (a scan takes tens
/// of milliseconds): a file of this user's in `/dev/shm` (hidden, apart from the sessions'
/// `userbpf-UID-NAME`) named after the file's device, inode, size and modification time, so
/// that another libc (or the same path replaced) is scanned again.
fn cache_path(libc: &std::path::Path) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(libc).ok()?;
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    Some(std::path::PathBuf::from(format!(
        "/dev/shm/.userbpf-libc-sites-{uid}-v3-{:x}-{:x}-{:x}-{:x}.{:x}",
        m.dev(),
        m.ino(),
        m.size(),
        m.mtime(),
        m.mtime_nsec()
    )))
}

const CACHE_MAGIC: &[u8; 8] = b"ubpfsys3";

/// The windows kept in `path` (see [`cache_path`]): only from a regular file of this user's
/// that no one else may write, and each window decoded again from the file's bytes and
/// checked (whole instructions ending at a `syscall`). `None`: scan again.
fn from_cache(path: &std::path::Path, bytes: &[u8], start: u64) -> Option<Vec<Found>> {
    let data = userbpf_cachefile::read(path)?;
    let body = data.strip_prefix(CACHE_MAGIC)?;
    if body.len() % 5 != 0 {
        return None;
    }
    let mut found = Vec::with_capacity(body.len() / 5);
    for rec in body.chunks_exact(5) {
        let off = u32::from_le_bytes(rec[..4].try_into().ok()?) as usize;
        let len = rec[4] as usize;
        if !(5..=MAX_WINDOW).contains(&len) || bytes.get(off + len..off + len + 2)? != [0x0F, 0x05] {
            return None;
        }
        let mut dec = Decoder::with_ip(64, &bytes[off..off + len], start + off as u64, DecoderOptions::NONE);
        let mut instrs = Vec::new();
        while dec.can_decode() {
            let ins = dec.decode();
            if ins.is_invalid() || !matches!(ins.flow_control(), FlowControl::Next | FlowControl::ConditionalBranch) {
                return None;
            }
            instrs.push(ins);
        }
        if instrs.last()?.next_ip() != start + (off + len) as u64 {
            return None;
        }
        let mut orig = [0u8; MAX_WINDOW];
        orig[..len].copy_from_slice(&bytes[off..off + len]);
        found.push(Found { at: (start as usize) + off, len, instrs, orig });
    }
    Some(found)
}

/// Keeps the windows found for the next process (best effort: a file made whole under
/// another name, then renamed).
fn to_cache(path: &std::path::Path, found: &[Found], start: u64) {
    let mut data = CACHE_MAGIC.to_vec();
    for f in found {
        data.extend_from_slice(&((f.at as u64 - start) as u32).to_le_bytes());
        data.push(f.len as u8);
    }
    userbpf_cachefile::write(path, &data);
}

/// Instructions kept before each `syscall` (a window takes at most six).
const RING: usize = 8;

/// Every address of libc's text that control may reach other than by falling through (a
/// window must hold none but its first), one bit per byte: targets of direct branches and
/// calls, code addresses taken RIP-relatively (function pointers), the entries of jump tables
/// (read from every table a RIP-relative `lea` points at outside the text, entry by entry
/// while they land in the text: more than the real entries, never fewer), `endbr64`s
/// (indirect branch targets), the exported functions and the code addresses the dynamic
/// loader relocates in data (function pointer tables). Not seen: the landing pads of
/// `.gcc_except_table` (cleanup code the unwinder jumps to), which begin blocks no code
/// falls into (a window's instructions all fall through into the next), and jumps computed
/// otherwise than through a table a `lea` points at.
struct Targets {
    start: u64,
    bits: Vec<u64>,
}

impl Targets {
    fn add(&mut self, a: u64) {
        if let Some(i) = a.checked_sub(self.start).map(|o| o as usize)
            && let Some(w) = self.bits.get_mut(i / 64)
        {
            *w |= 1 << (i % 64);
        }
    }
    fn has(&self, a: u64) -> bool {
        a.checked_sub(self.start)
            .map(|o| o as usize)
            .and_then(|i| self.bits.get(i / 64).map(|w| w & (1 << (i % 64)) != 0))
            .unwrap_or(false)
    }
}

/// The window of the `syscall` at `sys` from the instructions before it (`prev`, the last
/// one right before it, when the decode ran straight into it): as few as give five bytes,
/// each falling through to the next (a conditional branch may leave), none a call, a
/// `syscall` or a trap, and none but the first a branch target.
fn window(prev: &[Instruction], sys: u64, targets: &Targets) -> Option<Vec<Instruction>> {
    let mut w = Vec::new();
    let mut next = sys;
    let mut it = prev.iter().rev();
    while sys - next < 5 {
        let ins = *it.next()?;
        if ins.next_ip() != next || w.len() >= 6 {
            return None;
        }
        match ins.flow_control() {
            FlowControl::Next | FlowControl::ConditionalBranch => {}
            _ => return None,
        }
        // Alignment padding is where a function or a loop head begins next to it.
        if matches!(ins.mnemonic(), Mnemonic::Syscall | Mnemonic::Endbr64 | Mnemonic::Nop) {
            return None;
        }
        next = ins.ip();
        w.insert(0, ins);
    }
    if (sys - next) as usize > MAX_WINDOW {
        return None;
    }
    // A branch may go to the window's first instruction (the jump) or to the `syscall` (the
    // original one runs), never in between.
    if w.iter().skip(1).any(|ins| targets.has(ins.ip())) {
        return None;
    }
    Some(w)
}

/// The trampoline of `f` at `ip`, calling `common`, and where each window instruction's copy
/// is (offset in the window, address).
fn trampoline(f: &Found, ip: u64, common: u64) -> Result<(Vec<u8>, FixMap), String> {
    use iced_x86::{MemoryOperand, Register};
    let e = |x: iced_x86::IcedError| x.to_string();
    let mut instrs = f.instrs.clone();
    // A branch back to the window's start goes through the jump again (its ip hidden from
    // the encoder, as `relocate` does).
    instrs[0].set_ip(0);
    instrs.push(
        Instruction::with2(Code::Lea_r64_m, Register::RSP, MemoryOperand::with_base_displ(Register::RSP, -128))
            .map_err(e)?,
    );
    instrs.push(Instruction::with_branch(Code::Call_rel32_64, common).map_err(e)?);
    let block = iced_x86::InstructionBlock::new(&instrs, ip);
    let res = BlockEncoder::encode(64, block, BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS)
        .map_err(|x| format!("cannot relocate the instructions at {:#x}: {x}", f.at))?;
    let fix = f
        .instrs
        .iter()
        .zip(&res.new_instruction_offsets)
        .map(|(i, o)| (i.ip() as usize - f.at, ip as usize + *o as usize))
        .collect();
    let mut code = res.code_buffer;
    let sys = (f.at + f.len) as u64;
    code.extend_from_slice(&(sys + 2).to_le_bytes());
    code.extend_from_slice(&sys.to_le_bytes());
    Ok((code, fix))
}

const PAGE: usize = 4096;
const SLOT: usize = 128;

/// Scans libc and builds the trampolines (once per process).
fn build() -> Result<State, String> {
    let (found, text) = scan()?;
    let fp = stubs::detect_fpsave();
    let common_page = patch::alloc_near(text.0).ok_or("no free memory near libc for the system call stub")?;
    let full = std::env::var_os("USERBPF_HOOK_FULL_FPSAVE").is_some_and(|v| !v.is_empty() && v != "0");
    let gadget = crate::sud::gadget();
    if gadget == 0 {
        return Err("system call dispatch is not set up".into());
    }
    let common = stubs::syscall_common(
        common_page as u64,
        fp,
        full,
        dispatch as *const () as usize as u64,
        crate::sud::fast_table(),
        gadget,
    )
    .map_err(|e| e.to_string())?;
    patch::seal_page(common_page, &[(0, &common)])?;
    let mut sites = Vec::with_capacity(found.len());
    let mut page = 0usize;
    let mut used = PAGE;
    let mut pending: Vec<(usize, Vec<u8>)> = Vec::new();
    let flush = |page: usize, pending: &mut Vec<(usize, Vec<u8>)>| -> Result<(), String> {
        if page != 0 {
            let parts: Vec<(usize, &[u8])> = pending.iter().map(|(o, c)| (*o, c.as_slice())).collect();
            patch::seal_page(page, &parts)?;
        }
        pending.clear();
        Ok(())
    };
    for f in &found {
        // A slot of 128 bytes holds any trampoline (a window of at most 32 bytes, whose
        // branches may grow to 6 bytes each, then 8 + 5 + 16).
        if used + SLOT > PAGE {
            flush(page, &mut pending)?;
            page = patch::alloc_near(f.at).ok_or("no free memory near libc for the trampolines")?;
            used = 0;
        }
        let ip = page + used;
        let rel = ip as i64 - (f.at as i64 + 5);
        let Ok(rel) = i32::try_from(rel) else { continue };
        let Ok((code, fix)) = trampoline(f, ip as u64, common_page as u64) else { continue };
        if code.len() > SLOT {
            continue;
        }
        let fix = if f.instrs.len() > 1 { fix } else { Vec::new() };
        let mut jmp = [0xE9, 0, 0, 0, 0];
        jmp[1..].copy_from_slice(&rel.to_le_bytes());
        pending.push((used, code));
        used += SLOT;
        if !patch::register_trap_site(f.at, ip) {
            break;
        }
        sites.push(Site { at: f.at, len: f.len, orig: f.orig, fix, jmp, patched: false, yielded: false });
    }
    flush(page, &mut pending)?;
    Ok(State { sites, text })
}

/// Writes `(addr, bytes)` into libc's text, which is made writable once for all of them
/// (one `mprotect` there and one back: the text stays executable meanwhile).
fn write_all(text: Text, writes: &[(usize, &[u8])]) -> Result<(), String> {
    if writes.is_empty() {
        return Ok(());
    }
    let (start, end, prot) = text;
    let rwx = libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC;
    // SAFETY: libc's text mapping of this process; RWX keeps it executable for other threads.
    if unsafe { libc::mprotect(start as *mut libc::c_void, end - start, rwx) } != 0 {
        return Err(format!("mprotect(RWX) of libc's text failed: {}", std::io::Error::last_os_error()));
    }
    for (addr, bytes) in writes {
        for (i, b) in bytes.iter().enumerate() {
            // SAFETY: inside libc's text, writable now; volatile so the stores happen in order.
            unsafe { std::ptr::write_volatile((addr + i) as *mut u8, *b) };
        }
    }
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    // SAFETY: restores the mapping's protection.
    if unsafe { libc::mprotect(start as *mut libc::c_void, end - start, prot) } != 0 {
        return Err(format!("mprotect restore of libc's text failed: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

/// The windows being rewritten whose threads must be moved (see [`fixup`]): a leaked table
/// of `(window start, offset in the window, address in the trampoline)` sorted by address,
/// published while their jumps go in.
static FIXING: std::sync::atomic::AtomicPtr<Vec<(usize, usize, usize)>> =
    std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());

/// Where a thread at `pc` goes while windows are being rewritten: the trampoline's copy of
/// the instruction at `pc` when it is inside a window (not its first instruction); `None`
/// otherwise. Called by `patch`'s fixup signal handler (no lock, no allocation), and to
/// know whether a thread blocked in the kernel must be signalled.
pub(crate) fn fixup(pc: usize) -> Option<usize> {
    let t = FIXING.load(std::sync::atomic::Ordering::Acquire);
    if t.is_null() {
        return None;
    }
    // SAFETY: published tables are leaked (a handler may read one after it is unpublished).
    let t = unsafe { &*t };
    let i = t.partition_point(|e| e.0 + e.1 < pc);
    t.get(i).filter(|e| e.0 + e.1 == pc && e.1 != 0).map(|e| e.2)
}

/// Writes `new(site)` over each of `sites` with the live-patching protocol (first byte
/// `int3` on each, broadcast, the other bytes, broadcast, the first bytes), all at once:
/// while jumps go in, a thread between two instructions of a window is moved to the
/// trampoline's copies by the broadcasts' handler ([`fixup`]). (While a jump is there, no
/// thread is inside its original bytes: writing them back needs no move.)
fn patch_sites(text: Text, sites: &[&Site], new: impl Fn(&Site) -> [u8; 5]) -> Result<(), String> {
    use std::sync::atomic::Ordering::SeqCst;
    if sites.is_empty() {
        return Ok(());
    }
    patch::own_sigtrap();
    let mut table: Vec<(usize, usize, usize)> = sites
        .iter()
        .filter(|s| new(s) == s.jmp)
        .flat_map(|s| s.fix.iter().map(move |(off, to)| (s.at, *off, *to)))
        .collect();
    table.sort_unstable_by_key(|e| e.0 + e.1);
    if !table.is_empty() {
        FIXING.store(Box::into_raw(Box::new(table)), SeqCst);
    }
    let int3 = [0xCCu8];
    let bytes: Vec<[u8; 5]> = sites.iter().map(|s| new(s)).collect();
    let step1: Vec<(usize, &[u8])> = sites.iter().map(|s| (s.at, &int3[..])).collect();
    let r = write_all(text, &step1).and_then(|_| {
        patch::broadcast();
        let step2: Vec<(usize, &[u8])> = sites.iter().zip(&bytes).map(|(s, b)| (s.at + 1, &b[1..])).collect();
        write_all(text, &step2)
    });
    let r = r.and_then(|_| {
        patch::broadcast();
        let step3: Vec<(usize, &[u8])> = sites.iter().zip(&bytes).map(|(s, b)| (s.at, &b[..1])).collect();
        write_all(text, &step3)
    });
    // The table stays allocated (a handler may still read it).
    FIXING.store(std::ptr::null_mut(), SeqCst);
    r
}

/// Whether `[lo, hi)` overlaps a site's window or its `syscall`.
fn overlaps(s: &Site, lo: usize, hi: usize) -> bool {
    s.at < hi && lo < s.at + s.len + 2
}

/// Rewrites libc's sites (dispatch is on). Sites overlapping a probe of the hook (`taken`:
/// its patched and displaced bytes) are left alone. Returns how many sites are rewritten.
pub(crate) fn apply(taken: &[(usize, usize)]) -> Result<usize, String> {
    if std::env::var_os("USERBPF_SYSCALL_REWRITE").is_some_and(|v| v == "0") {
        return Ok(0);
    }
    let mut st = STATE.lock().unwrap_or_else(|e| e.into_inner());
    let state = match st.get_or_insert_with(build) {
        Ok(s) => s,
        Err(e) => return Err(e.clone()),
    };
    let todo: Vec<usize> = (0..state.sites.len())
        .filter(|&i| {
            let s = &state.sites[i];
            // SAFETY: the window and its `syscall` lie in libc's mapped text.
            let now = unsafe { std::slice::from_raw_parts(s.at as *const u8, s.len + 2) };
            // The memory holds the file's bytes (no one else's patch or `int3` there).
            !s.patched
                && !s.yielded
                && now[..s.len] == s.orig[..s.len]
                && now[s.len..] == [0x0F, 0x05]
                && !taken.iter().any(|&(lo, hi)| overlaps(s, lo, hi))
        })
        .collect();
    let refs: Vec<&Site> = todo.iter().map(|&i| &state.sites[i]).collect();
    patch_sites(state.text, &refs, |s| s.jmp)?;
    for i in todo {
        state.sites[i].patched = true;
    }
    Ok(state.sites.iter().filter(|s| s.patched).count())
}

/// Writes the original bytes back at every rewritten site.
pub(crate) fn remove() -> Result<(), String> {
    let mut st = STATE.lock().unwrap_or_else(|e| e.into_inner());
    let Some(Ok(state)) = st.as_mut() else { return Ok(()) };
    let refs: Vec<&Site> = state.sites.iter().filter(|s| s.patched).collect();
    patch_sites(state.text, &refs, orig5)?;
    for s in &mut state.sites {
        s.patched = false;
    }
    Ok(())
}

fn orig5(s: &Site) -> [u8; 5] {
    let mut b = [0u8; 5];
    b.copy_from_slice(&s.orig[..5]);
    b
}

/// A probe of the hook is about to be placed over `[lo, hi)`: the rewritten sites there get
/// their original bytes back and stay with dispatch (registry lock held).
pub(crate) fn yield_range(lo: usize, hi: usize) {
    let mut st = STATE.lock().unwrap_or_else(|e| e.into_inner());
    let Some(Ok(state)) = st.as_mut() else { return };
    let hit: Vec<usize> = (0..state.sites.len()).filter(|&i| overlaps(&state.sites[i], lo, hi)).collect();
    let refs: Vec<&Site> = hit.iter().map(|&i| &state.sites[i]).filter(|s| s.patched).collect();
    if patch_sites(state.text, &refs, orig5).is_err() {
        return;
    }
    for i in hit {
        state.sites[i].patched = false;
        state.sites[i].yielded = true;
    }
}

/// How many of libc's sites are rewritten now, and how many were found (for tests and the
/// bench).
pub fn counts() -> (usize, usize) {
    let st = STATE.lock().unwrap_or_else(|e| e.into_inner());
    match st.as_ref() {
        Some(Ok(s)) => (s.sites.iter().filter(|s| s.patched).count(), s.sites.len()),
        _ => (0, 0),
    }
}

/// Puts the original bytes of the rewritten sites into `bytes`, a copy of the code from
/// `base` (for the hook's analysis of a function).
pub(crate) fn original_bytes(base: usize, bytes: &mut [u8]) {
    let st = STATE.lock().unwrap_or_else(|e| e.into_inner());
    let Some(Ok(state)) = st.as_ref() else { return };
    for s in state.sites.iter().filter(|s| s.patched) {
        for k in 0..5 {
            if let Some(b) = (s.at + k).checked_sub(base).and_then(|i| bytes.get_mut(i)) {
                *b = s.orig[k];
            }
        }
    }
}

/// Whether `addr` is the window of a rewritten site (for tests).
pub fn is_rewritten(addr: usize) -> bool {
    let st = STATE.lock().unwrap_or_else(|e| e.into_inner());
    matches!(st.as_ref(), Some(Ok(s)) if s.sites.iter().any(|s| s.patched && s.at <= addr && addr < s.at + s.len))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The start of libc's executable segment (the scan's `start`): libc's bias plus the
    /// segment's address.
    fn text_start(_: &[Found]) -> usize {
        use object::{Object, ObjectSegment, SegmentFlags};
        let libc = crate::symbols::loaded_objects()
            .into_iter()
            .find(|o| o.path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("libc.so")))
            .unwrap();
        let data = std::fs::read(&libc.path).unwrap();
        let file = object::File::parse(&*data).unwrap();
        let seg = file
            .segments()
            .find(|s| matches!(s.flags(), SegmentFlags::Elf { p_flags } if p_flags & object::elf::PF_X != 0))
            .unwrap();
        libc.bias + seg.address() as usize
    }

    /// libc's `syscall` sites: most get a window (glibc 2.36: all but the few whose number
    /// needs dispatch or whose instructions before are a branch target or a call); the
    /// others are printed, by their offset in libc.
    #[test]
    fn most_of_libcs_sites_get_a_window() {
        let (found, text) = scan_with(false).expect("scan libc");
        let libc = crate::symbols::loaded_objects()
            .into_iter()
            .find(|o| o.path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("libc.so")))
            .unwrap();
        let mut all = Vec::new();
        // SAFETY: libc's text, mapped and readable.
        let code = unsafe { std::slice::from_raw_parts(text.0 as *const u8, text.1 - text.0) };
        let mut dec = Decoder::with_ip(64, code, text.0 as u64, DecoderOptions::NONE);
        while dec.can_decode() {
            let ins = dec.decode();
            if ins.mnemonic() == Mnemonic::Syscall {
                all.push(ins.ip() as usize);
            }
        }
        let sites: std::collections::HashSet<usize> = found.iter().map(|f| f.at + f.len).collect();
        let left: Vec<String> =
            all.iter().filter(|a| !sites.contains(a)).map(|a| format!("{:#x}", a - libc.bias)).collect();
        eprintln!("{} of {} `syscall`s have a window; left to dispatch: {}", sites.len(), all.len(), left.join(" "));
        assert!(sites.len() * 10 >= all.len() * 9, "{} of {}", sites.len(), all.len());
        // The cache gives the same windows back, and refuses a file that does not match.
        let dir = std::env::temp_dir().join(format!("userbpf-rewrite-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("sites");
        to_cache(&path, &found, text_start(&found) as u64);
        // SAFETY: libc's text, mapped and readable (the windows' original bytes are compared
        // below, not these).
        let seg = unsafe { std::slice::from_raw_parts(text_start(&found) as *const u8, text.1 - text_start(&found)) };
        let back = from_cache(&path, seg, text_start(&found) as u64).expect("cache read back");
        assert_eq!(back.len(), found.len());
        for (a, b) in back.iter().zip(&found) {
            assert_eq!((a.at, a.len, a.instrs.len()), (b.at, b.len, b.instrs.len()));
        }
        std::fs::write(&path, b"ubpfsys3\x00\x00\x00\x00\x05").unwrap();
        assert!(from_cache(&path, seg, text_start(&found) as u64).is_none(), "a window not ending at a syscall");
        std::fs::remove_dir_all(&dir).unwrap();
        // Every window ends right before its `syscall` and is at least five bytes long.
        for f in &found {
            assert!(f.len >= 5 && f.len <= MAX_WINDOW);
            assert_eq!(f.instrs.last().unwrap().next_ip() as usize, f.at + f.len);
        }
    }
}
