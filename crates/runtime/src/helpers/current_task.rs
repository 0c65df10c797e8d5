//! `bpf_get_current_task`: a stand-in `task_struct` for the calling thread.
//!
//! In the kernel the helper returns the thread's `task_struct`, which programs read with
//! `bpf_probe_read_kernel` (libbpf's `BPF_CORE_READ(task, real_parent, tgid)`, bpftrace's
//! `curtask->real_parent->pid`) at the offsets the running kernel's BTF gives (the loader
//! relocates them). There is no `task_struct` in user space, so each thread gets a
//! zero-filled block the size of the kernel's, with the fields programs read about a process
//! written at the kernel's offsets (found in `/sys/kernel/btf/vmlinux` when a program that
//! calls the helper is prepared, see [`prepare`], and kept in `/dev/shm` for the next
//! process):
//!
//! - `pid` (the thread id), `tgid` (the process id), `comm` (the thread's name);
//! - `group_leader`: a second block, the process's main thread (`pid` = `tgid`, its name);
//! - `real_parent` and `parent`: a third block, the parent process (`pid` = `tgid` = the
//!   parent's pid as `getppid` gives it, its name from `/proc/PID/comm`), whose own
//!   `group_leader` is itself and whose parent is unknown (null).
//!
//! Every other field reads as zero. The blocks are the calling thread's: `probe_read_kernel`
//! reads them (see `probe::program_memory`); another thread's or a finished run's pointer is
//! not readable. They are filled on every call from the thread's caches (pid, comm), the
//! names of the main thread and the parent refreshed as the comm cache is (every
//! [`super::task::REFRESH_NS`]; two small `/proc` reads). The blocks are slots of one mapping
//! made when the program is prepared; a thread takes a slot at its first call and keeps it to
//! its last system call (no destructor: an exiting thread's last calls still see their task);
//! a slot is taken back once its thread is gone.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};

use super::time::coarse_monotonic_ns;

/// Byte offsets in the kernel's `struct task_struct`, and its size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskLayout {
    pub size: usize,
    pub pid: usize,
    pub tgid: usize,
    pub comm: usize,
    pub group_leader: usize,
    pub real_parent: usize,
    pub parent: usize,
}

impl TaskLayout {
    /// The layout in `btf` (the kernel's), or why there is none.
    pub fn from_btf(btf: &userbpf_object::btf::Btf) -> Result<TaskLayout, String> {
        use userbpf_object::btf::Kind;
        let id = btf.find_by_name_kind("task_struct", Kind::Struct).ok_or("no struct task_struct")?;
        let ty = btf.get(id).map_err(|e| e.to_string())?;
        let c = ty.composite().ok_or("task_struct is not a struct")?;
        let mut found: [Option<usize>; 6] = [None; 6];
        const NAMES: [&str; 6] = ["pid", "tgid", "comm", "group_leader", "real_parent", "parent"];
        find_members(btf, c, 0, &NAMES, &mut found, 0);
        let at = |i: usize| found[i].ok_or_else(|| format!("task_struct has no member `{}`", NAMES[i]));
        let l = TaskLayout {
            size: c.size as usize,
            pid: at(0)?,
            tgid: at(1)?,
            comm: at(2)?,
            group_leader: at(3)?,
            real_parent: at(4)?,
            parent: at(5)?,
        };
        l.checked().ok_or_else(|| "task_struct's members lie outside its size".to_string())
    }

    /// The layout, if every member the helper writes lies within the size (and the size is a
    /// task_struct's, not some huge number read from a damaged cache).
    fn checked(self) -> Option<TaskLayout> {
        let fits = |off: usize, len: usize| off.checked_add(len).is_some_and(|e| e <= self.size);
        (self.size <= 1 << 20
            && fits(self.pid, 4)
            && fits(self.tgid, 4)
            && fits(self.comm, 16)
            && fits(self.group_leader, 8)
            && fits(self.real_parent, 8)
            && fits(self.parent, 8))
        .then_some(self)
    }

    fn fields(&self) -> [usize; 7] {
        [self.size, self.pid, self.tgid, self.comm, self.group_leader, self.real_parent, self.parent]
    }

    fn from_fields(f: [usize; 7]) -> Option<TaskLayout> {
        let [size, pid, tgid, comm, group_leader, real_parent, parent] = f;
        TaskLayout { size, pid, tgid, comm, group_leader, real_parent, parent }.checked()
    }
}

const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

/// Where the layout found in the kernel's BTF is kept for the next process (parsing the 5 MB
/// takes about 25 ms, which every process image calling the helper would otherwise pay at
/// start-up): a file of this user's in `/dev/shm`, named after this boot and the BTF file's
/// size and time.
fn cache_path() -> Option<std::path::PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(VMLINUX).ok()?;
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    Some(std::path::PathBuf::from(format!(
        "/dev/shm/.userbpf-task-layout-{uid}-v1-{}-{:x}-{:x}",
        boot.trim(),
        m.size(),
        m.mtime()
    )))
}

/// The layout kept at `path`: only from a regular file of this user's that no one else may
/// write, and only if it passes [`TaskLayout::checked`].
fn from_cache(path: &std::path::Path) -> Option<TaskLayout> {
    let text = String::from_utf8(userbpf_cachefile::read(path)?).ok()?;
    let v: Vec<usize> = text.split_whitespace().map(str::parse).collect::<Result<_, _>>().ok()?;
    TaskLayout::from_fields(v.try_into().ok()?)
}

/// Keeps `l` at `path` for the next process (best effort: written whole under another name,
/// then renamed).
fn to_cache(path: &std::path::Path, l: &TaskLayout) {
    userbpf_cachefile::write(path, l.fields().map(|v| v.to_string()).join(" ").as_bytes());
}

/// The running kernel's layout: from the cache of an earlier process, else from the BTF.
fn kernel_layout() -> Result<TaskLayout, String> {
    let cache = cache_path();
    if let Some(l) = cache.as_deref().and_then(from_cache) {
        return Ok(l);
    }
    let l = match userbpf_object::btf::Btf::parse_file(VMLINUX) {
        Ok(Ok(btf)) => TaskLayout::from_btf(&btf)?,
        Ok(Err(e)) => return Err(format!("{VMLINUX}: {e}")),
        Err(e) => return Err(format!("{VMLINUX}: {e}")),
    };
    if let Some(c) = cache {
        to_cache(&c, &l);
    }
    Ok(l)
}

/// Records the byte offsets of the members of `c` named in `names` (at `base` bytes), looking
/// into anonymous structs and unions (a randomised layout's, for one) as C does.
fn find_members(
    btf: &userbpf_object::btf::Btf,
    c: &userbpf_object::btf::CompositeType,
    base: usize,
    names: &[&str],
    found: &mut [Option<usize>],
    depth: u32,
) {
    for m in &c.members {
        if m.bitfield_size != 0 {
            continue;
        }
        let off = base + (m.bit_offset / 8) as usize;
        let name = btf.name_of(m.name_off);
        if name.is_empty() {
            if depth < 8
                && let Ok(t) = btf.skip_mods_and_typedefs(m.type_id)
                && let Some(inner) = btf.type_by_id(t).and_then(|t| t.composite())
            {
                find_members(btf, inner, off, names, found, depth + 1);
            }
            continue;
        }
        if let Some(i) = names.iter().position(|n| *n == name)
            && found[i].is_none()
        {
            found[i] = Some(off);
        }
    }
}

/// The running kernel's layout, once [`prepare`] found it.
static LAYOUT: OnceLock<Result<TaskLayout, String>> = OnceLock::new();

/// Finds the kernel's `task_struct` layout (once per process; see [`kernel_layout`]):
/// called when a program calling `bpf_get_current_task` is prepared, off the hit path. The
/// error says why the helper will return 0 (as it does before this is called).
pub fn prepare() -> Result<TaskLayout, String> {
    let layout = LAYOUT.get_or_init(kernel_layout).clone()?;
    pool(&layout).ok_or("no memory for the tasks' blocks")?;
    Ok(layout)
}

/// Threads the pool has blocks for at once; more find the slot of a thread that ended.
const SLOTS: usize = 256;

/// Every thread's blocks, one mapping made by [`prepare`]: per slot its task, its main
/// thread's and its parent's, `stride` bytes each (untouched pages cost nothing).
struct Pool {
    base: usize,
    /// Bytes per block (the layout's size, rounded up to 64).
    stride: usize,
    /// The thread id owning each slot (0: free).
    owner: [AtomicI32; SLOTS],
    /// Per slot: when the main thread's and the parent's names were read (0: never), and in
    /// which fork generation of the process (a child of fork reads them again at once).
    names_at: [AtomicU64; SLOTS],
    generation: [AtomicU64; SLOTS],
}

static POOL: OnceLock<Option<Pool>> = OnceLock::new();

fn pool(layout: &TaskLayout) -> Option<&'static Pool> {
    POOL.get_or_init(|| {
        let stride = layout.size.div_ceil(64) * 64;
        let len = SLOTS * 3 * stride;
        // Never unmapped: a thread's task stays readable to its last system call.
        let p = super::anonymous_memory(len)?;
        Some(Pool {
            base: p as usize,
            stride,
            owner: [const { AtomicI32::new(0) }; SLOTS],
            names_at: [const { AtomicU64::new(0) }; SLOTS],
            generation: [const { AtomicU64::new(0) }; SLOTS],
        })
    })
    .as_ref()
}

impl Pool {
    /// Block `which` (0 task, 1 main thread, 2 parent) of `slot`.
    fn block(&self, slot: usize, which: usize) -> *mut u8 {
        (self.base + (slot * 3 + which) * self.stride) as *mut u8
    }

    /// The calling thread's slot (thread id `tid`), taken at its first call.
    fn slot(&self, tid: i32) -> Option<usize> {
        // The slot this thread last had (in the runtime's thread block, which has no
        // destructor: it stays valid to the thread's very last system call), checked against
        // the slot's owner on every use (a child of fork has another thread id).
        if let Some(s) = crate::context::task_slot()
            && s < SLOTS
            && self.owner[s].load(Ordering::Relaxed) == tid
        {
            return Some(s);
        }
        self.claim(tid)
    }

    #[cold]
    #[inline(never)]
    fn claim(&self, tid: i32) -> Option<usize> {
        let take = |s: usize, from: i32| {
            self.owner[s].compare_exchange(from, tid, Ordering::AcqRel, Ordering::Relaxed).is_ok()
        };
        // A slot of this thread id is a previous image's or a fork parent's thread: this
        // thread's now. Else a free one; else one whose thread has ended.
        let found = (0..SLOTS)
            .find(|&s| self.owner[s].load(Ordering::Relaxed) == tid)
            .or_else(|| (0..SLOTS).find(|&s| take(s, 0)))
            .or_else(|| {
                // SAFETY: getpid cannot fail.
                let tgid = unsafe { libc::getpid() };
                (0..SLOTS).find(|&s| {
                    let t = self.owner[s].load(Ordering::Relaxed);
                    // SAFETY: signal 0 only checks that thread `t` of this process exists.
                    let gone = t != tid
                        && unsafe { libc::syscall(libc::SYS_tgkill, tgid, t, 0) } != 0
                        && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
                    gone && take(s, t)
                })
            })?;
        self.names_at[found].store(0, Ordering::Relaxed);
        crate::context::set_task_slot(found);
        Some(found)
    }
}

/// Whether `[addr, addr+len)` lies in the calling thread's blocks (what `probe_read_kernel`
/// may read of them).
pub(crate) fn contains(addr: u64, len: u64) -> bool {
    let Some(p) = POOL.get().and_then(|p| p.as_ref()) else { return false };
    let Some(s) = crate::context::task_slot() else { return false };
    if s >= SLOTS || p.owner[s].load(Ordering::Relaxed) != super::task::pid_tgid() as u32 as i32 {
        return false;
    }
    let start = p.block(s, 0) as u64;
    addr >= start && addr.checked_add(len).is_some_and(|end| end <= start + 3 * p.stride as u64)
}

/// Writes `v` at `off` of the block at `block`.
///
/// # Safety
/// `off + size_of::<T>()` is within the block (the layout's checked offsets).
unsafe fn put<T: Copy>(block: *mut u8, off: usize, v: T) {
    // SAFETY: the caller's bound; the block is this thread's writable mapping.
    unsafe { (block.add(off) as *mut T).write_unaligned(v) }
}

/// The name in `/proc/{prefix}{id}/comm` (NUL-padded, at most 15 bytes), zeros if
/// unreadable. No allocation: the path is put together on the stack.
fn read_name(prefix: &[u8], id: i32) -> [u8; 16] {
    let mut name = [0u8; 16];
    let mut path = [0u8; 64];
    let mut n = 0;
    let mut push = |bytes: &[u8]| {
        for &c in bytes {
            if n < path.len() - 1 {
                path[n] = c;
                n += 1;
            }
        }
    };
    push(b"/proc/");
    push(prefix);
    let mut digits = [0u8; 12];
    let (mut v, mut d) = (id.unsigned_abs(), digits.len());
    loop {
        d -= 1;
        digits[d] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    push(&digits[d..]);
    push(b"/comm");
    // SAFETY: `path` is NUL-terminated (its last byte is never written); the descriptor is
    // closed below.
    let fd = unsafe { libc::open(path.as_ptr() as *const libc::c_char, libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return name;
    }
    // SAFETY: reads at most 16 bytes into the buffer we own.
    let n = unsafe { libc::read(fd, name.as_mut_ptr() as *mut libc::c_void, 16) };
    // SAFETY: our descriptor.
    unsafe { libc::close(fd) };
    let n = if n > 0 { n as usize } else { 0 };
    let end = name[..n].iter().position(|&c| c == b'\n' || c == 0).unwrap_or(n).min(15);
    name[end..].fill(0);
    name
}

/// Refreshes the main thread's and the parent's names and the parent's pid in slot `s`.
#[cold]
#[inline(never)]
fn refresh_names(p: &Pool, s: usize, l: &TaskLayout, tgid: i32, tid: i32, now: u64) {
    let (leader, parent) = (p.block(s, 1), p.block(s, 2));
    let leader_name = if tid == tgid { super::task::comm() } else { read_name(b"self/task/", tgid) };
    // SAFETY: getppid cannot fail.
    let ppid = unsafe { libc::getppid() };
    let parent_name = read_name(b"", ppid);
    // SAFETY: offsets checked against the layout's size, within each block.
    unsafe {
        put(leader, l.comm, leader_name);
        put(parent, l.pid, ppid);
        put(parent, l.tgid, ppid);
        put(parent, l.comm, parent_name);
        put(parent, l.group_leader, parent as u64);
    }
    p.generation[s].store(super::task::fork_generation(), Ordering::Relaxed);
    p.names_at[s].store(now.max(1), Ordering::Relaxed);
}

/// `u64 bpf_get_current_task(void)`: the calling thread's stand-in task (see the module's
/// documentation), or 0 before a program calling it was prepared, when the kernel's layout is
/// unknown, or when every slot is held by a live thread.
pub(crate) fn current_task() -> u64 {
    let Some(Ok(l)) = LAYOUT.get() else { return 0 };
    let Some(p) = POOL.get().and_then(|p| p.as_ref()) else { return 0 };
    let pid_tgid = super::task::pid_tgid();
    let (tgid, tid) = ((pid_tgid >> 32) as i32, pid_tgid as u32 as i32);
    let Some(s) = p.slot(tid) else { return 0 };
    let (task, leader, parent) = (p.block(s, 0), p.block(s, 1), p.block(s, 2));
    // SAFETY: offsets checked against the layout's size, within each block of the pool.
    unsafe {
        put(task, l.pid, tid);
        put(task, l.tgid, tgid);
        put(task, l.comm, super::task::comm());
        put(task, l.group_leader, leader as u64);
        put(task, l.real_parent, parent as u64);
        put(task, l.parent, parent as u64);
        put(leader, l.pid, tgid);
        put(leader, l.tgid, tgid);
        put(leader, l.group_leader, leader as u64);
        put(leader, l.real_parent, parent as u64);
        put(leader, l.parent, parent as u64);
    }
    let now = coarse_monotonic_ns();
    let at = p.names_at[s].load(Ordering::Relaxed);
    if at == 0
        || now.wrapping_sub(at) >= super::task::REFRESH_NS
        || p.generation[s].load(Ordering::Relaxed) != super::task::fork_generation()
    {
        refresh_names(p, s, l, tgid, tid, now);
    }
    task as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_keeps_a_layout_and_refuses_a_damaged_or_foreign_one() {
        let dir = std::env::temp_dir().join(format!("userbpf-task-layout-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let l = TaskLayout {
            size: 3264,
            pid: 1264,
            tgid: 1268,
            comm: 1752,
            group_leader: 1328,
            real_parent: 1280,
            parent: 1288,
        };
        let path = dir.join("layout");
        to_cache(&path, &l);
        assert_eq!(from_cache(&path), Some(l));
        for bad in ["", "1 2 3", "3264 1264 1268 1752 1328 1280 1288 9", "3264 1264 1268 3260 1328 1280 1288", "x"] {
            std::fs::write(&path, bad).unwrap();
            assert_eq!(from_cache(&path), None, "{bad:?}");
        }
        // Writable by others: not trusted.
        std::fs::write(&path, "3264 1264 1268 1752 1328 1280 1288").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert_eq!(from_cache(&path), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
