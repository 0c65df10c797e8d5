//! Helper prototypes, as the kernel's `struct bpf_func_proto`: the type of each argument
//! and of the return value, for every helper userbpf implements. A call to a helper that
//! is not listed is refused, naming the helper.

/// One argument's type (the kernel's `enum bpf_arg_type`, with its flags folded in).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Arg {
    /// Not an argument: the register is not checked.
    DontCare,
    /// `ARG_ANYTHING`: any initialised register.
    Anything,
    /// `ARG_CONST_MAP_PTR`: a map from `lddw`.
    ConstMapPtr,
    /// `ARG_PTR_TO_MAP_KEY`: key_size readable bytes.
    MapKey,
    /// `ARG_PTR_TO_MAP_VALUE`: value_size readable bytes.
    MapValue,
    /// `ARG_PTR_TO_MAP_VALUE | MEM_UNINIT`: value_size bytes the helper writes.
    UninitMapValue,
    /// `ARG_PTR_TO_MEM`, sized by the next argument. `write`: the helper writes it
    /// (`MEM_UNINIT`: it may be uninitialised stack); `nullable`: NULL is accepted.
    Mem { write: bool, uninit: bool, nullable: bool },
    /// `ARG_CONST_SIZE`: the size of the previous memory argument, bounded, not zero.
    ConstSize,
    /// `ARG_CONST_SIZE_OR_ZERO`.
    ConstSizeOrZero,
    /// `ARG_PTR_TO_CTX`: the context, unmodified.
    Ctx,
    /// `ARG_PTR_TO_RINGBUF_MEM | OBJ_RELEASE`: a ring buffer record, released by the call.
    RingbufRelease,
    /// `ARG_CONST_ALLOC_SIZE_OR_ZERO`: a constant size of memory the helper returns.
    AllocSize,
    /// `ARG_PTR_TO_FUNC`: a callback (`bpf_loop`).
    Func,
    /// `ARG_PTR_TO_STACK_OR_NULL`: the callback's context.
    StackOrNull,
    /// `ARG_PTR_TO_CONST_STR`: a NUL-terminated string in a read-only map.
    ConstStr,
    /// `ARG_PTR_TO_LONG` (fixed-size 8 bytes the helper writes).
    LongOut,
}

/// The kernel's `enum bpf_return_type` (the ones userbpf's helpers have).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Ret {
    Integer,
    Void,
    /// A map value of the map given as argument 1, or NULL.
    MapValueOrNull,
    /// A ring buffer record of the constant size given, or NULL; a reference.
    AllocMemOrNull,
}

#[derive(Clone, Copy, Debug)]
pub struct Proto {
    pub id: u32,
    pub args: [Arg; 5],
    pub ret: Ret,
}

use Arg::*;

const fn p(id: u32, args: [Arg; 5], ret: Ret) -> Proto {
    Proto { id, args, ret }
}

const N: Arg = DontCare;
const RD: Arg = Mem { write: false, uninit: false, nullable: false };
const RD_NULL: Arg = Mem { write: false, uninit: false, nullable: true };
const WR_UNINIT: Arg = Mem { write: true, uninit: true, nullable: false };

/// The prototypes (kernel 6.x) of the helpers userbpf implements.
static PROTOS: &[Proto] = &[
    p(1, [ConstMapPtr, MapKey, N, N, N], Ret::MapValueOrNull), // map_lookup_elem
    p(2, [ConstMapPtr, MapKey, MapValue, Anything, N], Ret::Integer), // map_update_elem
    p(3, [ConstMapPtr, MapKey, N, N, N], Ret::Integer),        // map_delete_elem
    p(4, [WR_UNINIT, ConstSizeOrZero, Anything, N, N], Ret::Integer), // probe_read
    p(5, [N; 5], Ret::Integer),                                // ktime_get_ns
    p(6, [RD, ConstSize, N, N, N], Ret::Integer),              // trace_printk
    p(7, [N; 5], Ret::Integer),                                // get_prandom_u32
    p(8, [N; 5], Ret::Integer),                                // get_smp_processor_id
    p(12, [Ctx, ConstMapPtr, Anything, N, N], Ret::Void),      // tail_call
    p(14, [N; 5], Ret::Integer),                               // get_current_pid_tgid
    p(15, [N; 5], Ret::Integer),                               // get_current_uid_gid
    p(16, [WR_UNINIT, ConstSize, N, N, N], Ret::Integer),      // get_current_comm
    p(25, [Ctx, ConstMapPtr, Anything, RD, ConstSizeOrZero], Ret::Integer), // perf_event_output
    p(27, [Ctx, ConstMapPtr, Anything, N, N], Ret::Integer),   // get_stackid
    p(35, [N; 5], Ret::Integer),                               // get_current_task
    p(36, [Anything, RD, ConstSize, N, N], Ret::Integer),      // probe_write_user
    p(37, [ConstMapPtr, Anything, N, N, N], Ret::Integer),     // current_task_under_cgroup
    p(45, [WR_UNINIT, ConstSizeOrZero, Anything, N, N], Ret::Integer), // probe_read_str
    p(58, [Ctx, Anything, N, N, N], Ret::Integer),             // override_return
    p(67, [Ctx, WR_UNINIT, ConstSizeOrZero, Anything, N], Ret::Integer), // get_stack
    p(80, [N; 5], Ret::Integer),                               // get_current_cgroup_id
    p(87, [ConstMapPtr, MapValue, Anything, N, N], Ret::Integer), // map_push_elem
    p(88, [ConstMapPtr, UninitMapValue, N, N, N], Ret::Integer), // map_pop_elem
    p(89, [ConstMapPtr, UninitMapValue, N, N, N], Ret::Integer), // map_peek_elem
    p(105, [RD, ConstSize, Anything, LongOut, N], Ret::Integer), // strtol
    p(106, [RD, ConstSize, Anything, LongOut, N], Ret::Integer), // strtoul
    p(109, [Anything, N, N, N, N], Ret::Integer),              // send_signal
    p(112, [WR_UNINIT, ConstSizeOrZero, Anything, N, N], Ret::Integer), // probe_read_user
    p(113, [WR_UNINIT, ConstSizeOrZero, Anything, N, N], Ret::Integer), // probe_read_kernel
    p(114, [WR_UNINIT, ConstSizeOrZero, Anything, N, N], Ret::Integer), // probe_read_user_str
    p(115, [WR_UNINIT, ConstSizeOrZero, Anything, N, N], Ret::Integer), // probe_read_kernel_str
    p(117, [Anything, N, N, N, N], Ret::Integer),              // send_signal_thread
    p(118, [N; 5], Ret::Integer),                              // jiffies64
    p(123, [Anything, N, N, N, N], Ret::Integer),              // get_current_ancestor_cgroup_id
    p(125, [N; 5], Ret::Integer),                              // ktime_get_boot_ns
    p(130, [ConstMapPtr, RD, ConstSizeOrZero, Anything, N], Ret::Integer), // ringbuf_output
    p(131, [ConstMapPtr, AllocSize, Anything, N, N], Ret::AllocMemOrNull), // ringbuf_reserve
    p(132, [RingbufRelease, Anything, N, N, N], Ret::Void),    // ringbuf_submit
    p(133, [RingbufRelease, Anything, N, N, N], Ret::Void),    // ringbuf_discard
    p(134, [ConstMapPtr, Anything, N, N, N], Ret::Integer),    // ringbuf_query
    p(160, [N; 5], Ret::Integer),                              // ktime_get_coarse_ns
    p(
        165,
        [Mem { write: true, uninit: false, nullable: true }, ConstSizeOrZero, ConstStr, RD_NULL, ConstSizeOrZero],
        Ret::Integer,
    ), // snprintf
    p(173, [Ctx, N, N, N, N], Ret::Integer),                   // get_func_ip
    p(174, [Ctx, N, N, N, N], Ret::Integer),                   // get_attach_cookie
    p(177, [RD, ConstSize, RD_NULL, ConstSizeOrZero, N], Ret::Integer), // trace_vprintk
    p(181, [Anything, Func, StackOrNull, Anything, N], Ret::Integer), // loop
    p(182, [RD, ConstSize, ConstStr, N, N], Ret::Integer),     // strncmp
    p(183, [Ctx, Anything, LongOut, N, N], Ret::Integer),      // get_func_arg
    p(184, [Ctx, LongOut, N, N, N], Ret::Integer),             // get_func_ret
    p(185, [Ctx, N, N, N, N], Ret::Integer),                   // get_func_arg_cnt
    p(195, [ConstMapPtr, MapKey, Anything, N, N], Ret::MapValueOrNull), // map_lookup_percpu_elem
    // userbpf's own helpers (ids from 1000, user space only). A write's buffer may be the
    // target's memory, not the program's: the helper copies it through the fault guard.
    p(1000, [Anything, Anything, Anything, Anything, N], Ret::Integer), // io_uring_write
    p(1001, [Anything, N, N, N, N], Ret::Integer),                      // io_uring_fsync
    p(1002, [Anything, N, N, N, N], Ret::Integer),                      // io_uring_fdatasync
    p(1003, [Anything, N, N, N, N], Ret::Integer),                      // io_uring_wait
    p(1004, [Anything, Anything, N, N, N], Ret::Integer),               // io_uring_wait_timeout
];

/// Helpers the kernel lets only GPL-compatible programs call (`gpl_only` in their
/// `bpf_func_proto`).
pub const GPL_ONLY: &[u32] = &[
    4, 6, 22, 25, 27, 35, 36, 45, 55, 58, 67, 112, 113, 114, 115, 158, 165, 169, 170, 171, 172, 173, 175, 176, 177, 191,
];

/// The kernel's `license_is_gpl_compatible`.
pub fn license_is_gpl_compatible(license: &str) -> bool {
    matches!(license, "GPL" | "GPL v2" | "GPL and additional rights" | "Dual BSD/GPL" | "Dual MIT/GPL" | "Dual MPL/GPL")
}

/// The prototype of helper `id`, if userbpf implements it.
pub fn proto(id: u32) -> Option<&'static Proto> {
    PROTOS.iter().find(|p| p.id == id)
}

/// Every helper id with a prototype.
pub fn ids() -> impl Iterator<Item = u32> {
    PROTOS.iter().map(|p| p.id)
}

/// The kernel's `func_id_name`: `bpf_map_lookup_elem`, or `unknown`.
pub fn name(id: u32) -> String {
    match userbpf_isa::helper_names::helper_name(id) {
        Some(n) => format!("bpf_{n}"),
        None => "unknown".into(),
    }
}

// Map types (uapi `enum bpf_map_type`).
const PROG_ARRAY: u32 = 3;
const PERF_EVENT_ARRAY: u32 = 4;
const PERCPU_HASH: u32 = 5;
pub const PERCPU_ARRAY: u32 = 6;
const STACK_TRACE: u32 = 7;
const CGROUP_ARRAY: u32 = 8;
const LRU_PERCPU_HASH: u32 = 10;
const QUEUE: u32 = 22;
const STACK: u32 = 23;
const SOCKMAP: u32 = 15;
const SOCKHASH: u32 = 18;
const RINGBUF: u32 = 27;
const BLOOM_FILTER: u32 = 30;
pub const ARRAY: u32 = 2;

/// The kernel's `check_map_func_compatibility`: maps that only some helpers take, and
/// helpers that only take some maps. `Err` carries the kernel's message.
pub fn check_map_compat(func: u32, map_type: u32) -> Result<(), String> {
    let only = |allowed: &[u32]| allowed.contains(&func);
    let map_ok = match map_type {
        PROG_ARRAY => only(&[12]),
        PERF_EVENT_ARRAY => only(&[25, 22, 55]),
        STACK_TRACE => only(&[27]),
        CGROUP_ARRAY => only(&[33, 37]),
        RINGBUF => only(&[130, 131, 134]),
        QUEUE | STACK => only(&[87, 88, 89]),
        BLOOM_FILTER => only(&[87, 89]),
        // Lookups return sockets (references userbpf programs cannot release).
        SOCKMAP | SOCKHASH => false,
        _ => true,
    };
    let func_ok = match func {
        12 => map_type == PROG_ARRAY,
        25 => map_type == PERF_EVENT_ARRAY,
        27 => map_type == STACK_TRACE,
        37 => map_type == CGROUP_ARRAY,
        130 | 131 | 134 => map_type == RINGBUF,
        87 | 89 => matches!(map_type, QUEUE | STACK | BLOOM_FILTER),
        88 => matches!(map_type, QUEUE | STACK),
        195 => matches!(map_type, PERCPU_HASH | PERCPU_ARRAY | LRU_PERCPU_HASH),
        _ => true,
    };
    if map_ok && func_ok {
        Ok(())
    } else {
        Err(format!("cannot pass map_type {map_type} into func {}#{func}", name(func)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_proto_names_a_kernel_helper_once() {
        let mut seen = std::collections::HashSet::new();
        for p in PROTOS {
            assert!(userbpf_isa::helper_names::helper_name(p.id).is_some(), "{}", p.id);
            assert!(seen.insert(p.id), "{} twice", p.id);
            // A size argument follows a memory argument.
            for i in 0..5 {
                if matches!(p.args[i], ConstSize | ConstSizeOrZero) {
                    assert!(i > 0 && matches!(p.args[i - 1], Mem { .. }), "helper {} arg {}", p.id, i + 1);
                }
            }
        }
        assert_eq!(name(1), "bpf_map_lookup_elem");
        assert!(check_map_compat(1, RINGBUF).is_err());
        assert!(check_map_compat(131, ARRAY).is_err());
        assert!(check_map_compat(131, RINGBUF).is_ok());
    }
}
