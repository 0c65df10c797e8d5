//! The helpers programs call, with the kernel's ids (`BPF_FUNC_*`), argument order, return
//! values and errno codes, for programs running in user space.
//!
//! One module per family: [`maps`] (map helpers and the process-wide map registry),
//! [`time`], [`task`] (pid, uid, comm, random numbers, CPU, signals), [`current_task`] (a
//! stand-in `task_struct` at the kernel's offsets), [`probe`]
//! (`probe_read*`, `probe_write_user`), [`printf`] (`trace_printk`, `trace_vprintk`,
//! `snprintf` and the trace sink), [`output`] (perf event and ring buffer output),
//! [`stack`] (`get_stackid`, `get_stack`), [`func`] (function ip, cookie, arguments, return
//! value), [`overrides`] (`override_return`, and the argument writes of `uprobe.w`
//! programs), [`string`] (`strncmp`, `strtol`, `strtoul`), [`cgroup`] (cgroup v2 ids and
//! `current_task_under_cgroup`, which make system calls) and [`io_uring`] (userbpf's own
//! helpers, above the kernel's ids: writes and fsyncs through a ring per thread).
//!
//! # Rules every helper follows
//!
//! - They run on the hot path of a probe hit: no allocation, no lock that can block, and no
//!   system call unless the helper's nature needs one (`send_signal`, submitting to and
//!   waiting on io_uring; a thread's ring is set up by its first such call); per-thread caches
//!   (pid, comm, credentials) live in the runtime's thread block ([`crate::context`],
//!   initial-exec TLS, no `__tls_get_addr`), the random state in a thread-local.
//! - They never panic (a panic across `extern "C"` aborts the process).
//! - Errors are the kernel's, as a negative errno in the u64 return value.
//!
//! # Which pointers are trusted
//!
//! The kernel's verifier vouches for the memory arguments of helpers; userbpf has no such
//! verifier, so:
//! - memory the program names for a helper to read or write (format strings, `snprintf`
//!   output, `probe_read` destinations, the data of `perf_event_output` (copied by the guard
//!   straight into the perf ring: a fault publishes nothing), `get_stack` buffers...) is
//!   accessed with the VM's fault-tolerant [`userbpf_vm::guard`] copies: a bad address gives
//!   `-EFAULT`, never a crash;
//! - map arguments (r1 of map helpers) must be maps registered with
//!   [`maps::register_map`] (the loader registers every map it creates); anything else is
//!   refused (`-EINVAL`, or NULL for lookups);
//! - keys and values given to map helpers are passed to the map code as they are when every
//!   program of the process was verified ([`crate::verify`]: the verifier proved them
//!   `key_size`/`value_size` bytes of stack or map memory, as the kernel's does); once a
//!   program is loaded unverified (`USERBPF_VERIFY=0`, `--no-verify`), they are distrusted
//!   for the rest of the process ([`maps::distrust_pointers`]): copied through the guard
//!   (or, when larger than a stack buffer, every page probed first), a bad address giving
//!   `-EFAULT` (NULL for lookups), and the JIT's direct calls of hash map operations are
//!   not made (the helpers are called instead).

#![deny(unsafe_op_in_unsafe_fn)]

use std::sync::{Arc, OnceLock};

use userbpf_vm::guard;
use userbpf_vm::{Helper, HelperFn, HelperRegistry};

/// A new private anonymous mapping of `len` bytes (zero-filled, no swap reserved: untouched
/// pages cost nothing), never shared with another process; `None` when the kernel refuses.
pub(crate) fn anonymous_memory(len: usize) -> Option<*mut u8> {
    // SAFETY: a new private anonymous mapping; nothing else is affected.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    (p != libc::MAP_FAILED).then_some(p as *mut u8)
}

pub mod cgroup;
pub mod current_task;
pub mod func;
pub mod io_uring;
pub mod maps;
pub mod output;
// `override` is a reserved word.
#[path = "override.rs"]
pub mod overrides;
pub mod printf;
pub mod probe;
pub mod stack;
pub mod string;
pub mod task;
pub mod time;

pub use maps::{register_map, registry_contains};
pub use printf::{has_trace_sink, set_trace_sink, trace_lines_dropped};

/// Builds a [`Helper`]. Every helper of this module is constructed here, so a new field of
/// `Helper` is filled in one place.
pub(crate) const fn helper(id: u32, name: &'static str, func: HelperFn) -> Helper {
    Helper { id, name, func, may_exit: false }
}

/// Registers every helper of this module.
pub fn register_all(reg: &mut HelperRegistry) {
    maps::register(reg);
    time::register(reg);
    task::register(reg);
    probe::register(reg);
    printf::register(reg);
    output::register(reg);
    overrides::register(reg);
    stack::register(reg);
    func::register(reg);
    string::register(reg);
    cgroup::register(reg);
    io_uring::register(reg);
    crate::control::register(reg);
}

/// A registry holding every helper of this module (built once, shared).
pub fn registry() -> Arc<HelperRegistry> {
    static REG: OnceLock<Arc<HelperRegistry>> = OnceLock::new();
    REG.get_or_init(|| {
        let mut reg = HelperRegistry::new();
        register_all(&mut reg);
        // Installing the fault handler and fork hooks now keeps their one-time system calls
        // off the first probe hit.
        guard::install();
        task::init();
        time::init();
        Arc::new(reg)
    })
    .clone()
}

// ---- shared by the families ----

/// `-errno` as a helper returns it.
#[inline(always)]
pub(crate) const fn neg(errno: i32) -> u64 {
    (-(errno as i64)) as u64
}

pub(crate) const EFAULT: u64 = neg(libc::EFAULT);
pub(crate) const EINVAL: u64 = neg(libc::EINVAL);

/// The highest user address plus one on x86-64 with 4-level page tables (the kernel's
/// `TASK_SIZE_MAX`).
pub(crate) const TASK_SIZE_MAX: u64 = (1 << 47) - 4096;

/// Copies `dst.len()` bytes from the program-supplied address `src`; false if any of it
/// faults.
#[inline]
pub(crate) fn read_from(dst: &mut [u8], src: u64) -> bool {
    if dst.is_empty() {
        return true;
    }
    // SAFETY: `dst` is a buffer we own; the guard tolerates any `src`.
    unsafe { guard::copy(dst.as_mut_ptr(), src as *const u8, dst.len() as u64) == 0 }
}

/// Copies `src` to the program-supplied address `dst`; false if any of it faults.
#[inline]
pub(crate) fn write_to(dst: u64, src: &[u8]) -> bool {
    if src.is_empty() {
        return true;
    }
    // SAFETY: the guard tolerates any `dst`; `src` is ours. `dst` is memory the program
    // handed to the helper to be written, as the kernel's verifier would have checked.
    unsafe { guard::copy(dst as *mut u8, src.as_ptr(), src.len() as u64) == 0 }
}

static ZEROS: [u8; 256] = [0; 256];

/// Zeroes `len` bytes at the program-supplied address `dst`; false if any of it faults.
pub(crate) fn zero_at(dst: u64, len: u64) -> bool {
    let mut off = 0u64;
    while off < len {
        let n = (len - off).min(ZEROS.len() as u64);
        if !write_to(dst.wrapping_add(off), &ZEROS[..n as usize]) {
            return false;
        }
        off += n;
    }
    true
}

/// Reads one u64 at a program-supplied address.
#[inline]
pub(crate) fn read_u64(addr: u64) -> Option<u64> {
    let mut b = [0u8; 8];
    read_from(&mut b, addr).then(|| u64::from_ne_bytes(b))
}

/// Whether `[ptr, ptr + len)` can be read: one guarded byte read per page. For data a
/// helper then hands to code that copies it directly (perf and ring buffer output).
pub(crate) fn readable(ptr: u64, len: u64) -> bool {
    if len == 0 {
        return true;
    }
    let Some(last) = ptr.checked_add(len - 1) else { return false };
    let mut b = [0u8; 1];
    let mut p = ptr;
    loop {
        if !read_from(&mut b, p) {
            return false;
        }
        let next_page = (p | 4095).wrapping_add(1);
        if next_page == 0 || next_page > last {
            break;
        }
        p = next_page;
    }
    read_from(&mut b, last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_the_kernel_ids() {
        let reg = registry();
        let mut n = 0;
        for h in reg.iter() {
            assert_eq!(userbpf_isa::helper_names::helper_name(h.id), Some(h.name), "id {}", h.id);
            n += 1;
        }
        assert!(n >= 45, "{n} helpers");
    }

    #[test]
    fn the_verifier_knows_every_helper() {
        for h in registry().iter() {
            assert!(userbpf_verifier::helpers::proto(h.id).is_some(), "no prototype for bpf_{} (id {})", h.name, h.id);
        }
    }

    #[test]
    fn guarded_access() {
        let mut buf = [1u8; 300];
        assert!(zero_at(buf.as_mut_ptr() as u64, 300));
        assert!(buf.iter().all(|&b| b == 0));
        assert!(!zero_at(8, 4));
        assert!(readable(buf.as_ptr() as u64, 300));
        assert!(!readable(16, 1));
        assert!(!readable(u64::MAX, 2));
        assert!(readable(0, 0));
        assert_eq!(read_u64(buf.as_ptr() as u64), Some(0));
        assert_eq!(read_u64(0), None);
    }
}
