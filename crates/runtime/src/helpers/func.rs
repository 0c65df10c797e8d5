//! The probed function: `get_func_ip`, `get_attach_cookie`, `get_func_arg`,
//! `get_func_ret`, `get_func_arg_cnt`, from the run context ([`crate::context`]).
//!
//! Arguments come from the `pt_regs` of the probe (`ctx`, or the run context's when `ctx` is
//! 0), in the x86-64 calling convention's order: rdi, rsi, rdx, rcx, r8, r9. Only those six
//! can be read (arguments passed on the stack are not), and only below the argument count
//! the probe knows.

use userbpf_vm::HelperRegistry;

use super::stack::{pt_regs, regs_of};
use super::{EFAULT, EINVAL, helper, neg, read_u64, write_to};
use crate::context;

const ARG_REGS: [usize; 6] = [pt_regs::DI, pt_regs::SI, pt_regs::DX, pt_regs::CX, pt_regs::R8, pt_regs::R9];

/// `u64 bpf_get_func_ip(ctx)`: the probed function's address (0 outside a probe).
unsafe extern "C" fn get_func_ip(_ctx: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    context::current().map_or(0, |c| c.func_ip)
}

/// `u64 bpf_get_attach_cookie(ctx)`: the attachment's cookie (0 if none).
unsafe extern "C" fn get_attach_cookie(_ctx: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    context::current().map_or(0, |c| c.cookie)
}

/// `long bpf_get_func_arg(ctx, n, *value)`: 0 with argument `n` in `*value`, `-EINVAL` if
/// `n` is not below the argument count (or 6).
unsafe extern "C" fn get_func_arg(ctx: u64, n: u64, value: u64, _: u64, _: u64) -> u64 {
    let n = n as u32 as u64;
    let nr = context::current().map_or(0, |c| c.nr_args) as u64;
    if n >= nr {
        return EINVAL;
    }
    let Some(&off) = ARG_REGS.get(n as usize) else { return EINVAL };
    let Some(v) = read_u64(regs_of(ctx).wrapping_add(off as u64)) else { return EFAULT };
    if !write_to(value, &v.to_ne_bytes()) {
        return EFAULT;
    }
    0
}

/// `long bpf_get_func_ret(ctx, *value)`: 0 with the return value in `*value` in a return
/// probe, `-EOPNOTSUPP` elsewhere.
unsafe extern "C" fn get_func_ret(_ctx: u64, value: u64, _: u64, _: u64, _: u64) -> u64 {
    let Some(ret) = context::current().and_then(|c| c.retval) else { return neg(libc::EOPNOTSUPP) };
    if !write_to(value, &ret.to_ne_bytes()) {
        return EFAULT;
    }
    0
}

/// `u64 bpf_get_func_arg_cnt(ctx)`.
unsafe extern "C" fn get_func_arg_cnt(_ctx: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    context::current().map_or(0, |c| c.nr_args as u64)
}

pub(crate) fn register(reg: &mut HelperRegistry) {
    reg.register(helper(173, "get_func_ip", get_func_ip));
    reg.register(helper(174, "get_attach_cookie", get_attach_cookie));
    reg.register(helper(183, "get_func_arg", get_func_arg));
    reg.register(helper(184, "get_func_ret", get_func_ret));
    reg.register(helper(185, "get_func_arg_cnt", get_func_arg_cnt));
}
