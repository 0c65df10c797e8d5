//! Kernel passthrough: the program kinds only the kernel runs are handed to it with real
//! `bpf()` calls, so loaders whose tools need the kernel (libbpf-tools' biolatency, runqlat,
//! a tool mixing a uprobe and a tracepoint) run unchanged under `userbpf load`.
//!
//! **Which programs.** A PROG_LOAD of a type the runtime does not run (tp_btf/fentry
//! `TRACING`, `LSM`, `EXT`, networking types, ...) goes to the kernel as the loader gave it,
//! with the descriptors inside translated (below); the loader gets the kernel's descriptor,
//! the kernel's verifier log and errno. Tracepoint and raw tracepoint programs are loaded as
//! user-space programs (system call tracepoints run in the processes), and loaded into the
//! kernel when they are attached where only the kernel has the event: a `perf_event_open` of
//! a tracepoint other than a system call's (every tracepoint with `--syscalls kernel`, that
//! is `USERBPF_SYSCALLS=kernel`) opens the kernel's event, and attaching a program of ours to
//! a kernel event (LINK_CREATE, `PERF_EVENT_IOC_SET_BPF`) or RAW_TRACEPOINT_OPEN of a name
//! other than `sys_enter`/`sys_exit` loads the program into the kernel then. The kernel verifies
//! every tracepoint and raw tracepoint program at its PROG_LOAD already ([`kernel_verdict`]: a
//! trial load with temporary copies of its maps), so its refusal, with its log, is the
//! PROG_LOAD's answer, as without userbpf. Kprobe programs attached to a kernel's kprobe event
//! (kernels with kprobes; this library's uprobe events stay its own) go the same way. A
//! tracepoint or raw tracepoint program the runtime
//! refuses (a helper it lacks) but the kernel accepts is the kernel's from its load.
//!
//! **Maps** (loaders create maps before the programs that use them). A session map becomes a
//! kernel map when the first kernel program references it: the kernel creates one with the
//! same attributes (arrays `BPF_F_MMAPABLE`), its BTF loaded into the kernel too, the current
//! contents copied and a frozen map frozen; every descriptor of the loader that referred to the
//! session map is replaced (`dup3`) by the kernel map's, so from then on the loader's element
//! operations, `mmap`, `poll` and `epoll` on it are the kernel's own. An array's session map
//! gets the kernel's values mapped over its own (`userbpf_runtime::kernel_map`), so user-space
//! programs (in targets' agents) share it without a system call; a hash, LRU hash or per-CPU
//! map is reached by them through `bpf()` (`userbpf_maps::kernel`), which needs
//! the processes to open it as the kernel's from the start: one that user-space programs
//! attached before the first kernel program used it is refused, as is a kind that cannot be
//! shared (ring and perf buffers, queues, LPM tries, maps of maps). The loader holds the kernel maps and
//! serves their descriptors to the session's processes (`kernel_map::provide`), so processes
//! without CAP_SYS_ADMIN open them too. Once a perf event
//! array is the kernel's, `PERF_COUNT_SW_BPF_OUTPUT` events are opened in the kernel, so perf
//! buffers written by kernel programs are read as on the kernel; ring buffers are maps and
//! need nothing more.
//!
//! **Selecting programs** (`userbpf load --not-load GLOB`, `--side GLOB=kernel|process`; the
//! environment's `USERBPF_NOT_LOAD_PATTERN` and `USERBPF_SIDES`), by the name the loader gives
//! at PROG_LOAD (libbpf: the function's name, cut to 15 characters). A program left out is
//! loaded as an empty program (`r0 = 0; exit`, without its BTF function and line records), so
//! the loader carries on and its attachments succeed, but it does nothing. A tracepoint or raw
//! tracepoint program forced to the kernel is loaded there at PROG_LOAD (its verifier's log
//! in the loader's buffer); attached to a system call tracepoint event this library serves,
//! it is attached to the kernel's event instead (every process's calls, as in the kernel). A
//! program of a kind only the kernel runs cannot be forced to the processes (`EINVAL`, saying
//! so), nor can a tracepoint program attached to an event only the kernel has.
//!
//! **Descriptors.** The loader's descriptors of kernel objects are the kernel's: every
//! command whose object descriptor is not one of ours but a kernel BPF object or perf event
//! is passed to the kernel unchanged.

use std::collections::HashMap;
use std::mem::offset_of;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Mutex, MutexGuard};

use userbpf_isa::*;
use userbpf_maps::MapType;

use super::attr;
use super::map::map_by_id;
use super::prog::{BPF_PROG_TYPE_RAW_TRACEPOINT, BPF_PROG_TYPE_TRACEPOINT, ProgEntry, prog_type_name};
use super::{Attr, read_user, read_user_str};
use crate::error::{Context, Error};
use crate::objects::{self, Kind};
use crate::sys;

/// `USERBPF_SYSCALLS=kernel`: system call tracepoints run in the kernel.
pub const SYSCALLS_ENV: &str = "USERBPF_SYSCALLS";
/// `USERBPF_NOT_LOAD_PATTERN=GLOB[,GLOB...]` (`userbpf load --not-load`): programs left out.
pub const NOT_LOAD_ENV: &str = "USERBPF_NOT_LOAD_PATTERN";
/// `USERBPF_SIDES=GLOB=kernel|process[,...]` (`userbpf load --side`): a program's side forced.
pub const SIDES_ENV: &str = "USERBPF_SIDES";

const BPF_F_MMAPABLE: u32 = 1 << 10;
const PERF_EVENT_IOC_SET_BPF: libc::c_ulong = 0x4004_2408;

#[derive(Default)]
struct State {
    /// Session BTF id → the kernel's copy.
    btfs: HashMap<u32, OwnedFd>,
    /// Session map id → the kernel map (a descriptor of ours) and its kernel id.
    maps: HashMap<u32, (OwnedFd, u32)>,
    /// Kernel map id → session map id.
    by_kernel_id: HashMap<u32, u32>,
    /// Session program id → its kernel copy.
    progs: HashMap<u32, OwnedFd>,
    /// A perf event array is the kernel's: BPF output events are opened in the kernel.
    kernel_outputs: bool,
    /// The program of ours being loaded into the kernel (not a user-space user of its maps).
    loading: Option<u32>,
}

fn state() -> MutexGuard<'static, State> {
    static S: std::sync::LazyLock<Mutex<State>> = std::sync::LazyLock::new(Default::default);
    S.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether system call tracepoints run in the kernel (`USERBPF_SYSCALLS=kernel`).
pub fn syscalls_in_kernel() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var(SYSCALLS_ENV).is_ok_and(|v| v == "kernel"))
}

/// The programs `--not-load` leaves out and the sides `--side` forces (see the module docs).
struct Selection {
    not_load: Vec<String>,
    /// (glob, to the kernel), the last match wins.
    sides: Vec<(String, bool)>,
}

fn selection() -> &'static Selection {
    static SEL: std::sync::OnceLock<Selection> = std::sync::OnceLock::new();
    SEL.get_or_init(|| {
        let list = |v: &str| -> Vec<String> {
            std::env::var(v).unwrap_or_default().split(',').filter(|p| !p.is_empty()).map(str::to_string).collect()
        };
        let sides = list(SIDES_ENV)
            .into_iter()
            .filter_map(|s| {
                let (p, side) = s.rsplit_once('=')?;
                Some((p.to_string(), side == "kernel"))
            })
            .collect();
        Selection { not_load: list(NOT_LOAD_ENV), sides }
    })
}

fn glob(pattern: &str, name: &str) -> bool {
    let (Ok(p), Ok(n)) = (std::ffi::CString::new(pattern), std::ffi::CString::new(name)) else { return false };
    // SAFETY: both are NUL-terminated strings; fnmatch only reads them.
    unsafe { libc::fnmatch(p.as_ptr(), n.as_ptr(), 0) == 0 }
}

/// The side `--side` forces on program `name` (`Some(true)`: the kernel).
fn forced_side(name: &str) -> Option<bool> {
    selection().sides.iter().rev().find(|(p, _)| glob(p, name)).map(|(_, k)| *k)
}

fn prog_name_of(at: &attr::ProgLoad) -> String {
    let end = at.prog_name.iter().position(|&b| b == 0).unwrap_or(16);
    String::from_utf8_lossy(&at.prog_name[..end]).into_owned()
}

/// PROG_LOAD of a program `--not-load` leaves out: the same load with an empty program.
fn load_empty(a: &Attr) -> Result<i64, Error> {
    static EMPTY: [u64; 2] = [0x0000_0000_0000_00b7, 0x0000_0000_0000_0095]; // r0 = 0; exit
    let mut at: attr::ProgLoad = a.view();
    at.insns = EMPTY.as_ptr() as u64;
    at.insn_cnt = 2;
    at.func_info = 0;
    at.func_info_cnt = 0;
    at.func_info_rec_size = 0;
    at.line_info = 0;
    at.line_info_cnt = 0;
    at.line_info_rec_size = 0;
    at.core_relo_cnt = 0;
    at.core_relos = 0;
    at.core_relo_rec_size = 0;
    let mut b = Attr { bytes: a.bytes, user: a.user, size: a.size };
    let len = std::mem::size_of::<attr::ProgLoad>().min(super::ATTR_SIZE);
    // SAFETY: ProgLoad is plain data of `len` bytes.
    let src = unsafe { std::slice::from_raw_parts((&raw const at).cast::<u8>(), len) };
    b.bytes[..len].copy_from_slice(src);
    if is_kernel_type(at.prog_type) {
        // Built from `b.bytes` (the caller's block only gets log_true_size back).
        prog_load(&b)
    } else {
        super::prog::load(&b)
    }
}

/// Whether BPF output perf events go to the kernel (a kernel perf event array exists).
pub fn kernel_outputs() -> bool {
    state().kernel_outputs
}

fn raw_bpf(cmd: i32, attr: *mut u8, size: usize) -> Result<i64, Error> {
    // SAFETY: `attr` points to `size` readable and writable bytes laid out as the command's
    // part of `union bpf_attr` (the loader's, or one built here); the kernel validates the
    // pointers inside and reports bad ones as EFAULT.
    let r = unsafe { sys::raw6(libc::SYS_bpf, cmd as i64, attr as i64, size as i64, 0, 0, 0) };
    if r < 0 { Err(Error::new(-r as i32, "the kernel's answer")) } else { Ok(r) }
}

fn bpf_on<T>(cmd: i32, a: &mut T) -> Result<i64, Error> {
    raw_bpf(cmd, (a as *mut T).cast(), std::mem::size_of::<T>())
}

fn owned(fd: i64) -> OwnedFd {
    // SAFETY: a descriptor the kernel just returned, owned by nobody else.
    unsafe { OwnedFd::from_raw_fd(fd as i32) }
}

/// What kind of kernel object `fd` is (`bpf-map`, `bpf-prog`, `bpf_link`, `[perf_event]`,
/// ...), when it is a kernel BPF object or perf event and not one of ours.
pub fn kernel_kind(fd: i32) -> Option<String> {
    if fd < 0 || objects::get(fd).is_some() {
        return None;
    }
    let l = std::fs::read_link(format!("/proc/self/fd/{fd}")).ok()?;
    let l = l.to_string_lossy();
    let k = l.strip_prefix("anon_inode:")?;
    (k.starts_with("bpf") || k == "[perf_event]").then(|| k.to_string())
}

/// The kernel id of kernel map `fd`.
fn kernel_map_id(fd: i32) -> Option<u32> {
    #[repr(C)]
    #[derive(Default)]
    struct Info {
        map_type: u32,
        id: u32,
        rest: [u32; 20],
    }
    let mut info = Info::default();
    let mut at =
        attr::InfoByFd { bpf_fd: fd, info_len: std::mem::size_of::<Info>() as u32, info: (&raw mut info) as u64 };
    bpf_on(super::BPF_OBJ_GET_INFO_BY_FD, &mut at).ok()?;
    Some(info.id)
}

/// The session map a converted kernel map descriptor stands for (so that programs of ours
/// loaded later still reach the session's map, which processes open as the kernel's): kinds
/// that can be shared (`userbpf_runtime::kernel_map::shareable`); another kind's session copy
/// no longer holds the map's contents, so a user-space program cannot use it (the loader gets
/// `EBADF` for it, as for a descriptor that is no map of ours).
pub fn session_map_of(fd: i32) -> Option<u32> {
    if kernel_kind(fd).as_deref() != Some("bpf-map") {
        return None;
    }
    let kid = kernel_map_id(fd)?;
    let id = state().by_kernel_id.get(&kid).copied()?;
    objects::session().ok()?.kernel_backing(id).is_some().then_some(id)
}

/// The kernel's copy of session BTF `id` (0: none).
fn kernel_btf(st: &mut State, id: u32) -> Result<i32, Error> {
    if id == 0 {
        return Ok(0);
    }
    if let Some(fd) = st.btfs.get(&id) {
        return Ok(fd.as_raw_fd());
    }
    let session = objects::session()?;
    let data = session.btf(id).map_err(|e| Error::new(super::io_errno(&e), format!("session BTF {id}: {e}")))?;
    let mut at = attr::BtfLoad { btf: data.as_ptr() as u64, btf_size: data.len() as u32, ..Default::default() };
    let fd = bpf_on(super::BPF_BTF_LOAD, &mut at).context(|| format!("loading BTF {id} into the kernel"))?;
    let fd = owned(fd);
    let raw = fd.as_raw_fd();
    st.btfs.insert(id, fd);
    Ok(raw)
}

/// Makes session map `id` a kernel map (see the module docs); its kernel descriptor (ours).
fn kernel_map(st: &mut State, id: u32) -> Result<i32, Error> {
    if let Some((fd, _)) = st.maps.get(&id) {
        return Ok(fd.as_raw_fd());
    }
    let e = map_by_id(id).map_err(|e| Error::new(e, format!("map {id}")))?;
    let spec = e.map.spec().clone();
    let array = spec.map_type == MapType::BPF_MAP_TYPE_ARRAY;
    // Used by a user-space program too: it must be a kind the processes can share.
    let kernel_progs: Vec<u32> = st.progs.keys().copied().chain(st.loading).collect();
    if let Some(p) = user_programs_of(id, &kernel_progs, false) {
        if let Err(why) = userbpf_runtime::kernel_map::shareable(spec.map_type as u32) {
            return Err(Error::new(
                libc::EOPNOTSUPP,
                format!(
                    "map {} ({}) is used by user-space program `{p}` and by a kernel program, and cannot be shared: {why}",
                    spec.name,
                    spec.map_type.name()
                ),
            ));
        }
        // Processes running the program already opened the session's copy.
        if !array && let Some(p) = user_programs_of(id, &kernel_progs, true) {
            return Err(Error::new(
                libc::EOPNOTSUPP,
                format!(
                    "map {} ({}) is used by user-space program `{p}`, attached before a kernel program used the map: attach the kernel programs first (a {} is shared through bpf(), which processes must know from the start)",
                    spec.name,
                    spec.map_type.name(),
                    spec.map_type.name()
                ),
            ));
        }
    }
    if e.inner.is_some() {
        return Err(Error::new(
            libc::EOPNOTSUPP,
            format!("map {}: maps of maps are not passed to the kernel", spec.name),
        ));
    }
    let kfd = create_like(st, &e)?;
    let kid = kernel_map_id(kfd.as_raw_fd()).ok_or_else(|| Error::new(libc::EIO, "the kernel map's id"))?;
    if userbpf_runtime::kernel_map::shareable(spec.map_type as u32).is_ok() {
        let session = objects::session()?;
        session
            .set_kernel_backing(id, &e.map, kid, kfd.as_fd())
            .map_err(|err| Error::new(libc::EIO, format!("sharing map {} with the kernel: {err}", spec.name)))?;
    }
    if spec.map_type == MapType::BPF_MAP_TYPE_PERF_EVENT_ARRAY {
        st.kernel_outputs = true;
    }
    // Every descriptor of the loader that names the session map (its file, or for a ring
    // buffer its poll FIFO) now names the kernel's.
    let session = objects::session()?;
    let paths: Vec<std::path::PathBuf> = [session.map_path(id), session.layout().map_poll(id)]
        .iter()
        .filter_map(|p| std::fs::canonicalize(p).ok())
        .collect();
    let own = e.map.shm().fd().as_raw_fd();
    for path in &paths {
        for fd in loader_fds_of(path).into_iter().filter(|&fd| fd != own) {
            // SAFETY: dup3 only changes descriptor `fd` of this process, which referred to
            // the session map's file: it now refers to the kernel map instead.
            unsafe { sys::raw6(libc::SYS_dup3, kfd.as_raw_fd() as i64, fd as i64, libc::O_CLOEXEC as i64, 0, 0, 0) };
        }
    }
    let raw = kfd.as_raw_fd();
    st.by_kernel_id.insert(kid, id);
    st.maps.insert(id, (kfd, kid));
    Ok(raw)
}

/// A kernel map with the attributes of session map `e` (arrays `BPF_F_MMAPABLE`), holding its
/// contents (a frozen map frozen).
fn create_like(st: &mut State, e: &super::MapEntry) -> Result<OwnedFd, Error> {
    let spec = e.map.spec().clone();
    let array = spec.map_type == MapType::BPF_MAP_TYPE_ARRAY;
    let btf_fd = kernel_btf(st, e.btf_id)?;
    let mut name = [0u8; 16];
    for (d, s) in name.iter_mut().zip(spec.name.bytes().take(15)) {
        *d = s;
    }
    let mut at = attr::MapCreate {
        map_type: spec.map_type as u32,
        key_size: spec.key_size,
        value_size: spec.value_size,
        max_entries: spec.max_entries,
        map_flags: e.map_flags | if array { BPF_F_MMAPABLE } else { 0 },
        map_name: name,
        btf_fd,
        btf_key_type_id: if btf_fd != 0 { e.btf_key_type_id } else { 0 },
        btf_value_type_id: if btf_fd != 0 { e.btf_value_type_id } else { 0 },
        map_extra: e.map_extra,
        ..Default::default()
    };
    let kfd =
        owned(bpf_on(super::BPF_MAP_CREATE, &mut at).context(|| format!("creating map {} in the kernel", spec.name))?);
    // The contents so far (initial values, a frozen .rodata).
    if iterable(spec.map_type) {
        let ks = spec.key_size as usize;
        let mut value = vec![0u8; e.map.value_buf_size()];
        let mut key: Option<Vec<u8>> = None;
        loop {
            let mut next = vec![0u8; ks];
            if e.map.get_next_key(key.as_deref(), &mut next).is_err() {
                break;
            }
            if e.map.lookup_elem(&next, &mut value).is_ok() {
                let mut el = attr::MapElem {
                    map_fd: kfd.as_raw_fd(),
                    key: next.as_ptr() as u64,
                    value: value.as_ptr() as u64,
                    flags: 0,
                };
                bpf_on(super::BPF_MAP_UPDATE_ELEM, &mut el)
                    .context(|| format!("copying map {} into the kernel", spec.name))?;
            }
            key = Some(next);
        }
    }
    if e.frozen.load(std::sync::atomic::Ordering::Acquire) {
        // Only `map_fd`, as libbpf passes it.
        let mut fd = kfd.as_raw_fd();
        raw_bpf(super::BPF_MAP_FREEZE, (&raw mut fd).cast(), 4)
            .context(|| format!("freezing map {} in the kernel", spec.name))?;
    }
    Ok(kfd)
}

/// Map types whose elements `get_next_key`/`lookup` reach (copied into the kernel's map).
fn iterable(t: MapType) -> bool {
    !matches!(
        t,
        MapType::BPF_MAP_TYPE_RINGBUF
            | MapType::BPF_MAP_TYPE_PERF_EVENT_ARRAY
            | MapType::BPF_MAP_TYPE_QUEUE
            | MapType::BPF_MAP_TYPE_STACK
            | MapType::BPF_MAP_TYPE_BLOOM_FILTER
            | MapType::BPF_MAP_TYPE_PROG_ARRAY
            | MapType::BPF_MAP_TYPE_STACK_TRACE
            | MapType::BPF_MAP_TYPE_CGROUP_ARRAY
    )
}

/// The loader's descriptors open on `path`: those `objects::install` handed out (opened
/// `O_NOATIME`), not the ones this library holds itself (its maps' own mappings, the ring
/// buffers' wakers).
fn loader_fds_of(path: &std::path::Path) -> Vec<i32> {
    let Ok(rd) = std::fs::read_dir("/proc/self/fd") else { return Vec::new() };
    rd.flatten()
        .filter_map(|e| {
            let fd: i32 = e.file_name().to_str()?.parse().ok()?;
            if std::fs::read_link(e.path()).ok()?.as_path() != path {
                return None;
            }
            // SAFETY: F_GETFL has no memory arguments.
            let flags = unsafe { sys::raw6(libc::SYS_fcntl, fd as i64, libc::F_GETFL as i64, 0, 0, 0, 0) };
            (flags >= 0 && flags & libc::O_NOATIME as i64 != 0).then_some(fd)
        })
        .collect()
}

/// A user-space program that uses map `id`: a uprobe/USDT program (type kprobe, not one of
/// `kernel_progs`, the programs of ours in the kernel), or one attached in the processes (a
/// link in the session). Tracepoint programs not attached yet may still go to the kernel:
/// they do not count. `linked_only`: only programs attached in the processes.
fn user_programs_of(id: u32, kernel_progs: &[u32], linked_only: bool) -> Option<String> {
    let session = objects::session().ok()?;
    let linked: Vec<u32> = session.links().ok()?.into_iter().map(|l| l.prog_id).collect();
    session
        .progs()
        .ok()?
        .into_iter()
        .find(|r| {
            r.map_ids.contains(&id)
                && !kernel_progs.contains(&r.id)
                && (!linked_only && r.prog_type == "kprobe" || linked.contains(&r.id))
        })
        .map(|r| r.name)
}

/// The instructions with session map references (`BPF_PSEUDO_MAP_IDX[_VALUE]`, imm = id)
/// or the loader's descriptors (`BPF_PSEUDO_MAP_FD`/`_VALUE`) turned into kernel map
/// descriptors.
fn kernel_insns(
    st: &mut State,
    insns: &[Insn],
    by_id: bool,
    mut trial: Option<&mut Vec<OwnedFd>>,
) -> Result<Vec<Insn>, Error> {
    // userbpf's own helpers (io_uring) exist only in user space: name the one the kernel
    // would call `unknown#ID`.
    userbpf_runtime::loader::check_kernel_helpers(insns).map_err(Error::inval)?;
    let mut out = insns.to_vec();
    // A trial's temporary copy of each map, made once however many instructions use it (the
    // kernel counts the distinct maps of a program, at most 64).
    let mut copies: HashMap<u32, i32> = HashMap::new();
    let mut i = 0;
    while i < out.len() {
        if out[i].is_lddw() {
            let src = out[i].src;
            let id = match src {
                BPF_PSEUDO_MAP_IDX | BPF_PSEUDO_MAP_IDX_VALUE if by_id => Some(out[i].imm as u32),
                BPF_PSEUDO_MAP_FD | BPF_PSEUDO_MAP_VALUE if !by_id => {
                    let fd = out[i].imm;
                    match objects::get_kind(fd, Kind::Map) {
                        Ok(o) => Some(o.id),
                        // Already the kernel's: as it is.
                        Err(_) if kernel_kind(fd).as_deref() == Some("bpf-map") => None,
                        Err(_) => return Err(Error::new(libc::EBADF, format!("instruction {i}: map fd {fd}"))),
                    }
                }
                _ => None,
            };
            if let Some(id) = id {
                out[i].imm = match trial.as_deref_mut() {
                    // A trial load: the kernel map if there is one already, else a temporary
                    // copy (the session map stays ours).
                    Some(temps) => match (st.maps.get(&id), copies.get(&id)) {
                        (Some((fd, _)), _) => fd.as_raw_fd(),
                        (None, Some(&raw)) => raw,
                        (None, None) => {
                            let e = map_by_id(id).map_err(|e| Error::new(e, format!("instruction {i}: map {id}")))?;
                            let fd = create_like(st, &e).context(|| format!("instruction {i}"))?;
                            let raw = fd.as_raw_fd();
                            temps.push(fd);
                            copies.insert(id, raw);
                            raw
                        }
                    },
                    None => kernel_map(st, id).context(|| format!("instruction {i}"))?,
                };
                out[i].src = if matches!(src, BPF_PSEUDO_MAP_IDX | BPF_PSEUDO_MAP_FD) {
                    BPF_PSEUDO_MAP_FD
                } else {
                    BPF_PSEUDO_MAP_VALUE
                };
            }
            i += 2;
            continue;
        }
        i += 1;
    }
    Ok(out)
}

/// Whether a PROG_LOAD goes to the kernel from the start: a type the runtime does not run.
/// (The kernel's types end at `BPF_PROG_TYPE_NETFILTER`, 32; others are refused here.)
pub fn is_kernel_type(prog_type: u32) -> bool {
    prog_type_name(prog_type).is_none() && (1..=32).contains(&prog_type)
}

/// PROG_LOAD of a kernel program type: the kernel's answer (descriptor, log, errno).
pub fn prog_load(a: &Attr) -> Result<i64, Error> {
    prog_load_in(a, None)
}

/// [`prog_load`]; `trial`: with temporary kernel copies of the session maps it uses (kept in
/// `trial` for the caller to close), leaving the session maps ours.
fn prog_load_in(a: &Attr, trial: Option<&mut Vec<OwnedFd>>) -> Result<i64, Error> {
    let mut at: attr::ProgLoad = a.view();
    let n = at.insn_cnt as usize;
    if n == 0 || n > 1_000_000 {
        return raw_bpf(super::BPF_PROG_LOAD, a.user as *mut u8, a.size);
    }
    let mut bytes = vec![0u8; n * 8];
    read_user(at.insns, &mut bytes).context(|| "insns")?;
    let insns = decode(&bytes).map_err(|e| Error::inval(format!("insns: {e}")))?;
    let mut st = state();
    // A trial that cannot copy what the program uses cannot judge it (EOPNOTSUPP).
    let is_trial = trial.is_some();
    let unjudged = |e: Error| if is_trial { Error::new(libc::EOPNOTSUPP, e.to_string()) } else { e };
    let insns = kernel_insns(&mut st, &insns, false, trial).map_err(unjudged)?;
    let bytes = encode(&insns);
    at.insns = bytes.as_ptr() as u64;
    if let Some(o) = objects::get(at.prog_btf_fd).filter(|o| o.kind == Kind::Btf) {
        at.prog_btf_fd = kernel_btf(&mut st, o.id).map_err(unjudged)?;
    }
    if at.attach_prog_fd != 0 && objects::get(at.attach_prog_fd as i32).is_some_and(|o| o.kind == Kind::Btf) {
        // The kernel's own BTF served by us: vmlinux is 0 for the kernel.
        at.attach_prog_fd = kernel_btf_fd_of_served(at.attach_prog_fd as i32)?;
    }
    drop(st);
    let mut buf = [0u8; super::ATTR_SIZE];
    let len = std::mem::size_of::<attr::ProgLoad>().min(a.size).min(super::ATTR_SIZE);
    // SAFETY: ProgLoad is plain data of at least `len` bytes.
    let src = unsafe { std::slice::from_raw_parts((&raw const at).cast::<u8>(), len) };
    buf[..len].copy_from_slice(src);
    let r = raw_bpf(super::BPF_PROG_LOAD, buf.as_mut_ptr(), a.size.min(super::ATTR_SIZE));
    // log_true_size, as the kernel wrote it.
    let off = offset_of!(attr::ProgLoad, log_true_size);
    let _ = a.put_u32(off, u32::from_ne_bytes(buf[off..off + 4].try_into().expect("4 bytes")));
    r
}

/// The kernel's descriptor for one of its BTF objects we serve (vmlinux: 0).
fn kernel_btf_fd_of_served(fd: i32) -> Result<u32, Error> {
    let o = objects::get_kind(fd, Kind::Btf).map_err(|e| Error::new(e, format!("btf fd {fd}")))?;
    let name = o.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    if name == "vmlinux" || !o.path.starts_with(objects::session()?.layout().kernel_btf_dir()) {
        return Ok(0);
    }
    Err(Error::new(libc::EOPNOTSUPP, format!("module BTF {name}: attaching to module functions is not passed on")))
}

/// A program of ours loaded into the kernel (once): its kernel descriptor.
fn kernel_prog(p: &ProgEntry) -> Result<i32, Error> {
    let mut st = state();
    if let Some(fd) = st.progs.get(&p.id) {
        return Ok(fd.as_raw_fd());
    }
    st.loading = Some(p.id);
    let insns = kernel_insns(&mut st, &p.insns, true, None);
    st.loading = None;
    let insns = insns?;
    let bytes = encode(&insns);
    let btf_fd = kernel_btf(&mut st, p.btf_id)?;
    let license: &[u8] = if p.gpl { b"GPL\0" } else { b"Proprietary\0" };
    let mut name = [0u8; 16];
    for (d, s) in name.iter_mut().zip(p.name.bytes().take(15)) {
        *d = s;
    }
    let mut log = vec![0u8; 1 << 20];
    let with_btf = btf_fd != 0;
    let mut at = attr::ProgLoad {
        prog_type: p.prog_type,
        insn_cnt: insns.len() as u32,
        insns: bytes.as_ptr() as u64,
        license: license.as_ptr() as u64,
        expected_attach_type: p.expected_attach_type,
        prog_name: name,
        prog_btf_fd: btf_fd,
        func_info_rec_size: if with_btf && !p.func_info.is_empty() { p.func_info_rec_size } else { 0 },
        func_info: if with_btf && !p.func_info.is_empty() { p.func_info.as_ptr() as u64 } else { 0 },
        func_info_cnt: if with_btf && p.func_info_rec_size != 0 {
            (p.func_info.len() / p.func_info_rec_size as usize) as u32
        } else {
            0
        },
        line_info_rec_size: if with_btf && !p.line_info.is_empty() { p.line_info_rec_size } else { 0 },
        line_info: if with_btf && !p.line_info.is_empty() { p.line_info.as_ptr() as u64 } else { 0 },
        line_info_cnt: if with_btf && p.line_info_rec_size != 0 {
            (p.line_info.len() / p.line_info_rec_size as usize) as u32
        } else {
            0
        },
        ..Default::default()
    };
    let r = bpf_on(super::BPF_PROG_LOAD, &mut at);
    let r = match r {
        Ok(fd) => fd,
        Err(e) => {
            // Again with the verifier's log, for the error.
            at.log_level = 1;
            at.log_buf = log.as_mut_ptr() as u64;
            at.log_size = log.len() as u32;
            let _ = bpf_on(super::BPF_PROG_LOAD, &mut at);
            let end = log.iter().position(|&b| b == 0).unwrap_or(0);
            return Err(Error::new(
                e.errno,
                format!(
                    "program `{}` loaded into the kernel when attached to a kernel event: refused; the kernel verifier's log:\n{}",
                    p.name,
                    String::from_utf8_lossy(&log[..end])
                ),
            ));
        }
    };
    let fd = owned(r);
    let raw = fd.as_raw_fd();
    st.progs.insert(p.id, fd);
    Ok(raw)
}

/// The object descriptors a command names (to tell whether it is the kernel's).
fn command_fds(cmd: i32, a: &Attr) -> Vec<i32> {
    let w = |off: usize| i32::from_ne_bytes(a.bytes[off..off + 4].try_into().expect("4 bytes"));
    match cmd {
        super::BPF_MAP_LOOKUP_ELEM
        | super::BPF_MAP_UPDATE_ELEM
        | super::BPF_MAP_DELETE_ELEM
        | super::BPF_MAP_GET_NEXT_KEY
        | super::BPF_MAP_LOOKUP_AND_DELETE_ELEM
        | super::BPF_MAP_FREEZE
        | super::BPF_OBJ_GET_INFO_BY_FD
        | super::BPF_PROG_TEST_RUN
        | super::BPF_LINK_DETACH
        | super::BPF_LINK_UPDATE
        | super::BPF_ITER_CREATE => vec![w(0)],
        super::BPF_MAP_LOOKUP_BATCH
        | super::BPF_MAP_LOOKUP_AND_DELETE_BATCH
        | super::BPF_MAP_UPDATE_BATCH
        | super::BPF_MAP_DELETE_BATCH => vec![w(36)],
        super::BPF_PROG_BIND_MAP => vec![w(0)],
        super::BPF_LINK_CREATE | super::BPF_RAW_TRACEPOINT_OPEN => Vec::new(),
        _ => Vec::new(),
    }
}

/// A command on the kernel's objects, or attaching one of our programs to a kernel event:
/// served here (`None`: not the kernel's, the runtime serves it).
pub fn forward(cmd: i32, a: &Attr) -> Option<Result<i64, Error>> {
    match cmd {
        super::BPF_LINK_CREATE => {
            let at: attr::LinkCreate = a.view();
            let target = kernel_kind(at.target_fd);
            if kernel_kind(at.prog_fd).is_some() {
                if let Some(o) = objects::get(at.target_fd).filter(|o| o.kind == Kind::PerfEvent) {
                    // A program forced to the kernel on a system call tracepoint we serve: the
                    // kernel's event instead.
                    return Some(kernel_event_of(o.id).and_then(|ev| {
                        let mut k = at;
                        k.target_fd = ev.as_raw_fd();
                        bpf_on(cmd, &mut k)
                    }));
                }
                return Some(raw_bpf(cmd, a.user as *mut u8, a.size));
            }
            if target.as_deref() == Some("[perf_event]") {
                // One of our programs on a kernel event: the program goes to the kernel.
                return Some(with_kernel_prog(at.prog_fd, |kfd| {
                    let mut k = at;
                    k.prog_fd = kfd;
                    bpf_on(cmd, &mut k)
                }));
            }
            None
        }
        super::BPF_RAW_TRACEPOINT_OPEN => {
            let at: attr::RawTracepointOpen = a.view();
            if kernel_kind(at.prog_fd).is_some() {
                return Some(raw_bpf(cmd, a.user as *mut u8, a.size));
            }
            let name = if at.name == 0 { Vec::new() } else { read_user_str(at.name, 128).unwrap_or_default() };
            let served = (name == b"sys_enter" || name == b"sys_exit") && !syscalls_in_kernel();
            if served || at.name == 0 {
                return None;
            }
            let tp = String::from_utf8_lossy(&name).into_owned();
            Some(with_kernel_prog(at.prog_fd, |kfd| {
                let mut k = at;
                k.prog_fd = kfd;
                bpf_on(cmd, &mut k).map_err(|e| {
                    Error::new(
                        e.errno,
                        format!("raw tracepoint {tp:?} in the kernel: {}", std::io::Error::from_raw_os_error(e.errno)),
                    )
                })
            }))
        }
        super::BPF_PROG_LOAD => {
            let at: attr::ProgLoad = a.view();
            let t = at.prog_type;
            let name = prog_name_of(&at);
            if selection().not_load.iter().any(|p| glob(p, &name)) {
                return Some(load_empty(a));
            }
            match forced_side(&name) {
                Some(false) if is_kernel_type(t) => {
                    return Some(Err(Error::inval(format!(
                        "program `{name}` is forced to the processes (--side), but programs of type {t} run only in the kernel"
                    ))));
                }
                Some(true) if t == BPF_PROG_TYPE_TRACEPOINT || t == BPF_PROG_TYPE_RAW_TRACEPOINT => {
                    return Some(prog_load(a));
                }
                _ => {}
            }
            is_kernel_type(t).then(|| prog_load(a))
        }
        _ => {
            let fds = command_fds(cmd, a);
            (!fds.is_empty() && fds.iter().all(|&fd| kernel_kind(fd).is_some()))
                .then(|| raw_bpf(cmd, a.user as *mut u8, a.size))
        }
    }
}

/// The kernel's tracepoint event for our served event `id` (a system call tracepoint): the
/// same tracepoint, process (or every process, on CPU 0 as libbpf opens it).
fn kernel_event_of(id: u32) -> Result<OwnedFd, Error> {
    let Some(crate::perf_event::Spec::Tracepoint { func, pid }) = crate::perf_event::event_spec(id) else {
        return Err(Error::inval(format!("perf event {id}: a kernel program attaches only to tracepoint events here")));
    };
    let tp_id: u64 = ["/sys/kernel/tracing/events", "/sys/kernel/debug/tracing/events"]
        .iter()
        .find_map(|r| std::fs::read_to_string(format!("{r}/{func}/id")).ok()?.trim().parse().ok())
        .ok_or_else(|| Error::new(libc::ENOENT, format!("tracepoint {func}: no id in tracefs")))?;
    // struct perf_event_attr: type, size, config, sample_period, ...
    let mut pattr = [0u64; 16];
    pattr[0] = 2 /* PERF_TYPE_TRACEPOINT */ | (128u64 << 32);
    pattr[1] = tp_id;
    pattr[2] = 1;
    let (p, cpu) = match pid {
        Some(p) => (p as i64, -1i64),
        None => (-1, 0),
    };
    // SAFETY: perf_event_open reads the 128-byte attribute we own.
    let fd = unsafe {
        sys::raw6(
            libc::SYS_perf_event_open,
            pattr.as_mut_ptr() as i64,
            p,
            cpu,
            -1,
            8, /* PERF_FLAG_FD_CLOEXEC */
            0,
        )
    };
    if fd < 0 {
        return Err(Error::new(-fd as i32, format!("opening tracepoint {func} in the kernel")));
    }
    Ok(owned(fd))
}

/// Runs `f` with the kernel copy of our program `prog_fd`.
fn with_kernel_prog(prog_fd: i32, f: impl FnOnce(i32) -> Result<i64, Error>) -> Result<i64, Error> {
    let o = objects::get_kind(prog_fd, Kind::Prog).map_err(|e| Error::new(e, format!("prog_fd {prog_fd}")))?;
    let p = super::prog::prog_by_id(o.id).map_err(|e| Error::new(e, format!("program {}", o.id)))?;
    if !matches!(
        p.prog_type,
        BPF_PROG_TYPE_TRACEPOINT
            | BPF_PROG_TYPE_RAW_TRACEPOINT
            | super::prog::BPF_PROG_TYPE_PERF_EVENT
            | super::prog::BPF_PROG_TYPE_KPROBE
    ) {
        return Err(Error::inval(format!(
            "program `{}` (type {}) cannot attach to a kernel event",
            p.name, p.prog_type
        )));
    }
    if forced_side(&p.name) == Some(false) {
        return Err(Error::inval(format!(
            "program `{}` is forced to the processes (--side), but its event exists only in the kernel",
            p.name
        )));
    }
    let kfd = kernel_prog(&p)?;
    f(kfd)
}

/// PROG_LOAD of a tracepoint or raw tracepoint program (not forced to the processes): the
/// kernel verifies it too, as it would load it without userbpf, so that its refusal comes at
/// PROG_LOAD with the kernel's log in the loader's buffer (the program may go to the kernel
/// only when attached). A trial load, with temporary kernel copies of the session maps it
/// uses; `Err`: the kernel's refusal. Programs calling userbpf's own helpers (which run only
/// in the processes) are not tried.
pub fn kernel_verdict(a: &Attr) -> Result<(), Error> {
    let at: attr::ProgLoad = a.view();
    if at.prog_type != BPF_PROG_TYPE_TRACEPOINT && at.prog_type != BPF_PROG_TYPE_RAW_TRACEPOINT {
        return Ok(());
    }
    if forced_side(&prog_name_of(&at)) == Some(false) {
        return Ok(());
    }
    let n = at.insn_cnt as usize;
    if n == 0 || n > 1_000_000 {
        return Ok(());
    }
    let mut bytes = vec![0u8; n * 8];
    if read_user(at.insns, &mut bytes).is_err() {
        return Ok(());
    }
    let Ok(insns) = decode(&bytes) else { return Ok(()) };
    if userbpf_runtime::loader::check_kernel_helpers(&insns).is_err() {
        return Ok(());
    }
    let mut temps = Vec::new();
    let r = prog_load_in(a, Some(&mut temps));
    drop(temps);
    match r {
        Ok(fd) => {
            drop(owned(fd));
            Ok(())
        }
        // A map the kernel cannot copy (maps of maps, ...): the load decides later.
        Err(e) if e.errno == libc::EOPNOTSUPP => Ok(()),
        Err(e) => Err(e),
    }
}

/// A PROG_LOAD of a tracepoint or raw tracepoint program the runtime refused: the kernel's
/// answer when it accepts the program (it then runs only in the kernel), else `None`.
pub fn prog_load_refused(a: &Attr) -> Option<i64> {
    let t = u32::from_ne_bytes(a.bytes[0..4].try_into().expect("4 bytes"));
    if t != BPF_PROG_TYPE_TRACEPOINT && t != BPF_PROG_TYPE_RAW_TRACEPOINT {
        return None;
    }
    // Without the loader's log (its buffer holds the runtime's refusal).
    let mut quiet = Attr { bytes: a.bytes, user: 0, size: a.size };
    let off = offset_of!(attr::ProgLoad, log_level);
    quiet.bytes[off..off + 16].fill(0);
    let mut copy = quiet.bytes;
    quiet.user = copy.as_mut_ptr() as u64;
    prog_load(&quiet).ok()
}

/// `ioctl(fd, PERF_EVENT_IOC_SET_BPF, prog_fd)` on a kernel event with one of our programs:
/// the program goes to the kernel (`None`: not such a call).
pub fn ioctl(fd: i32, req: libc::c_ulong, arg: libc::c_ulong) -> Option<Result<i64, i32>> {
    if req != PERF_EVENT_IOC_SET_BPF || objects::get(arg as i32).is_none() || kernel_kind(fd).is_none() {
        return None;
    }
    Some(
        with_kernel_prog(arg as i32, |kfd| {
            // SAFETY: an ioctl on the loader's kernel perf event with a program descriptor.
            let r = unsafe { sys::raw6(libc::SYS_ioctl, fd as i64, req as i64, kfd as i64, 0, 0, 0) };
            if r < 0 { Err(Error::new(-r as i32, "PERF_EVENT_IOC_SET_BPF")) } else { Ok(r) }
        })
        .map_err(|e| e.errno),
    )
}
