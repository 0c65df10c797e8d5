//! Stack traces: `get_stackid` and `get_stack`.
//!
//! User stacks are walked as the kernel's `perf_callchain_user` does on x86-64: the
//! instruction pointer of the probe's `pt_regs`, then the frame-pointer chain from its `rbp`
//! (each frame: saved `rbp` at `[rbp]`, return address at `[rbp + 8]`), every read through
//! the guard (a bad frame ends the walk), at most `perf_event_max_stack` (127) entries.
//!
//! Between the two, the word at `[rsp]` (the return address) when the run is an entry probe
//! whose probed instruction is `push %rbp`, or `endbr64` on kernels built with
//! `CONFIG_X86_KERNEL_IBT` ([`RunContext::at_func_entry`], see [`uprobe_at_func_entry`]):
//! the kernel (6.10 and later, `is_uprobe_at_func_entry` in `perf_callchain_user`) guesses
//! from that instruction that `rbp` is still the caller's, so the immediate caller would be
//! lost. Any other probed instruction (a leaf function starting with `mov`, a probe inside a
//! function, a USDT `nop`) gets no such word, and return probes neither (their instruction
//! pointer is the return address, as the kernel's after `uprobe_handle_trampoline`): at a
//! leaf without a frame the direct caller is then missing, exactly as with the kernel.
//! Code built without frame pointers gives short or wrong traces, as in the kernel.
//!
//! [`RunContext::at_func_entry`]: crate::context::RunContext::at_func_entry
//!
//! There is no kernel stack under a user-space probe: without `BPF_F_USER_STACK` the trace
//! is empty, which the kernel also gives for a probe on user registers (`get_stackid`:
//! `-EFAULT`; `get_stack`: 0 bytes, or `-EFAULT` when frames are to be skipped).
//!
//! The `pt_regs` is `ctx` (r1) as the kernel's `ARG_PTR_TO_CTX`; if the program passes 0,
//! the run context's registers are used.

use userbpf_maps::stack_trace::PERF_EVENT_MAX_STACK;
use userbpf_maps::{BPF_F_SKIP_FIELD_MASK, BPF_F_USER_STACK, Map};
use userbpf_vm::HelperRegistry;

use super::maps::map_at;
use super::{EFAULT, EINVAL, TASK_SIZE_MAX, helper, read_from, read_u64, write_to, zero_at};
use crate::context;

/// `BPF_F_USER_BUILD_ID` of `get_stack`.
pub const BPF_F_USER_BUILD_ID: u64 = 1 << 11;
/// `struct bpf_stack_build_id` size and the status meaning "no build id, ip is valid".
const BUILD_ID_ENTRY: u64 = 32;
const BPF_STACK_BUILD_ID_IP: i32 = 2;

/// Offsets in the x86-64 `struct pt_regs`.
pub mod pt_regs {
    pub const R15: usize = 0;
    pub const R14: usize = 8;
    pub const R13: usize = 16;
    pub const R12: usize = 24;
    pub const BP: usize = 32;
    pub const BX: usize = 40;
    pub const R11: usize = 48;
    pub const R10: usize = 56;
    pub const R9: usize = 64;
    pub const R8: usize = 72;
    pub const AX: usize = 80;
    pub const CX: usize = 88;
    pub const DX: usize = 96;
    pub const SI: usize = 104;
    pub const DI: usize = 112;
    pub const ORIG_AX: usize = 120;
    pub const IP: usize = 128;
    pub const CS: usize = 136;
    pub const FLAGS: usize = 144;
    pub const SP: usize = 152;
    pub const SS: usize = 160;
    /// `sizeof(struct pt_regs)`.
    pub const SIZE: usize = 168;
}

/// The `pt_regs` a helper with `ctx` works on.
pub(crate) fn regs_of(ctx: u64) -> u64 {
    if ctx != 0 { ctx } else { context::current().map_or(0, |c| c.regs) }
}

const MAX_STACK: usize = PERF_EVENT_MAX_STACK as usize;

/// Whether an entry probe on the instruction starting with `insn` is taken by the kernel to
/// be at a function's entry (`is_uprobe_at_func_entry`): `push %rbp` (0x55), or `endbr64`
/// when the kernel's `is_endbr` knows it, i.e. it was built with `CONFIG_X86_KERNEL_IBT`
/// (without it `is_endbr` is always false). For the agent, when it places a probe (never on
/// a hit): the first call reads the kernel's configuration.
pub fn uprobe_at_func_entry(insn: [u8; 4]) -> bool {
    insn[0] == 0x55 || (insn == [0xf3, 0x0f, 0x1e, 0xfa] && kernel_ibt())
}

/// Whether the running kernel was built with `CONFIG_X86_KERNEL_IBT`: from its configuration
/// where libbpf finds it (`/boot/config-RELEASE`, which Debian, Ubuntu and Fedora install, else
/// `/proc/config.gz`), else from the `ibt` CPU flag, a guess: kernels up to 6.1 hide it without
/// IBT (`X86_DISABLED_FEATURE_IBT`), but a 6.18 kernel built without IBT shows it (a kernel
/// with IBT on a CPU without it is taken for one without). Read once.
fn kernel_ibt() -> bool {
    static IBT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *IBT.get_or_init(|| {
        if let Ok((_, config)) = userbpf_object::system_kconfig(None) {
            return config.get("CONFIG_X86_KERNEL_IBT") == Some(&userbpf_object::KconfigValue::Yes);
        }
        std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|c| {
            c.lines().find(|l| l.starts_with("flags")).is_some_and(|l| l.split_whitespace().any(|f| f == "ibt"))
        })
    })
}

/// Walks the user stack described by the `pt_regs` at `regs` into `ips` (at most
/// `max` entries); returns how many, or None if `regs` cannot be read.
pub fn user_stack(regs: u64, ips: &mut [u64; MAX_STACK], max: usize) -> Option<usize> {
    let max = max.min(MAX_STACK);
    if regs == 0 {
        return Some(0);
    }
    let mut r = [0u8; pt_regs::SIZE];
    if !read_from(&mut r, regs) {
        return None;
    }
    let reg = |off: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&r[off..off + 8]);
        u64::from_ne_bytes(w)
    };
    let (ip, mut fp, sp) = (reg(pt_regs::IP), reg(pt_regs::BP), reg(pt_regs::SP));
    let mut n = 0;
    let mut store = |v: u64, n: &mut usize| {
        if *n < max {
            ips[*n] = v;
            *n += 1;
        }
    };
    store(ip, &mut n);
    // At `push %rbp` / `endbr64` the caller's return address is at [rsp], not yet in the
    // frame chain (the kernel's heuristic, whatever the probe's offset in the function).
    if context::current().is_some_and(|c| c.at_func_entry)
        && let Some(ret) = read_u64(sp)
    {
        store(ret, &mut n);
    }
    while n < max {
        if fp.checked_add(16).is_none_or(|end| end > TASK_SIZE_MAX) {
            break;
        }
        let mut frame = [0u8; 16];
        if !read_from(&mut frame, fp) {
            break;
        }
        let mut w = [0u8; 8];
        w.copy_from_slice(&frame[8..]);
        store(u64::from_ne_bytes(w), &mut n);
        w.copy_from_slice(&frame[..8]);
        fp = u64::from_ne_bytes(w);
    }
    Some(n)
}

/// `long bpf_get_stackid(ctx, map, flags)`: the id of the trace in the stack trace map.
unsafe extern "C" fn get_stackid(ctx: u64, map: u64, flags: u64, _: u64, _: u64) -> u64 {
    let Some((m @ Map::StackTrace(_), _)) = map_at(map) else { return EINVAL };
    let mut ips = [0u64; MAX_STACK];
    let n = if flags & BPF_F_USER_STACK != 0 {
        let depth = (m.spec().value_size / 8) as usize;
        let skip = (flags & BPF_F_SKIP_FIELD_MASK) as usize;
        match user_stack(regs_of(ctx), &mut ips, depth + skip) {
            Some(n) => n,
            None => return EFAULT,
        }
    } else {
        0
    };
    // The map checks the flags first (EINVAL), then skips, hashes and stores.
    match m.get_stackid(&ips[..n], flags) {
        Ok(id) => id as u64,
        Err(e) => e.to_helper_ret(),
    }
}

/// `long bpf_get_stack(ctx, buf, size, flags)`: bytes of `buf` filled with instruction
/// pointers (or `struct bpf_stack_build_id` entries with `BPF_F_USER_BUILD_ID`, all with
/// status "ip only": build ids are not read); the rest of `buf` is zeroed. On error `buf` is
/// zeroed.
unsafe extern "C" fn get_stack(ctx: u64, buf: u64, size: u64, flags: u64, _: u64) -> u64 {
    let size = size as u32 as u64;
    let fail = |err: u64| {
        zero_at(buf, size);
        err
    };
    let user = flags & BPF_F_USER_STACK != 0;
    let build_id = flags & BPF_F_USER_BUILD_ID != 0;
    if flags & !(BPF_F_SKIP_FIELD_MASK | BPF_F_USER_STACK | BPF_F_USER_BUILD_ID) != 0 || (!user && build_id) {
        return fail(EINVAL);
    }
    let elem = if build_id { BUILD_ID_ENTRY } else { 8 };
    if !size.is_multiple_of(elem) {
        return fail(EINVAL);
    }
    let num_elem = (size / elem) as usize;
    let skip = (flags & BPF_F_SKIP_FIELD_MASK) as usize;
    let mut ips = [0u64; MAX_STACK];
    let n = if user {
        match user_stack(regs_of(ctx), &mut ips, num_elem.saturating_add(skip)) {
            Some(n) => n,
            None => return fail(EFAULT),
        }
    } else {
        0
    };
    if n < skip {
        return fail(EFAULT);
    }
    let trace = &ips[skip..n];
    let count = trace.len().min(num_elem);
    let mut off = 0u64;
    if build_id {
        for &ip in &trace[..count] {
            let mut e = [0u8; BUILD_ID_ENTRY as usize];
            e[..4].copy_from_slice(&BPF_STACK_BUILD_ID_IP.to_ne_bytes());
            e[24..].copy_from_slice(&ip.to_ne_bytes());
            if !write_to(buf.wrapping_add(off), &e) {
                return fail(EFAULT);
            }
            off += elem;
        }
    } else {
        let mut bytes = [0u8; MAX_STACK * 8];
        for (chunk, ip) in bytes.chunks_exact_mut(8).zip(&trace[..count]) {
            chunk.copy_from_slice(&ip.to_ne_bytes());
        }
        off = 8 * count as u64;
        if !write_to(buf, &bytes[..8 * count]) {
            return fail(EFAULT);
        }
    }
    if off < size && !zero_at(buf.wrapping_add(off), size - off) {
        return EFAULT;
    }
    off
}

pub(crate) fn register(reg: &mut HelperRegistry) {
    reg.register(helper(27, "get_stackid", get_stackid));
    reg.register(helper(67, "get_stack", get_stack));
}
