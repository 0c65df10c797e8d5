//! Helpers that control the run itself: `bpf_tail_call` and `bpf_loop`. They need the VM's
//! exit requests and callbacks, and the program table of this process.

use userbpf_maps::MapType;
use userbpf_vm::{Helper, HelperRegistry};

use crate::context;
use crate::program::LoadedProgram;

/// The kernel's MAX_TAIL_CALL_CNT: tail calls one run may make.
pub const MAX_TAIL_CALL_CNT: u32 = 33;
/// The kernel's limit on `bpf_loop` iterations (BPF_MAX_LOOPS).
pub const BPF_MAX_LOOPS: u64 = 1 << 23;

const fn neg(errno: i32) -> u64 {
    (-(errno as i64)) as u64
}

/// `long bpf_tail_call(void *ctx, struct bpf_map *prog_array_map, u32 index)`: on success the
/// calling program ends and the called program's r0 is the run's result; on failure (no
/// program at `index`, too many tail calls) the caller goes on, as in the kernel.
unsafe extern "C" fn tail_call(_ctx: u64, map: u64, index: u64, _: u64, _: u64) -> u64 {
    let Some((map, _)) = crate::helpers::maps::map_at(map) else { return neg(libc::EINVAL) };
    if map.map_type() != MapType::BPF_MAP_TYPE_PROG_ARRAY {
        return neg(libc::EINVAL);
    }
    let key = (index as u32).to_ne_bytes();
    // SAFETY: `key` is 4 readable bytes, the prog array's key size.
    let slot = unsafe { map.lookup(key.as_ptr(), 0) };
    if slot.is_null() {
        return neg(libc::ENOENT);
    }
    // SAFETY: a prog array value is a u32 program id; the slot is 8-byte aligned.
    let id = unsafe { (slot as *const u32).read_volatile() };
    let Some(target) = crate::program_table::get(id) else { return neg(libc::ENOENT) };
    // The count lives in the run's context (reset when a run starts).
    let count = context::tail_calls();
    if count >= MAX_TAIL_CALL_CNT {
        return neg(libc::E2BIG);
    }
    context::set_tail_calls(count + 1);
    let Some(run) = context::current() else { return neg(libc::EINVAL) };
    let r0 = run_target(target, run.ctx, run.ctx_len);
    userbpf_vm::request_exit(r0);
    0
}

fn run_target(target: &LoadedProgram, ctx: u64, ctx_len: u64) -> u64 {
    match target.execute(ctx, ctx_len, crate::context::current_cpu()) {
        Ok(v) => v,
        Err(_) => {
            target.stats.errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            0
        }
    }
}

/// `long bpf_loop(u32 nr_loops, void *callback_fn, void *callback_ctx, u64 flags)`: calls
/// `callback_fn(index, callback_ctx)` until it returns 1 or `nr_loops` calls were made;
/// returns the number of calls.
unsafe extern "C" fn bpf_loop(nr: u64, func: u64, cb_ctx: u64, flags: u64, _: u64) -> u64 {
    if flags != 0 {
        return neg(libc::EINVAL);
    }
    let nr = nr as u32 as u64;
    if nr > BPF_MAX_LOOPS {
        return neg(libc::E2BIG);
    }
    for i in 0..nr {
        match userbpf_vm::callback::invoke(func, [i, cb_ctx, 0, 0, 0]) {
            Ok(1) => return i + 1,
            Ok(_) => {}
            // The run ends with this error once the helper returns (the helper is may_exit).
            Err(_) => return i,
        }
    }
    nr
}

pub(crate) fn register(reg: &mut HelperRegistry) {
    reg.register(Helper { may_exit: true, ..Helper::new(12, "tail_call", tail_call) });
    reg.register(Helper { may_exit: true, ..Helper::new(181, "loop", bpf_loop) });
}
