//! [`KernelMap`]: a session map whose contents are a kernel map that cannot be mapped into the
//! process (hash, LRU hash, per-CPU hash and array: the kernel lets user space map only
//! `BPF_F_MMAPABLE` arrays, which the runtime maps directly instead). Every operation is a
//! `bpf()` call on the kernel map's descriptor: what a user-space program does to a map it
//! shares with kernel programs costs a system call (about 1 µs, see the README), where a
//! session map or a mapped array costs tens of nanoseconds.
//!
//! **Program-side semantics** (what the helpers call, [`KernelMap::lookup`] and friends):
//! - `bpf_map_lookup_elem` copies the value (`BPF_MAP_LOOKUP_ELEM`) into a buffer of the run's
//!   CPU slot and returns the buffer; a second lookup of the same key in the same run returns
//!   the same buffer, as the kernel returns the same element. Writes through the pointer
//!   (plain stores, atomics) are the program's until the run ends ([`KernelMap::write_back`],
//!   called by the runtime when the run gives its slot back): a changed value is written to
//!   the kernel then (`BPF_MAP_UPDATE_ELEM` with `BPF_EXIST`; an element deleted meanwhile
//!   stays deleted, as a write to a freed element is lost in the kernel). The write is not
//!   atomic with kernel programs' writes to the same element in between: concurrent
//!   increments of one element from both sides can lose some (use separate keys, or a mapped
//!   array, for counters both sides increment).
//! - Per-CPU maps: the value of the run's CPU slot (the kernel's CPU of that number); an
//!   update from a program changes that CPU's value only (an existing element's other CPUs
//!   are read and written back unchanged; a new element's are zero), as the kernel's
//!   `bpf_map_update_elem` does from a program.
//! - `bpf_map_update_elem` / `bpf_map_delete_elem` are the kernel's calls with the program's
//!   flags and the kernel's errno. A buffer of a key updated or deleted in the same run is
//!   no longer written back (in the kernel a hash update replaces the element: the old
//!   pointer's writes are lost); an array's is refreshed (arrays are updated in place).
//!
//! - LRU hashes: a lookup through `bpf()` does not mark the element used, as a program's lookup
//!   does in the kernel, so the kernel may evict an element only user-space programs look up.
//!
//! A run holds its CPU slot alone (see the runtime's `context`), so a slot's buffers are used
//! by one thread at a time: no lock. No allocation on these paths (the buffers are allocated
//! when the map is opened), but one or two system calls per operation.
//!
//! The syscall-style API (`lookup_elem`, `update_elem`, ...) is `bpf()` itself.
//!
//! **Descriptors.** The descriptor is opened in the table of the thread that opens the map;
//! an agent's thread works in a table of its own (invisible to the program), so the first
//! operation on another thread (a probe's run on a program thread) copies it into that
//! thread's table (`pidfd_getfd`), at the top of the descriptor range: the program's own
//! descriptors keep their numbers, but this one is visible in its `/proc/self/fd` (the price of
//! a map the program's threads reach through `bpf()`; mapped arrays need none).

use std::cell::UnsafeCell;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicI32, Ordering};

use crate::map::Base;
use crate::mem::round8;
use crate::types::*;

/// Values one run may hold from one map at once; a further lookup in the same run reuses the
/// oldest buffer (after writing it back).
pub const BUFS_PER_SLOT: usize = 8;

const BPF_MAP_LOOKUP_ELEM: i64 = 1;
const BPF_MAP_UPDATE_ELEM: i64 = 2;
const BPF_MAP_DELETE_ELEM: i64 = 3;
const BPF_MAP_GET_NEXT_KEY: i64 = 4;
const BPF_MAP_LOOKUP_AND_DELETE_ELEM: i64 = 21;

const EKERNEL: &str = "the kernel's answer (bpf() on the shared kernel map)";

/// `bpf(cmd, attr, size of attr)` through the `syscall` instruction itself: in a loader under
/// `userbpf load`, libc's `syscall` belongs to the syscall server, which would answer instead
/// of the kernel. `attr` is the command's part of `union bpf_attr`, filled by the caller.
pub fn raw_bpf(cmd: i64, attr: &mut [u64]) -> std::io::Result<i64> {
    let r: i64;
    // SAFETY: the x86-64 Linux system call convention (number in rax, arguments in rdi, rsi,
    // rdx; rcx and r11 clobbered). `attr` is a writable buffer of the size passed, laid out as
    // the command's part of `union bpf_attr`; the kernel reads and writes at most that many
    // bytes, and the pointers inside point to live buffers of the sizes the command needs
    // (the callers' contracts).
    unsafe {
        std::arch::asm!("syscall", inlateout("rax") libc::SYS_bpf => r, in("rdi") cmd, in("rsi") attr.as_mut_ptr(),
             in("rdx") std::mem::size_of_val(attr), lateout("rcx") _, lateout("r11") _, options(nostack));
    }
    if r < 0 { Err(std::io::Error::from_raw_os_error(-r as i32)) } else { Ok(r) }
}

/// A map element command (the first 32 bytes of `union bpf_attr`) through [`raw_bpf`].
fn sys_bpf(cmd: i64, attr: &mut [u64; 4]) -> Result<(), MapError> {
    raw_bpf(cmd, attr).map(|_| ()).map_err(|e| MapError::new(e.raw_os_error().unwrap_or(libc::EIO), EKERNEL))
}

/// One held value: its key, the value as looked up, and the value the program sees.
struct Held {
    used: bool,
    /// The CPU whose value it holds (per-CPU maps).
    cpu: u32,
    /// Updated or deleted since the lookup: not written back.
    detached: bool,
    key: Box<[u8]>,
    snap: Box<[u8]>,
    /// 8-byte aligned (programs use atomics on it).
    val: Box<[u64]>,
}

fn words_bytes(w: &[u64]) -> &[u8] {
    // SAFETY: the words' bytes, borrowed immutably with them.
    unsafe { std::slice::from_raw_parts(w.as_ptr().cast(), w.len() * 8) }
}

impl Held {
    fn val(&mut self) -> &mut [u8] {
        let n = self.val.len() * 8;
        // SAFETY: the words' bytes, borrowed mutably through `self`.
        unsafe { std::slice::from_raw_parts_mut(self.val.as_mut_ptr().cast(), n) }
    }
    fn ptr(&mut self) -> *mut u8 {
        self.val.as_mut_ptr().cast()
    }
}

/// A CPU slot's buffers.
struct Slot {
    held: [Held; BUFS_PER_SLOT],
    /// Next buffer to take when all are held.
    next: usize,
    /// Every CPU's value (per-CPU maps): the kernel's value buffer.
    all: Box<[u8]>,
}

/// A kernel map reached through `bpf()` (see the module docs).
pub struct KernelMap {
    pub(crate) base: Base,
    /// The descriptor, in the descriptor table of the thread that opened the map (an agent's
    /// thread works in a table of its own).
    fd: OwnedFd,
    /// The thread that opened the map (`pthread_self`).
    origin: libc::pthread_t,
    /// Its kernel thread id (for `pidfd_getfd`).
    origin_tid: i32,
    /// A copy of the descriptor in the table of the other threads (the program's), made at the
    /// first operation there (-1: none yet).
    here: AtomicI32,
    slots: Box<[UnsafeCell<Slot>]>,
    /// The held value buffers' addresses (for [`KernelMap::contains`]).
    bufs: Box<[u64]>,
    /// Bytes of one CPU's value in the kernel's per-CPU buffer (`round_up(value_size, 8)`).
    stride: usize,
    percpu: bool,
    array: bool,
}

// SAFETY: a slot's buffers are used only by the run holding that CPU slot (one thread at a
// time, see the module docs); everything else is immutable after construction.
unsafe impl Sync for KernelMap {}
// SAFETY: as above; the descriptor and boxes may move between threads.
unsafe impl Send for KernelMap {}

impl KernelMap {
    /// The session map `base` (its spec, id and file) backed by kernel map `fd`, whose
    /// geometry the caller checked to be the same.
    pub(crate) fn new(base: Base, fd: OwnedFd) -> KernelMap {
        let spec = &base.spec;
        let percpu = spec.map_type.is_percpu();
        let stride = round8(spec.value_size as usize);
        let vlen = spec.value_size as usize;
        let ks = spec.key_size as usize;
        let nr = base.nr_cpus.max(1) as usize;
        let slots = (0..nr)
            .map(|_| {
                UnsafeCell::new(Slot {
                    held: std::array::from_fn(|_| Held {
                        used: false,
                        cpu: 0,
                        detached: false,
                        key: vec![0; ks].into(),
                        snap: vec![0; vlen].into(),
                        val: vec![0u64; stride.max(8) / 8].into(),
                    }),
                    next: 0,
                    all: vec![0; if percpu { stride * nr } else { 0 }].into(),
                })
            })
            .collect();
        let array = matches!(spec.map_type, MapType::BPF_MAP_TYPE_ARRAY | MapType::BPF_MAP_TYPE_PERCPU_ARRAY);
        let slots: Box<[UnsafeCell<Slot>]> = slots;
        let bufs = slots
            .iter()
            // SAFETY: nothing else references the slots yet.
            .flat_map(|c| unsafe { &*c.get() }.held.iter().map(|h| h.val.as_ptr() as u64).collect::<Vec<_>>())
            .collect();
        // SAFETY: pthread_self and gettid have no preconditions.
        let (origin, origin_tid) = unsafe { (libc::pthread_self(), libc::gettid()) };
        KernelMap { base, fd, origin, origin_tid, here: AtomicI32::new(-1), slots, bufs, stride, percpu, array }
    }

    pub(crate) fn base(&self) -> &Base {
        &self.base
    }

    /// The kernel map's descriptor.
    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// The descriptor in the calling thread's table.
    fn raw(&self) -> u64 {
        // SAFETY: pthread_self has no preconditions.
        if unsafe { libc::pthread_self() } == self.origin {
            return self.fd.as_raw_fd() as u32 as u64;
        }
        match self.here.load(Ordering::Acquire) {
            -1 => self.copy_here() as u32 as u64,
            fd => fd as u32 as u64,
        }
    }

    /// Copies the descriptor from the opening thread's table into the calling thread's (the
    /// program's: an agent's thread has a table of its own), at the top of the descriptor
    /// range so that the program's own descriptors keep their numbers: `pidfd_getfd` on the
    /// opening thread (`PIDFD_THREAD`), then `F_DUPFD_CLOEXEC` near `RLIMIT_NOFILE`. Once per
    /// map and process; -1 (every operation then fails with `EBADF`) when the kernel refuses.
    #[cold]
    fn copy_here(&self) -> i32 {
        const PIDFD_THREAD: i64 = libc::O_EXCL as i64;
        // SAFETY: plain system calls on integers; descriptors returned are owned here.
        let fd = unsafe {
            let pidfd = libc::syscall(libc::SYS_pidfd_open, self.origin_tid as i64, PIDFD_THREAD) as i32;
            if pidfd < 0 {
                return -1;
            }
            let low = libc::syscall(libc::SYS_pidfd_getfd, pidfd, self.fd.as_raw_fd(), 0) as i32;
            libc::close(pidfd);
            if low < 0 {
                return -1;
            }
            let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
            let top = (lim.rlim_cur.min(1 << 20) as i32 - 64).max(low + 1);
            let high = libc::fcntl(low, libc::F_DUPFD_CLOEXEC, top);
            if high >= 0 {
                libc::close(low);
                high
            } else {
                libc::fcntl(low, libc::F_SETFD, libc::FD_CLOEXEC);
                low
            }
        };
        match self.here.compare_exchange(-1, fd, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => fd,
            Err(other) => {
                // SAFETY: our copy, unused: another thread made one first.
                unsafe { libc::close(fd) };
                other
            }
        }
    }

    fn nr(&self) -> usize {
        self.slots.len()
    }

    /// The slot's buffers.
    ///
    /// # Safety
    /// The caller's run holds CPU slot `slot` (no other reference to it exists meanwhile).
    #[allow(clippy::mut_from_ref)]
    unsafe fn slot(&self, slot: u32) -> &mut Slot {
        let i = slot as usize % self.nr();
        // SAFETY: the caller holds the slot alone.
        unsafe { &mut *self.slots[i].get() }
    }

    fn key_size(&self) -> usize {
        self.base.spec.key_size as usize
    }
    fn value_size(&self) -> usize {
        self.base.spec.value_size as usize
    }

    // ---- syscall-style API: bpf() itself ----

    pub(crate) fn lookup_elem(&self, key: &[u8], value_out: &mut [u8]) -> Result<(), MapError> {
        sys_bpf(BPF_MAP_LOOKUP_ELEM, &mut [self.raw(), key.as_ptr() as u64, value_out.as_mut_ptr() as u64, 0])
    }
    pub(crate) fn update_elem(&self, key: &[u8], value: &[u8], flags: u64) -> Result<(), MapError> {
        sys_bpf(BPF_MAP_UPDATE_ELEM, &mut [self.raw(), key.as_ptr() as u64, value.as_ptr() as u64, flags])
    }
    pub(crate) fn delete_elem(&self, key: &[u8]) -> Result<(), MapError> {
        sys_bpf(BPF_MAP_DELETE_ELEM, &mut [self.raw(), key.as_ptr() as u64, 0, 0])
    }
    pub(crate) fn get_next_key(&self, key: Option<&[u8]>, next_out: &mut [u8]) -> Result<(), MapError> {
        let k = key.map_or(0, |k| k.as_ptr() as u64);
        sys_bpf(BPF_MAP_GET_NEXT_KEY, &mut [self.raw(), k, next_out.as_mut_ptr() as u64, 0])
    }
    pub(crate) fn lookup_and_delete_elem(&self, key: &[u8], value_out: &mut [u8]) -> Result<(), MapError> {
        sys_bpf(
            BPF_MAP_LOOKUP_AND_DELETE_ELEM,
            &mut [self.raw(), key.as_ptr() as u64, value_out.as_mut_ptr() as u64, 0],
        )
    }

    // ---- program side ----

    /// `bpf_map_lookup_elem` from a run holding CPU slot `slot`: a buffer holding the value of
    /// `key` (per-CPU maps: CPU `cpu`'s), or null when the kernel has no such element.
    ///
    /// # Safety
    /// `key` is readable for `key_size` bytes; the caller's run holds CPU slot `slot`. The
    /// pointer is valid until the run ends.
    pub unsafe fn lookup(&self, key: *const u8, slot: u32, cpu: u32) -> *mut u8 {
        let ks = self.key_size();
        // SAFETY: the caller's contract.
        let key = unsafe { std::slice::from_raw_parts(key, ks) };
        // SAFETY: the caller's run holds the slot.
        let s = unsafe { self.slot(slot) };
        // The same key again in this run (same CPU): the same buffer.
        if let Some(h) = s.held.iter_mut().find(|h| h.used && !h.detached && h.cpu == cpu && *h.key == *key) {
            return h.ptr();
        }
        let i = match s.held.iter().position(|h| !h.used) {
            Some(i) => i,
            None => {
                let i = s.next;
                s.next = (s.next + 1) % BUFS_PER_SLOT;
                self.write_back_one(&mut s.held[i], &mut s.all);
                i
            }
        };
        let vs = self.value_size();
        let found = if self.percpu {
            let c = cpu as usize % self.nr();
            let (all, h) = (&mut s.all, &mut s.held[i]);
            let r = self.lookup_elem(key, all);
            if r.is_ok() {
                h.val()[..vs].copy_from_slice(&all[c * self.stride..c * self.stride + vs]);
            }
            r.is_ok()
        } else {
            self.lookup_elem(key, &mut s.held[i].val()[..vs]).is_ok()
        };
        if !found {
            return std::ptr::null_mut();
        }
        let h = &mut s.held[i];
        h.used = true;
        h.detached = false;
        h.cpu = cpu;
        h.key.copy_from_slice(key);
        h.snap.copy_from_slice(&words_bytes(&h.val)[..vs]);
        h.ptr()
    }

    /// `bpf_map_update_elem` from a run holding CPU slot `slot` (per-CPU maps: CPU `cpu`'s
    /// value only).
    ///
    /// # Safety
    /// `key` readable for `key_size` bytes, `value` for `value_size` bytes; the caller's run
    /// holds CPU slot `slot`.
    pub unsafe fn update(
        &self,
        key: *const u8,
        value: *const u8,
        flags: u64,
        slot: u32,
        cpu: u32,
    ) -> Result<(), MapError> {
        let (ks, vs) = (self.key_size(), self.value_size());
        // SAFETY: the caller's contract.
        let key = unsafe { std::slice::from_raw_parts(key, ks) };
        // SAFETY: the caller's contract.
        let value = unsafe { std::slice::from_raw_parts(value, vs) };
        // SAFETY: the caller's run holds the slot.
        let s = unsafe { self.slot(slot) };
        if flags & !(BPF_NOEXIST | BPF_EXIST) != 0 || flags & BPF_NOEXIST != 0 && flags & BPF_EXIST != 0 {
            // BPF_F_LOCK needs a bpf_spin_lock, which a shared value cannot hold (refused at load).
            return Err(MapError::new(libc::EINVAL, "invalid flags"));
        }
        let r = if self.percpu {
            let cpu = cpu as usize % self.nr();
            let off = cpu * self.stride;
            match self.lookup_elem(key, &mut s.all) {
                Ok(()) if flags == BPF_NOEXIST => Err(MapError::new(libc::EEXIST, "element exists (BPF_NOEXIST)")),
                Ok(()) => {
                    s.all[off..off + vs].copy_from_slice(value);
                    self.update_elem(key, &s.all, BPF_EXIST)
                }
                Err(e) if e.errno() == libc::ENOENT && !self.array => {
                    if flags == BPF_EXIST {
                        Err(e)
                    } else {
                        s.all.fill(0);
                        s.all[off..off + vs].copy_from_slice(value);
                        self.update_elem(key, &s.all, flags)
                    }
                }
                Err(e) => Err(e),
            }
        } else {
            self.update_elem(key, value, flags)
        };
        if r.is_ok() {
            for h in s.held.iter_mut().filter(|h| h.used && *h.key == *key && (!self.percpu || h.cpu == cpu)) {
                if self.array {
                    // In place, as the kernel's array: the held pointer sees the new value.
                    h.val()[..vs].copy_from_slice(value);
                    h.snap.copy_from_slice(value);
                } else {
                    h.detached = true;
                }
            }
        }
        r
    }

    /// `bpf_map_delete_elem` from a run holding CPU slot `slot`.
    ///
    /// # Safety
    /// `key` readable for `key_size` bytes; the caller's run holds CPU slot `slot`.
    pub unsafe fn delete(&self, key: *const u8, slot: u32) -> Result<(), MapError> {
        // SAFETY: the caller's contract.
        let key = unsafe { std::slice::from_raw_parts(key, self.key_size()) };
        let r = self.delete_elem(key);
        if r.is_ok() {
            // SAFETY: the caller's run holds the slot.
            let s = unsafe { self.slot(slot) };
            for h in s.held.iter_mut().filter(|h| h.used && *h.key == *key) {
                h.detached = true;
            }
        }
        r
    }

    fn write_back_one(&self, h: &mut Held, all: &mut [u8]) {
        if !h.used {
            return;
        }
        h.used = false;
        let vs = self.value_size();
        if h.detached || words_bytes(&h.val)[..vs] == *h.snap {
            return;
        }
        // Lost when the element is gone (deleted meanwhile), as in the kernel.
        if self.percpu {
            let off = (h.cpu as usize % self.nr()) * self.stride;
            if self.lookup_elem(&h.key, all).is_ok() {
                all[off..off + vs].copy_from_slice(&words_bytes(&h.val)[..vs]);
                let _ = self.update_elem(&h.key, all, BPF_EXIST);
            }
        } else {
            let _ = self.update_elem(&h.key, &words_bytes(&h.val)[..vs], BPF_EXIST);
        }
    }

    /// The end of a run holding CPU slot `slot`: values changed through looked-up pointers go
    /// to the kernel, and the slot's buffers are free again.
    ///
    /// # Safety
    /// The caller's run holds CPU slot `slot` and no pointer into its buffers is used after.
    pub unsafe fn write_back(&self, slot: u32) {
        // SAFETY: the caller's run holds the slot.
        let s = unsafe { self.slot(slot) };
        let all = &mut s.all;
        for h in s.held.iter_mut() {
            self.write_back_one(h, all);
        }
        s.next = 0;
    }

    /// Whether `[addr, addr+len)` lies inside one held value buffer (what a program may
    /// touch through a looked-up pointer).
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        let vs = self.value_size() as u64;
        self.bufs.iter().any(|&p| addr >= p && addr.checked_add(len).is_some_and(|e| e <= p + vs))
    }
}
