//! Reading and writing arbitrary memory: `probe_read`, `probe_read_user`,
//! `probe_read_kernel`, their `_str` forms, and `probe_write_user`.
//!
//! Every access goes through the VM's guard: an unmapped or protected address gives
//! `-EFAULT` instead of a crash. On failure the destination is zeroed, as the kernel does.
//! What is kernel memory to the kernel's eBPF and lies in the process here, the program's
//! own stack and the memory of its maps (a map value a program looked up, a ring buffer
//! sample), the kernel forms read as the kernel's do (BCC's gethostlatency copies strings out
//! of a map value with `bpf_probe_read_kernel`). On any other address they fail as the
//! kernel's own do on addresses they may not read (`-ERANGE` for user and non-canonical
//! addresses) or on unmapped ones (`-EFAULT` for the kernel half). (The agent also gives
//! probes' `pt_regs`, kernel memory in the kernel, to `bpf_probe_read_kernel`.)

use userbpf_vm::{HelperRegistry, guard};

use super::{EFAULT, TASK_SIZE_MAX, helper, neg, zero_at};

/// Lowest address of the kernel half (canonical, 4-level paging).
const KERNEL_START: u64 = 0xffff_8000_0000_0000;

/// `copy_from_user_nofault`: 0 or `-EFAULT`; `dst` zeroed on failure.
pub(crate) fn read_user(dst: u64, size: u64, src: u64) -> u64 {
    if size == 0 {
        return 0;
    }
    let ok = src.checked_add(size).is_some_and(|end| end <= TASK_SIZE_MAX)
        // SAFETY: the guard tolerates any src and dst; dst is the program's buffer.
        && unsafe { guard::copy(dst as *mut u8, src as *const u8, size) } == 0;
    if ok {
        0
    } else {
        zero_at(dst, size);
        EFAULT
    }
}

/// Whether `[src, src+len)` is what the kernel's eBPF has as kernel memory and lies in the
/// process: the run's stack (see [`crate::context::run_stack`]) or a registered map's memory.
/// Off the hit path (a scan of the map registry).
fn program_memory(src: u64, len: u64) -> bool {
    let Some(end) = src.checked_add(len) else {
        return false;
    };
    if let Some((low, high)) = crate::context::run_stack()
        && src >= low
        && end <= high
    {
        return true;
    }
    super::maps::registry_contains(src, len) || super::current_task::contains(src, len)
}

/// `copy_from_kernel_nofault` in user space: a copy from the program's own memory (its stack,
/// its maps'); else `-ERANGE` where the kernel refuses the address, `-EFAULT` elsewhere
/// (nothing is mapped there); `dst` zeroed on failure.
fn read_kernel(dst: u64, size: u64, src: u64) -> u64 {
    if size == 0 {
        return if src >= KERNEL_START || program_memory(src, 1) { 0 } else { neg(libc::ERANGE) };
    }
    if src < KERNEL_START && program_memory(src, size) {
        // SAFETY: the guard tolerates any src and dst; dst is the program's buffer.
        if unsafe { guard::copy(dst as *mut u8, src as *const u8, size) } == 0 {
            return 0;
        }
        zero_at(dst, size);
        return EFAULT;
    }
    let allowed = src >= KERNEL_START;
    zero_at(dst, size);
    if allowed { EFAULT } else { neg(libc::ERANGE) }
}

/// `strncpy_from_user_nofault`: bytes copied including the NUL (at most `size - 1` then a
/// NUL), or `-EFAULT` with `dst` zeroed.
pub(crate) fn read_user_str(dst: u64, size: u64, src: u64) -> u64 {
    if size == 0 {
        return 0;
    }
    if src < TASK_SIZE_MAX {
        // SAFETY: the guard tolerates any src and dst; dst is the program's buffer.
        let r = unsafe { guard::copy_str(dst as *mut u8, src as *const u8, size) };
        if r > 0 {
            return r as u64;
        }
    }
    zero_at(dst, size);
    EFAULT
}

/// `strncpy_from_kernel_nofault` in user space: from the program's own memory (see
/// [`read_kernel`]; as in the kernel, the copy goes on to the NUL or `size`, wherever the
/// object the string starts in ends).
fn read_kernel_str(dst: u64, size: u64, src: u64) -> u64 {
    if size == 0 {
        return 0;
    }
    if src < KERNEL_START && program_memory(src, 1) {
        // SAFETY: the guard tolerates any src and dst; dst is the program's buffer.
        let r = unsafe { guard::copy_str(dst as *mut u8, src as *const u8, size) };
        if r > 0 {
            return r as u64;
        }
        zero_at(dst, size);
        return EFAULT;
    }
    zero_at(dst, size);
    if src >= KERNEL_START { EFAULT } else { neg(libc::ERANGE) }
}

/// `long bpf_probe_read(dst, size, unsafe_ptr)`: user memory below TASK_SIZE, else kernel
/// memory (x86-64's non-overlapping address spaces).
unsafe extern "C" fn probe_read(dst: u64, size: u64, src: u64, _: u64, _: u64) -> u64 {
    let size = size as u32 as u64;
    if src < TASK_SIZE_MAX { read_user(dst, size, src) } else { read_kernel(dst, size, src) }
}

/// `long bpf_probe_read_user(dst, size, unsafe_ptr)`.
#[unsafe(link_section = ".text.hot.userbpf")]
unsafe extern "C" fn probe_read_user(dst: u64, size: u64, src: u64, _: u64, _: u64) -> u64 {
    read_user(dst, size as u32 as u64, src)
}

/// `long bpf_probe_read_kernel(dst, size, unsafe_ptr)`.
unsafe extern "C" fn probe_read_kernel(dst: u64, size: u64, src: u64, _: u64, _: u64) -> u64 {
    read_kernel(dst, size as u32 as u64, src)
}

/// `long bpf_probe_read_str(dst, size, unsafe_ptr)`.
unsafe extern "C" fn probe_read_str(dst: u64, size: u64, src: u64, _: u64, _: u64) -> u64 {
    let size = size as u32 as u64;
    if src < TASK_SIZE_MAX { read_user_str(dst, size, src) } else { read_kernel_str(dst, size, src) }
}

/// `long bpf_probe_read_user_str(dst, size, unsafe_ptr)`.
#[unsafe(link_section = ".text.hot.userbpf")]
unsafe extern "C" fn probe_read_user_str(dst: u64, size: u64, src: u64, _: u64, _: u64) -> u64 {
    read_user_str(dst, size as u32 as u64, src)
}

/// `long bpf_probe_read_kernel_str(dst, size, unsafe_ptr)`.
unsafe extern "C" fn probe_read_kernel_str(dst: u64, size: u64, src: u64, _: u64, _: u64) -> u64 {
    read_kernel_str(dst, size as u32 as u64, src)
}

/// `long bpf_probe_write_user(dst, src, len)`: 0 or `-EFAULT` (`copy_to_user_nofault`).
unsafe extern "C" fn probe_write_user(dst: u64, src: u64, len: u64, _: u64, _: u64) -> u64 {
    let len = len as u32 as u64;
    if len == 0 {
        return 0;
    }
    if dst.checked_add(len).is_none_or(|end| end > TASK_SIZE_MAX) {
        return EFAULT;
    }
    // SAFETY: the guard tolerates any addresses; writing wherever the program says is this
    // helper's purpose, as in the kernel.
    if unsafe { guard::copy(dst as *mut u8, src as *const u8, len) } == 0 { 0 } else { EFAULT }
}

pub(crate) fn register(reg: &mut HelperRegistry) {
    reg.register(helper(4, "probe_read", probe_read));
    reg.register(helper(36, "probe_write_user", probe_write_user));
    reg.register(helper(45, "probe_read_str", probe_read_str));
    reg.register(helper(112, "probe_read_user", probe_read_user));
    reg.register(helper(113, "probe_read_kernel", probe_read_kernel));
    reg.register(helper(114, "probe_read_user_str", probe_read_user_str));
    reg.register(helper(115, "probe_read_kernel_str", probe_read_kernel_str));
}
