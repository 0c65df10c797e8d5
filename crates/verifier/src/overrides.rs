//! The rules of userbpf's uprobe extensions (see `userbpf_runtime::helpers::overrides`):
//!
//! - `bpf_override_return` (helper 58, `(ctx, u64)`, GPL-only as in the kernel) is allowed in
//!   kprobe-type programs only: in user space those are the uprobes, uretprobes and USDT
//!   probes (where the override itself is allowed at a function's entry, checked at attach as
//!   the kernel checks it, and at a return).
//! - A kprobe-type program verified with [`Options::writable_args`](crate::Options) may
//!   store into the argument registers of its `struct pt_regs` (di, si, dx, cx, r8, r9:
//!   `PT_REGS_PARM1..6`), whole or in part, scalars only (a pointer into the program's stack
//!   or a map would outlive the run in the function's hands); the function then runs with
//!   the new values. Every other store into the context stays refused, as the kernel
//!   refuses them all for these programs.

use crate::ProgType;
use crate::ctx::PT_REGS_SIZE;

/// `BPF_FUNC_override_return`.
pub const OVERRIDE_RETURN: u32 = 58;

/// Offsets of the argument registers in the x86-64 `struct pt_regs`: r9, r8, cx, dx, si, di.
const ARG_REG_OFFSETS: [i64; 6] = [64, 72, 88, 96, 104, 112];

/// Whether a program of `prog_type` may call helper `id` (beyond having a prototype):
/// `Err` carries the kernel's message for a helper its type's `get_func_proto` lacks.
pub fn helper_allowed(prog_type: ProgType, id: u32) -> Result<(), String> {
    if id == OVERRIDE_RETURN && prog_type != ProgType::Kprobe {
        return Err(format!("program of this type cannot use helper bpf_override_return#{id}"));
    }
    Ok(())
}

/// Whether a store of `size` bytes at `off` of the context is an argument write a
/// [`writable_args`](crate::Options) program of `prog_type` may make.
pub fn arg_write_ok(prog_type: ProgType, writable_args: bool, off: i64, size: i64) -> bool {
    writable_args
        && prog_type == ProgType::Kprobe
        && off >= 0
        && off + size <= PT_REGS_SIZE
        && off % size == 0
        && ARG_REG_OFFSETS.iter().any(|&r| off >= r && off + size <= r + 8)
}

/// What to add to the refusal of a context store: where a kprobe-type program stores into
/// an argument register without [`Options::writable_args`](crate::Options), the userbpf
/// section that allows it.
pub fn ctx_write_hint(prog_type: ProgType, off: i64, size: i64) -> &'static str {
    if arg_write_ok(prog_type, true, off, size) {
        " (argument registers may be written only by SEC(\"uprobe.w/...\") programs, a userbpf extension)"
    } else {
        ""
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argument_registers_only() {
        let k = ProgType::Kprobe;
        for off in ARG_REG_OFFSETS {
            assert!(arg_write_ok(k, true, off, 8));
            assert!(arg_write_ok(k, true, off + 4, 4));
            assert!(!arg_write_ok(k, false, off, 8));
        }
        // ax (80), ip (128), sp (152), bx (40), the callee-saved ones.
        for off in [0, 8, 16, 24, 32, 40, 48, 56, 80, 120, 128, 136, 144, 152, 160] {
            assert!(!arg_write_ok(k, true, off, 8), "{off}");
        }
        assert!(!arg_write_ok(k, true, 110, 4), "misaligned");
        assert!(!arg_write_ok(ProgType::Tracepoint { record_size: None }, true, 112, 8));
        assert!(helper_allowed(k, 58).is_ok());
        assert!(helper_allowed(ProgType::RawTracepoint { args: None }, 58).is_err());
    }
}
