//! `bpf(2)` served from the userspace runtime, command by command as the kernel serves them
//! for libbpf 1.x and bpftrace 0.17 (errors are the kernel's errno for the same case).
//!
//! - [`map`]: MAP_CREATE, the element operations, the batch operations, MAP_FREEZE;
//! - [`prog`]: PROG_LOAD (with a verifier-like log), PROG_TEST_RUN, PROG_BIND_MAP;
//! - [`obj`]: BTF_LOAD, OBJ_GET_INFO_BY_FD, the *_GET_FD_BY_ID and *_GET_NEXT_ID commands,
//!   OBJ_PIN and OBJ_GET;
//! - [`kbtf`]: the kernel's own BTF objects (vmlinux, modules), listed and read as on the kernel;
//! - [`link`]: LINK_CREATE, LINK_DETACH, LINK_UPDATE, PROG_ATTACH/PROG_DETACH, RAW_TRACEPOINT_OPEN;
//! - [`passthrough`]: the kernel's program kinds handed to the kernel, the session maps they
//!   use turned into kernel maps, and every command on a kernel object passed on (checked
//!   first, in [`serve`]).
//!
//! The attributes are read as the command's `#[repr(C)]` struct of [`attr`]. A failed command
//! returns an [`Error`]: the errno the loader gets and the reason, which `USERBPF_TRACE_BPF`
//! prints and which PROG_LOAD and BTF_LOAD write into the loader's log, as the kernel's
//! verifier and BTF checker do.
//!
//! Pointers in `union bpf_attr` are addresses in this process (the loader's); they are read
//! and written with `process_vm_readv`/`process_vm_writev` on ourselves, so a bad pointer is
//! `EFAULT` as in the kernel, never a crash.

use std::collections::HashMap;
use std::sync::{Arc, MutexGuard};

use userbpf_maps::Map;

use crate::error::{Context, Error};
use crate::objects;
use crate::sys;

pub mod attr;
mod dead;
pub mod events;
pub mod info;
pub mod kbtf;
pub mod link;
pub mod map;
pub mod obj;
pub mod passthrough;
pub mod prog;
#[cfg(test)]
mod tests;

/// `sizeof(union bpf_attr)` as this library knows it (libbpf 1.1's uapi header, plus the
/// `log_true_size` fields of newer kernels).
pub const ATTR_SIZE: usize = 160;

// Commands (enum bpf_cmd).
pub const BPF_MAP_CREATE: i32 = 0;
pub const BPF_MAP_LOOKUP_ELEM: i32 = 1;
pub const BPF_MAP_UPDATE_ELEM: i32 = 2;
pub const BPF_MAP_DELETE_ELEM: i32 = 3;
pub const BPF_MAP_GET_NEXT_KEY: i32 = 4;
pub const BPF_PROG_LOAD: i32 = 5;
pub const BPF_OBJ_PIN: i32 = 6;
pub const BPF_OBJ_GET: i32 = 7;
pub const BPF_PROG_ATTACH: i32 = 8;
pub const BPF_PROG_DETACH: i32 = 9;
pub const BPF_PROG_TEST_RUN: i32 = 10;
pub const BPF_PROG_GET_NEXT_ID: i32 = 11;
pub const BPF_MAP_GET_NEXT_ID: i32 = 12;
pub const BPF_PROG_GET_FD_BY_ID: i32 = 13;
pub const BPF_MAP_GET_FD_BY_ID: i32 = 14;
pub const BPF_OBJ_GET_INFO_BY_FD: i32 = 15;
pub const BPF_PROG_QUERY: i32 = 16;
pub const BPF_RAW_TRACEPOINT_OPEN: i32 = 17;
pub const BPF_BTF_LOAD: i32 = 18;
pub const BPF_BTF_GET_FD_BY_ID: i32 = 19;
pub const BPF_TASK_FD_QUERY: i32 = 20;
pub const BPF_MAP_LOOKUP_AND_DELETE_ELEM: i32 = 21;
pub const BPF_MAP_FREEZE: i32 = 22;
pub const BPF_BTF_GET_NEXT_ID: i32 = 23;
pub const BPF_MAP_LOOKUP_BATCH: i32 = 24;
pub const BPF_MAP_LOOKUP_AND_DELETE_BATCH: i32 = 25;
pub const BPF_MAP_UPDATE_BATCH: i32 = 26;
pub const BPF_MAP_DELETE_BATCH: i32 = 27;
pub const BPF_LINK_CREATE: i32 = 28;
pub const BPF_LINK_UPDATE: i32 = 29;
pub const BPF_LINK_GET_FD_BY_ID: i32 = 30;
pub const BPF_LINK_GET_NEXT_ID: i32 = 31;
pub const BPF_ENABLE_STATS: i32 = 32;
pub const BPF_ITER_CREATE: i32 = 33;
pub const BPF_LINK_DETACH: i32 = 34;
pub const BPF_PROG_BIND_MAP: i32 = 35;

/// The attribute block of one call: a zero-extended copy of the caller's bytes.
pub struct Attr {
    pub bytes: [u8; ATTR_SIZE],
    /// Where the caller's block is (fields written back go there).
    pub user: u64,
    /// How many bytes the caller passed.
    pub size: usize,
}

impl Attr {
    /// Copies the caller's attribute block: `E2BIG` when it is larger than a page or holds
    /// non-zero bytes past what this library knows (the kernel's `bpf_check_uarg_tail_zero`),
    /// `EFAULT` when it cannot be read.
    pub fn read(user: u64, size: usize) -> Result<Attr, i32> {
        if size > 4096 {
            return Err(libc::E2BIG);
        }
        let mut bytes = [0u8; ATTR_SIZE];
        let n = size.min(ATTR_SIZE);
        if n > 0 {
            read_user(user, &mut bytes[..n])?;
        }
        if size > ATTR_SIZE {
            let mut tail = vec![0u8; size - ATTR_SIZE];
            read_user(user + ATTR_SIZE as u64, &mut tail)?;
            if tail.iter().any(|&b| b != 0) {
                return Err(libc::E2BIG);
            }
        }
        Ok(Attr { bytes, user, size })
    }

    /// The command's attributes, `T`, when every byte past `end` (the end of the command's
    /// last field, [`attr::end_of!`]) is zero; `EINVAL` otherwise, as the kernel's
    /// `CHECK_ATTR`.
    pub fn get<T: attr::Plain>(&self, end: usize) -> Result<T, Error> {
        if !self.zero_from(end) {
            return Err(Error::inval(format!(
                "attribute bytes past offset {end} (the command's last field) are not zero"
            )));
        }
        Ok(self.view())
    }

    /// The attributes as `T`, unchecked.
    pub fn view<T: attr::Plain>(&self) -> T {
        const { assert!(std::mem::size_of::<T>() <= ATTR_SIZE) };
        // SAFETY: `T` is plain data (any bytes are a valid value) no larger than `bytes`
        // (asserted above); read_unaligned copes with the byte array's alignment.
        unsafe { self.bytes.as_ptr().cast::<T>().read_unaligned() }
    }
    /// Whether every byte from `from` to the end of what the caller passed is zero (fields of
    /// other commands' layouts that this command does not use: the kernel's
    /// `CHECK_ATTR`, which answers `EINVAL`).
    pub fn zero_from(&self, from: usize) -> bool {
        self.bytes[from.min(ATTR_SIZE)..self.size.clamp(from.min(ATTR_SIZE), ATTR_SIZE)].iter().all(|&b| b == 0)
    }
    /// Writes a u32 field (at offset `off`, `offset_of!` a field of an [`attr`] struct) back
    /// into the caller's block, if the caller's block holds it.
    pub fn put_u32(&self, off: usize, v: u32) -> Result<(), i32> {
        if off + 4 <= self.size {
            write_user(self.user + off as u64, &v.to_ne_bytes())?;
        }
        Ok(())
    }

    /// As [`Attr::put_u32`], for a u64 field.
    pub fn put_u64(&self, off: usize, v: u64) -> Result<(), i32> {
        if off + 8 <= self.size {
            write_user(self.user + off as u64, &v.to_ne_bytes())?;
        }
        Ok(())
    }
}

fn iov(addr: u64, len: usize) -> libc::iovec {
    libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: len }
}

/// Copies `buf.len()` bytes from address `addr` of this process: `EFAULT` if any is unmapped.
pub(crate) fn read_user(addr: u64, buf: &mut [u8]) -> Result<(), i32> {
    if buf.is_empty() {
        return Ok(());
    }
    if addr == 0 {
        return Err(libc::EFAULT);
    }
    let local = iov(buf.as_mut_ptr() as u64, buf.len());
    let remote = iov(addr, buf.len());
    // SAFETY: process_vm_readv writes at most `buf.len()` bytes into `buf` (the local iovec)
    // and only reads the remote range, reporting unmapped addresses as EFAULT.
    let r = unsafe {
        sys::raw6(
            libc::SYS_process_vm_readv,
            libc::getpid() as i64,
            &local as *const _ as i64,
            1,
            &remote as *const _ as i64,
            1,
            0,
        )
    };
    if r == buf.len() as i64 {
        Ok(())
    } else if r < 0 && r != -(libc::EFAULT as i64) && r != -(libc::ESRCH as i64) {
        // process_vm_readv refused (e.g. by a seccomp policy): copy directly.
        // SAFETY: best effort for a caller-supplied pointer, as the kernel's copy_from_user
        // would read it; reached only where the safe path is unavailable.
        unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, buf.as_mut_ptr(), buf.len()) };
        Ok(())
    } else {
        Err(libc::EFAULT)
    }
}

/// Copies `data` to address `addr` of this process: `EFAULT` if any of it is unmapped or
/// read-only.
pub(crate) fn write_user(addr: u64, data: &[u8]) -> Result<(), i32> {
    if data.is_empty() {
        return Ok(());
    }
    if addr == 0 {
        return Err(libc::EFAULT);
    }
    let local = iov(data.as_ptr() as u64, data.len());
    let remote = iov(addr, data.len());
    // SAFETY: process_vm_writev reads `data` and writes the remote range of this process,
    // reporting unmapped or unwritable addresses as EFAULT.
    let r = unsafe {
        sys::raw6(
            libc::SYS_process_vm_writev,
            libc::getpid() as i64,
            &local as *const _ as i64,
            1,
            &remote as *const _ as i64,
            1,
            0,
        )
    };
    if r == data.len() as i64 {
        Ok(())
    } else if r < 0 && r != -(libc::EFAULT as i64) && r != -(libc::ESRCH as i64) {
        // SAFETY: as in read_user: the caller's own buffer, where the safe path is refused.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), addr as *mut u8, data.len()) };
        Ok(())
    } else {
        Err(libc::EFAULT)
    }
}

/// A NUL-terminated string at `addr`, at most `max` bytes: `EFAULT` when unreadable,
/// `E2BIG`/`ENAMETOOLONG`-like `EINVAL` when not terminated within `max`.
pub(crate) fn read_user_str(addr: u64, max: usize) -> Result<Vec<u8>, i32> {
    let mut out = Vec::new();
    let mut chunk = [0u8; 64];
    let mut a = addr;
    while out.len() < max {
        // Read up to the end of the page, so a string ending right before an unmapped page works.
        let to_page_end = 4096 - (a as usize & 4095);
        let n = chunk.len().min(to_page_end).min(max - out.len());
        read_user(a, &mut chunk[..n])?;
        if let Some(p) = chunk[..n].iter().position(|&b| b == 0) {
            out.extend_from_slice(&chunk[..p]);
            return Ok(out);
        }
        out.extend_from_slice(&chunk[..n]);
        a += n as u64;
    }
    Err(libc::EINVAL)
}

/// What this process knows about a map beyond its file: the handle, and how it was created.
pub struct MapEntry {
    pub map: Arc<Map>,
    pub map_type: u32,
    pub btf_id: u32,
    pub btf_key_type_id: u32,
    pub btf_value_type_id: u32,
    pub map_flags: u32,
    pub map_extra: u64,
    /// Map-in-map: the inner map's template (type, key, value, max entries, flags).
    pub inner: Option<(u32, u32, u32, u32, u32)>,
    pub frozen: std::sync::atomic::AtomicBool,
}

/// The per-process view of the session's objects (handles opened here, load-time
/// details the session records do not keep).
#[derive(Default)]
pub struct State {
    pub maps: HashMap<u32, Arc<MapEntry>>,
    pub progs: HashMap<u32, Arc<prog::ProgEntry>>,
}

/// This process's state.
pub fn state() -> MutexGuard<'static, State> {
    crate::server::server().bpf.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner())
}

/// Serves `bpf(cmd, attr, size)`: the call's return value, or an errno (its reason printed
/// when `USERBPF_TRACE_BPF` is set).
///
/// # Safety
/// `attr` (`size` bytes) and the pointers it holds are the loader's, as for the bpf(2)
/// system call. They are read and written with `process_vm_readv`/`process_vm_writev`,
/// which report a bad address as `EFAULT`; where those calls are refused (a seccomp policy)
/// they are accessed directly, and a bad address is then undefined behaviour.
pub unsafe fn bpf(cmd: i32, attr: *mut u8, size: u32) -> Result<i64, i32> {
    let r = serve(cmd, attr, size);
    if trace_enabled() {
        let what = match &r {
            Ok(v) => format!("{v}"),
            Err(e) => format!("-1 {e}"),
        };
        // The first attribute words (map/prog type, fd, counts) identify most calls.
        let mut w = [0u8; 8];
        let _ = read_user(attr as u64, &mut w[..(size as usize).min(8)]);
        let (w0, w1) =
            (u32::from_ne_bytes(w[..4].try_into().expect("4")), u32::from_ne_bytes(w[4..].try_into().expect("4")));
        eprintln!("userbpf: bpf({}, {{{w0}, {w1}, ...}}, {size}) = {what}", cmd_name(cmd));
    }
    r.map_err(|e| e.errno)
}

/// `USERBPF_TRACE_BPF=1`: each served call (bpf, perf_event_open) and its result, with the
/// reason of a failure, on stderr (like strace would show them for the kernel).
pub fn trace_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("USERBPF_TRACE_BPF").is_some_and(|v| !v.is_empty() && v != "0"))
}

/// The uapi name of a command.
pub fn cmd_name(cmd: i32) -> String {
    const NAMES: [&str; 36] = [
        "MAP_CREATE",
        "MAP_LOOKUP_ELEM",
        "MAP_UPDATE_ELEM",
        "MAP_DELETE_ELEM",
        "MAP_GET_NEXT_KEY",
        "PROG_LOAD",
        "OBJ_PIN",
        "OBJ_GET",
        "PROG_ATTACH",
        "PROG_DETACH",
        "PROG_TEST_RUN",
        "PROG_GET_NEXT_ID",
        "MAP_GET_NEXT_ID",
        "PROG_GET_FD_BY_ID",
        "MAP_GET_FD_BY_ID",
        "OBJ_GET_INFO_BY_FD",
        "PROG_QUERY",
        "RAW_TRACEPOINT_OPEN",
        "BTF_LOAD",
        "BTF_GET_FD_BY_ID",
        "TASK_FD_QUERY",
        "MAP_LOOKUP_AND_DELETE_ELEM",
        "MAP_FREEZE",
        "BTF_GET_NEXT_ID",
        "MAP_LOOKUP_BATCH",
        "MAP_LOOKUP_AND_DELETE_BATCH",
        "MAP_UPDATE_BATCH",
        "MAP_DELETE_BATCH",
        "LINK_CREATE",
        "LINK_UPDATE",
        "LINK_GET_FD_BY_ID",
        "LINK_GET_NEXT_ID",
        "ENABLE_STATS",
        "ITER_CREATE",
        "LINK_DETACH",
        "PROG_BIND_MAP",
    ];
    usize::try_from(cmd).ok().and_then(|i| NAMES.get(i)).map_or_else(|| format!("{cmd}"), |n| format!("BPF_{n}"))
}

/// Serves one command: the call's return value, or the error and why.
pub fn serve(cmd: i32, attr: *mut u8, size: u32) -> Result<i64, Error> {
    let a = Attr::read(attr as u64, size as usize).context(|| format!("attr ({size} bytes at {attr:p})"))?;
    // The kernel's objects and program kinds go to the kernel (passthrough).
    if let Some(r) = passthrough::forward(cmd, &a) {
        return r;
    }
    if cmd == BPF_PROG_LOAD {
        let r = prog::load(&a);
        return match r {
            Err(e) => passthrough::prog_load_refused(&a).ok_or(e),
            // A tracepoint program the kernel refuses fails here too, with the kernel's log
            // (the runtime's program goes again).
            Ok(fd) => match passthrough::kernel_verdict(&a) {
                Ok(()) => Ok(fd),
                Err(e) => {
                    let ours = crate::attach::closing(fd as i32);
                    // SAFETY: closes the descriptor just returned for the program, not yet
                    // handed to the loader.
                    unsafe { crate::sys::raw6(libc::SYS_close, fd, 0, 0, 0, 0, 0) };
                    if let Some((kind, id)) = ours {
                        crate::attach::closed(kind, id);
                    }
                    Err(e)
                }
            },
        };
    }
    match cmd {
        BPF_MAP_CREATE => map::create(&a),
        BPF_MAP_LOOKUP_ELEM => map::lookup(&a),
        BPF_MAP_UPDATE_ELEM => map::update(&a),
        BPF_MAP_DELETE_ELEM => map::delete(&a),
        BPF_MAP_GET_NEXT_KEY => map::get_next_key(&a),
        BPF_MAP_LOOKUP_AND_DELETE_ELEM => map::lookup_and_delete(&a),
        BPF_MAP_FREEZE => map::freeze(&a),
        BPF_MAP_LOOKUP_BATCH => map::batch(&a, map::Batch::Lookup),
        BPF_MAP_LOOKUP_AND_DELETE_BATCH => map::batch(&a, map::Batch::LookupAndDelete),
        BPF_MAP_UPDATE_BATCH => map::batch(&a, map::Batch::Update),
        BPF_MAP_DELETE_BATCH => map::batch(&a, map::Batch::Delete),
        BPF_PROG_LOAD => prog::load(&a),
        BPF_PROG_TEST_RUN => prog::test_run(&a),
        BPF_PROG_BIND_MAP => prog::bind_map(&a),
        BPF_BTF_LOAD => obj::btf_load(&a),
        BPF_OBJ_GET_INFO_BY_FD => obj::get_info(&a),
        BPF_PROG_GET_NEXT_ID => obj::next_id(&a, objects::Kind::Prog),
        BPF_MAP_GET_NEXT_ID => obj::next_id(&a, objects::Kind::Map),
        BPF_BTF_GET_NEXT_ID => obj::next_id(&a, objects::Kind::Btf),
        BPF_LINK_GET_NEXT_ID => obj::next_id(&a, objects::Kind::Link),
        BPF_PROG_GET_FD_BY_ID => obj::fd_by_id(&a, objects::Kind::Prog),
        BPF_MAP_GET_FD_BY_ID => obj::fd_by_id(&a, objects::Kind::Map),
        BPF_BTF_GET_FD_BY_ID => obj::fd_by_id(&a, objects::Kind::Btf),
        BPF_LINK_GET_FD_BY_ID => obj::fd_by_id(&a, objects::Kind::Link),
        BPF_OBJ_PIN => obj::pin(&a),
        BPF_OBJ_GET => obj::obj_get(&a),
        BPF_LINK_CREATE => link::create(&a),
        BPF_LINK_DETACH => link::detach(&a),
        BPF_LINK_UPDATE => link::update(&a),
        BPF_PROG_ATTACH | BPF_PROG_DETACH => link::prog_attach(&a, cmd),
        BPF_RAW_TRACEPOINT_OPEN => link::raw_tracepoint_open(&a),
        BPF_PROG_QUERY => link::prog_query(&a),
        BPF_TASK_FD_QUERY => link::task_fd_query(&a),
        BPF_ENABLE_STATS => obj::enable_stats(&a),
        // Iterators walk kernel objects: a kernel without the iterator targets (there are no
        // iterator links here) answers EINVAL for a descriptor that is not an iterator link.
        BPF_ITER_CREATE => {
            let fd = a.view::<attr::IterCreate>().link_fd;
            objects::get_kind(fd, objects::Kind::Link).context(|| format!("link_fd {fd}"))?;
            Err(Error::inval("no iterator links here"))
        }
        _ => Err(Error::inval(format!("unknown command {cmd}"))),
    }
}

/// Maps an `io::Error` from the session to an errno.
pub fn io_errno(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}
