//! Running a program's callbacks from a helper (`bpf_loop`, `bpf_for_each_map_elem`, ...).
//!
//! A program names a function with `lddw rX, BPF_PSEUDO_FUNC`: the JIT gives the address of
//! the function's C-callable entry, the interpreter [`INTERP_FUNC_TAG`]
//! ORed with its instruction index. A helper that got such a value runs the function with
//! [`invoke`], which works for both executors and refuses anything that is not a function of
//! the program running on this thread.
//!
//! A helper that calls `invoke` should be registered with
//! [`may_exit`](crate::Helper::may_exit) set: an error inside the callback (an out-of-bounds
//! access, an abort or fault of JIT code, a call chain too deep) ends the whole run, and the
//! executor stops right after such a helper returns. Without the flag the program goes on
//! after the helper and the run still fails when it ends.

use crate::interp::INTERP_FUNC_TAG;
use crate::program::MAX_CALL_FRAMES;
use crate::run::{RunCtx, RunKind, with_current};
use crate::{HelperFn, VmError};

/// Runs the callback `func` (as the program loaded it with `lddw BPF_PSEUDO_FUNC`) with r1..r5
/// = `args` and returns its r0.
///
/// It must be called by a helper, on the thread of the run that called the helper, and `func`
/// must be a function of the program of that run (the innermost run of the thread): otherwise
/// it returns [`VmError::InvalidCallback`] and runs nothing. The callback gets a frame of its
/// own (a new 512-byte stack) on top of the helper's caller; in the interpreter its frames
/// count toward [`MAX_CALL_FRAMES`] like those of a bpf-to-bpf call, in the JIT each nested
/// callback counts as one frame (see `JitProgram`). Its memory accesses are checked (or not)
/// as the run's are, and it may call helpers, callbacks included.
///
/// An `Err` other than `InvalidCallback` means the run is ending: the callback failed (the
/// error is also recorded, and the run returns it), or a helper inside it asked the run to end
/// ([`VmError::Exited`]). The helper should then stop and return at once (its return value is
/// ignored). `invoke` refuses to run anything more while the run is ending.
pub fn invoke(func: u64, args: [u64; 5]) -> Result<u64, VmError> {
    with_current(|ctx| {
        ctx.ending()?;
        match ctx.kind {
            RunKind::Interp(run) => {
                if func & !((1 << 56) - 1) != INTERP_FUNC_TAG {
                    return Err(invalid(func, "not a function of the interpreted program running on this thread"));
                }
                let pc = (func & ((1 << 56) - 1)) as usize;
                if run.interp().program().subprogs().binary_search(&pc).is_err() {
                    return Err(invalid(func, "not the start of a function of the program running on this thread"));
                }
                let result = run.invoke(ctx, pc, args);
                if let Err(e) = &result {
                    ctx.set_error(e.clone());
                }
                ctx.ending()?;
                result
            }
            RunKind::Jit(prog) => invoke_jit(ctx, prog, func, args),
        }
    })
    .unwrap_or_else(|| Err(invalid(func, "no program is running on this thread")))
}

fn invalid(func: u64, reason: &'static str) -> VmError {
    VmError::InvalidCallback { func, reason }
}

fn invoke_jit(ctx: &RunCtx<'_>, prog: &crate::JitProgram, func: u64, args: [u64; 5]) -> Result<u64, VmError> {
    let Some(k) = usize::try_from(func).ok().and_then(|a| prog.entry_index(a)) else {
        return Err(invalid(func, "not the entry of a function of the JIT program running on this thread"));
    };
    let nested = ctx.callbacks.get();
    if nested + 1 >= MAX_CALL_FRAMES {
        let e = VmError::CallDepth { pc: prog.program().subprogs()[k], max: MAX_CALL_FRAMES };
        ctx.set_error(e.clone());
        return Err(e);
    }
    ctx.callbacks.set(nested + 1);
    // SAFETY: `func` is the address of `Entry(k)` of `prog` (checked above), a function with
    // this C signature in code mapped executable while `prog` lives, and `prog` is borrowed by
    // the run in progress on this thread. Its memory accesses are covered by the guarantee the
    // caller of that `JitProgram::run` gave for the program (callbacks included).
    let r0 = unsafe {
        let entry = std::mem::transmute::<usize, HelperFn>(func as usize);
        entry(args[0], args[1], args[2], args[3], args[4])
    };
    ctx.callbacks.set(nested);
    ctx.ending()?;
    Ok(r0)
}
