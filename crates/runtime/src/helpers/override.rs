//! `bpf_override_return` (helper 58) for uprobe and uretprobe programs, and the userbpf
//! extension that lets uprobe programs change the arguments of the probed function.
//!
//! # Overriding at a function's entry
//!
//! As the kernel does for kprobes (`override_function_with_return`): the helper writes the
//! value into the probe's `pt_regs.ax` and points `pt_regs.ip` at [`just_return`], a lone
//! `ret`. The hook resumes the thread at the changed `ip` with the registers of the
//! `pt_regs` (every callee-saved register, `rsp` and the flags as they were at the call),
//! so the `ret` goes straight back to the caller with `value` in `rax`: the probed function
//! does not run. Other programs on the same function still run (in the kernel's order, the
//! last attached first); the value of the last override to run is the one the caller gets.
//! Return probes on the function still fire, with the overridden value (the kernel's kretprobes do the same: the
//! return address was already redirected when the override ran); see `userbpf_hook`.
//!
//! The kernel allows the override only on a probe at a function's entry (it refuses to
//! attach a program calling it anywhere else): so does userbpf (the agent refuses the
//! link, naming the function and offset), and the helper, should it run at another place,
//! changes nothing and returns `-EINVAL`.
//!
//! A run that does not happen overrides nothing: a hit skipped as recursion (a probed function
//! reached from inside a program's helper, or from a signal handler interrupting a run) or for
//! want of a CPU slot (every slot held for `context::SLOT_WAIT_LIMIT_NS`) runs the function, as
//! the kernel's missed kprobes do.
//!
//! # Overriding at a function's return
//!
//! In a uretprobe program the helper replaces the return value (`pt_regs.ax`) the caller
//! gets; the next program on the same return sees the new value.
//!
//! # Argument writes (userbpf extension)
//!
//! A uprobe program in a section spelled `uprobe.w` (`SEC("uprobe.w/BIN:FUNC")`, as libbpf
//! spells writable raw tracepoints `raw_tp.w`), or loaded through `userbpf load` with
//! [`BPF_F_USERBPF_WRITABLE_ARGS`] in `prog_flags`, may store into the argument registers of
//! its `struct pt_regs` (di, si, dx, cx, r8, r9: `PT_REGS_PARM1(ctx) = v` ...); the function
//! then runs with the new values. The verifier refuses such stores in every other program,
//! as the kernel does. Nothing here is needed for it: the hook writes the `pt_regs` back.

use userbpf_vm::HelperRegistry;

use super::stack::pt_regs;
use super::{EINVAL, helper};
use crate::context;

/// The `prog_flags` bit of `BPF_PROG_LOAD` with which a loader asks userbpf for a uprobe
/// program that may write argument registers (what `SEC("uprobe.w/...")` says to `userbpf
/// run`). The kernel refuses unknown flags, so such a program never loads into the kernel.
pub const BPF_F_USERBPF_WRITABLE_ARGS: u32 = 1 << 30;

/// `BPF_FUNC_override_return`.
pub const OVERRIDE_RETURN: u32 = 58;

/// The section prefix of uprobe programs that may write argument registers.
pub const WRITABLE_ARGS_SECTION: &str = "uprobe.w";

/// The kernel's `just_return_func`: a bare `ret`, where an overridden entry probe resumes.
#[unsafe(naked)]
pub extern "C" fn just_return() {
    core::arch::naked_asm!("ret")
}

/// The address an override points `pt_regs.ip` at.
pub fn just_return_address() -> u64 {
    just_return as *const () as usize as u64
}

/// `long bpf_override_return(struct pt_regs *regs, u64 rc)`.
unsafe extern "C" fn override_return(ctx: u64, rc: u64, _: u64, _: u64, _: u64) -> u64 {
    let Some(c) = context::current() else { return EINVAL };
    // Only the probe's own registers (the verifier makes r1 the context; a copy, as USDT
    // probes sharing a hook get, would be lost).
    if c.regs == 0 || ctx != c.regs {
        return EINVAL;
    }
    let regs = ctx as *mut u64;
    let ax = pt_regs::AX / 8;
    let ip = pt_regs::IP / 8;
    if c.retval.is_some() {
        // SAFETY: `ctx` is the live pt_regs of this run's probe (checked above), 8-aligned.
        unsafe { regs.add(ax).write(rc) };
        return 0;
    }
    // SAFETY: as above.
    let at = unsafe { regs.add(ip).read() };
    let gadget = just_return_address();
    // At the function's entry, or already overridden by an earlier program of this hit.
    if c.func_ip == 0 || (at != c.func_ip && at != gadget) {
        return EINVAL;
    }
    // SAFETY: as above.
    unsafe {
        regs.add(ax).write(rc);
        regs.add(ip).write(gadget);
    }
    0
}

pub(crate) fn register(reg: &mut HelperRegistry) {
    reg.register(helper(OVERRIDE_RETURN, "override_return", override_return));
}
