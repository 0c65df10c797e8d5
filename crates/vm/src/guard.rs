//! Fault-tolerant memory access: copies from addresses a program hands to a helper
//! (`bpf_probe_read_user` and friends) that return `-EFAULT` on a bad address instead of
//! killing the process, the way the kernel's exception tables work; and containment of faults
//! in JIT code.
//!
//! The copy routines are assembly: moves for copies up to 4 KiB (overlapping pairs up to 64
//! bytes, 64-byte blocks above), `rep movsb` beyond, and a byte loop for strings. A SIGSEGV/SIGBUS handler, installed once,
//! looks at the faulting instruction: inside one of these routines it resumes at the routine's
//! fixup, which returns `-EFAULT`; anywhere else it hands the signal to whatever handler was
//! there before (or the default action), so the process behaves as if we were not there.
//!
//! Other code can register ranges too: [`add_range`] with a fixed resume address, or
//! [`add_dynamic_range`] with a function that computes where to resume from the fault's
//! context (the JIT registers each program's code this way: it resumes at the program's abort
//! path with the faulting eBPF instruction in a register). The table of ranges is a fixed
//! array of [`MAX_RANGES`] slots, each a seqlock, so that the handler neither allocates nor
//! locks and registration never blocks it.
//!
//! The handler is installed by the first use (a copy, a registration, [`install`]). A handler
//! installed later by someone else for SIGSEGV or SIGBUS replaces it (unless it chains to it).

use std::sync::Once;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicUsize, fence};

/// The negated errno a failed copy returns.
pub const EFAULT_RET: i64 = -(libc::EFAULT as i64);

std::arch::global_asm!(
    ".pushsection .text.hot.userbpf_guard,\"ax\",@progbits",
    ".balign 16",
    // i64 userbpf_guard_copy(void *dst, const void *src, u64 len): 0 or -EFAULT. Sizes up
    // to 4 KiB are copied with moves (overlapping pairs for up to 64 bytes, 64-byte blocks
    // above, the last 64 bytes loaded first); `rep movsb` above that: on the EPYC this
    // project measures on, its start-up costs ~14 ns (16 bytes: 14 ns against 4 ns; 612
    // bytes: 47 ns against 26 ns for 16-byte moves, 2026-11-26).
    ".globl userbpf_guard_copy",
    ".hidden userbpf_guard_copy",
    "userbpf_guard_copy:",
    "    cmp rdx, 16",
    "    ja 20f",
    "    cmp rdx, 8",
    "    jb 10f",
    "    mov rax, qword ptr [rsi]",
    "    mov rcx, qword ptr [rsi + rdx - 8]",
    "    mov qword ptr [rdi], rax",
    "    mov qword ptr [rdi + rdx - 8], rcx",
    "    xor eax, eax",
    "    ret",
    "10:",
    "    cmp rdx, 4",
    "    jb 11f",
    "    mov eax, dword ptr [rsi]",
    "    mov ecx, dword ptr [rsi + rdx - 4]",
    "    mov dword ptr [rdi], eax",
    "    mov dword ptr [rdi + rdx - 4], ecx",
    "    xor eax, eax",
    "    ret",
    "11:",
    "    test rdx, rdx",
    "    jz 12f",
    "    mov r9, rdx",
    "    shr r9, 1",
    "    movzx eax, byte ptr [rsi]",
    "    movzx ecx, byte ptr [rsi + rdx - 1]",
    "    movzx r8d, byte ptr [rsi + r9]",
    "    mov byte ptr [rdi], al",
    "    mov byte ptr [rdi + rdx - 1], cl",
    "    mov byte ptr [rdi + r9], r8b",
    "12:",
    "    xor eax, eax",
    "    ret",
    "20:",
    "    cmp rdx, 32",
    "    ja 30f",
    "    movups xmm0, xmmword ptr [rsi]",
    "    movups xmm1, xmmword ptr [rsi + rdx - 16]",
    "    movups xmmword ptr [rdi], xmm0",
    "    movups xmmword ptr [rdi + rdx - 16], xmm1",
    "    xor eax, eax",
    "    ret",
    "30:",
    "    cmp rdx, 64",
    "    ja 31f",
    "    movups xmm0, xmmword ptr [rsi]",
    "    movups xmm1, xmmword ptr [rsi + 16]",
    "    movups xmm2, xmmword ptr [rsi + rdx - 32]",
    "    movups xmm3, xmmword ptr [rsi + rdx - 16]",
    "    movups xmmword ptr [rdi], xmm0",
    "    movups xmmword ptr [rdi + 16], xmm1",
    "    movups xmmword ptr [rdi + rdx - 32], xmm2",
    "    movups xmmword ptr [rdi + rdx - 16], xmm3",
    "    xor eax, eax",
    "    ret",
    "31:",
    "    cmp rdx, 4096",
    "    ja 40f",
    "    movups xmm4, xmmword ptr [rsi + rdx - 64]",
    "    movups xmm5, xmmword ptr [rsi + rdx - 48]",
    "    movups xmm6, xmmword ptr [rsi + rdx - 32]",
    "    movups xmm7, xmmword ptr [rsi + rdx - 16]",
    "    lea r8, [rdx - 64]",
    "    xor ecx, ecx",
    "32:",
    "    movups xmm0, xmmword ptr [rsi + rcx]",
    "    movups xmm1, xmmword ptr [rsi + rcx + 16]",
    "    movups xmm2, xmmword ptr [rsi + rcx + 32]",
    "    movups xmm3, xmmword ptr [rsi + rcx + 48]",
    "    movups xmmword ptr [rdi + rcx], xmm0",
    "    movups xmmword ptr [rdi + rcx + 16], xmm1",
    "    movups xmmword ptr [rdi + rcx + 32], xmm2",
    "    movups xmmword ptr [rdi + rcx + 48], xmm3",
    "    add rcx, 64",
    "    cmp rcx, r8",
    "    jb 32b",
    "    movups xmmword ptr [rdi + rdx - 64], xmm4",
    "    movups xmmword ptr [rdi + rdx - 48], xmm5",
    "    movups xmmword ptr [rdi + rdx - 32], xmm6",
    "    movups xmmword ptr [rdi + rdx - 16], xmm7",
    "    xor eax, eax",
    "    ret",
    "40:",
    "    mov rcx, rdx",
    "    rep movsb",
    "    xor eax, eax",
    "    ret",
    ".globl userbpf_guard_copy_end",
    ".hidden userbpf_guard_copy_end",
    "userbpf_guard_copy_end:",
    "    mov rax, -14",
    "    ret",
    // i64 userbpf_guard_strcpy(char *dst, const char *src, u64 size), size > 0: copies up to
    // and including the NUL, at most size-1 bytes then a NUL; returns the bytes written
    // including the NUL, or -EFAULT.
    ".balign 16",
    ".globl userbpf_guard_strcpy",
    ".hidden userbpf_guard_strcpy",
    "userbpf_guard_strcpy:",
    "    xor eax, eax",
    "    dec rdx",
    "2:",
    "    cmp rax, rdx",
    "    jae 3f",
    "    movzx ecx, byte ptr [rsi + rax]",
    "    mov byte ptr [rdi + rax], cl",
    "    inc rax",
    "    test cl, cl",
    "    jnz 2b",
    "    ret",
    "3:",
    "    mov byte ptr [rdi + rax], 0",
    "    inc rax",
    "    ret",
    ".globl userbpf_guard_strcpy_end",
    ".hidden userbpf_guard_strcpy_end",
    "userbpf_guard_strcpy_end:",
    "    mov rax, -14",
    "    ret",
    ".popsection",
);

unsafe extern "C" {
    fn userbpf_guard_copy(dst: *mut u8, src: *const u8, len: u64) -> i64;
    fn userbpf_guard_copy_end();
    fn userbpf_guard_strcpy(dst: *mut u8, src: *const u8, size: u64) -> i64;
    fn userbpf_guard_strcpy_end();
}

/// Most code ranges registered at once: the two copy routines plus one per live
/// [`JitProgram`](crate::JitProgram). The table is a fixed array so that the signal handler
/// never allocates or locks; registering a range when it is full fails
/// ([`add_range`] returns false, [`add_dynamic_range`] `None`, `JitProgram::compile` an error).
pub const MAX_RANGES: usize = 4096;

/// What a fault inside a range does, as the signal handler finds it.
#[derive(Clone, Copy)]
enum Action {
    /// Resume at this address.
    Resume(usize),
    /// Ask this function (with its data word) where to resume.
    Dynamic(DynamicFixup, usize),
}

/// One entry of the table. Readers (the signal handler, on any thread) never block: each slot
/// is a seqlock. A writer (the owner of the slot, claimed with `claimed`) makes `seq` odd,
/// changes the fields, then makes `seq` even again; a reader skips a slot whose `seq` is odd
/// or changed while it read the fields. The slot of a range that contains the faulting
/// instruction is never being written (its code is running, so it is registered and not
/// being removed), so skipping slots in flux never loses a fault that is ours.
struct Slot {
    seq: AtomicUsize,
    /// Taken by `claim` (true from registration until removal).
    claimed: AtomicBool,
    /// `[start, end)`; start 0 = empty.
    start: AtomicUsize,
    end: AtomicUsize,
    /// The resume address, or a [`DynamicFixup`] as an address when `dynamic`.
    fixup: AtomicUsize,
    data: AtomicUsize,
    dynamic: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Slot = Slot {
    seq: AtomicUsize::new(0),
    claimed: AtomicBool::new(false),
    start: AtomicUsize::new(0),
    end: AtomicUsize::new(0),
    fixup: AtomicUsize::new(0),
    data: AtomicUsize::new(0),
    dynamic: AtomicBool::new(false),
};
static SLOTS: [Slot; MAX_RANGES] = [EMPTY; MAX_RANGES];
/// One past the highest slot ever claimed: the handler scans no further.
static HIGH: AtomicUsize = AtomicUsize::new(0);

static mut OLD_SEGV: std::mem::MaybeUninit<libc::sigaction> = std::mem::MaybeUninit::zeroed();
static mut OLD_BUS: std::mem::MaybeUninit<libc::sigaction> = std::mem::MaybeUninit::zeroed();
// The hit path reads it: with its other statics on one page (see `userbpf_arena`).
#[unsafe(link_section = "userbpf_hot")]
static INSTALL: Once = Once::new();

/// A registered range, for [`remove`].
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a range that is not removed stays registered"]
pub struct RangeId(usize);

/// Decides where a fault inside a dynamic range resumes: it may read and change the
/// interrupted registers (setting the instruction pointer to where execution goes on) and
/// returns true, or returns false to treat the fault as not ours (it then goes to the previous
/// handler). `data` is the word given to [`add_dynamic_range`].
///
/// It runs inside a signal handler: it must be async-signal-safe (no allocation, no locks, no
/// panics) and must not touch thread-locals that need lazy initialisation.
pub type DynamicFixup = unsafe fn(data: usize, fault: &mut FaultContext) -> bool;

/// The interrupted thread's state at a fault, as a [`DynamicFixup`] sees and changes it.
pub struct FaultContext {
    uc: *mut libc::ucontext_t,
    addr: usize,
    sig: libc::c_int,
}

impl FaultContext {
    /// The faulting instruction's address.
    pub fn ip(&self) -> usize {
        self.reg(libc::REG_RIP) as usize
    }
    /// Resumes at `ip` instead.
    pub fn set_ip(&mut self, ip: usize) {
        self.set_reg(libc::REG_RIP, ip as u64);
    }
    /// The address that faulted, as the kernel reports it (0 for a general-protection fault,
    /// such as an access to a non-canonical address).
    pub fn fault_addr(&self) -> usize {
        self.addr
    }
    /// SIGSEGV or SIGBUS.
    pub fn signal(&self) -> libc::c_int {
        self.sig
    }
    /// A saved general-purpose register, by its `libc::REG_*` index.
    ///
    /// # Panics
    /// If `r` is not a valid index (never for the `libc::REG_*` constants).
    pub fn reg(&self, r: libc::c_int) -> u64 {
        // SAFETY: `uc` is the ucontext_t the kernel passed to the handler, valid for the
        // handler's duration, which this value (created and dropped inside it) does not outlive;
        // indexing is bounds-checked.
        unsafe { (*self.uc).uc_mcontext.gregs[r as usize] as u64 }
    }
    /// Changes a saved register; the thread resumes with it.
    pub fn set_reg(&mut self, r: libc::c_int, v: u64) {
        // SAFETY: as in `reg`; the kernel restores the thread's registers from this context
        // when the handler returns, which is the point.
        unsafe { (*self.uc).uc_mcontext.gregs[r as usize] = v as i64 }
    }
}

/// Claims a free slot and fills it in; `None` when the table is full.
fn claim(start: usize, end: usize, fixup: usize, data: usize, dynamic: bool) -> Option<RangeId> {
    for (i, s) in SLOTS.iter().enumerate() {
        if s.claimed.compare_exchange(false, true, AcqRel, Relaxed).is_ok() {
            HIGH.fetch_max(i + 1, AcqRel);
            write_slot(s, start, end, fixup, data, dynamic);
            return Some(RangeId(i));
        }
    }
    None
}

/// Seqlock write; only the slot's owner calls it.
fn write_slot(s: &Slot, start: usize, end: usize, fixup: usize, data: usize, dynamic: bool) {
    let seq = s.seq.load(Relaxed);
    s.seq.store(seq.wrapping_add(1), Relaxed);
    fence(Release);
    s.start.store(start, Relaxed);
    s.end.store(end, Relaxed);
    s.fixup.store(fixup, Relaxed);
    s.data.store(data, Relaxed);
    s.dynamic.store(dynamic, Relaxed);
    s.seq.store(seq.wrapping_add(2), Release);
}

/// Registers `[start, end)` as code whose faults resume at `fixup`. Returns false when the
/// table is full.
pub fn add_range(start: usize, end: usize, fixup: usize) -> bool {
    install();
    claim(start, end, fixup, 0, false).is_some()
}

/// Registers `[start, end)` as code whose faults are handled by `fixup(data, ..)`, which
/// computes where to resume from the fault's context. `None` when the table is full (see
/// [`MAX_RANGES`]).
///
/// # Safety
/// `fixup` must be async-signal-safe (see [`DynamicFixup`]) and may rely on `data` only until
/// [`remove`] returns for this range; the caller keeps whatever `data` names valid until then.
/// `start` must be non-zero and below `end`.
pub unsafe fn add_dynamic_range(start: usize, end: usize, fixup: DynamicFixup, data: usize) -> Option<RangeId> {
    debug_assert!(start != 0 && start < end, "add_dynamic_range({start:#x}, {end:#x})");
    install();
    if start == 0 || start >= end {
        return None;
    }
    claim(start, end, fixup as usize, data, true)
}

/// Forgets a range. When it returns, no fault handler reads the range's fixup or data any
/// more — unless a fault inside the range itself is being handled at that moment, which the
/// owner rules out by removing the range only when its code can no longer run.
pub fn remove(id: RangeId) {
    let s = &SLOTS[id.0];
    write_slot(s, 0, 0, 0, 0, false);
    s.claimed.store(false, Release);
}

/// Forgets ranges added by [`add_range`] that start at `start`.
pub fn remove_range(start: usize) {
    if start == 0 {
        return;
    }
    let high = HIGH.load(Acquire);
    for (i, s) in SLOTS[..high].iter().enumerate() {
        if s.claimed.load(Acquire) && !s.dynamic.load(Relaxed) && s.start.load(Relaxed) == start {
            remove(RangeId(i));
        }
    }
}

/// The action for a fault at `ip`. Async-signal-safe: atomic loads only.
fn lookup(ip: usize) -> Option<Action> {
    let high = HIGH.load(Acquire).min(MAX_RANGES);
    for s in &SLOTS[..high] {
        let seq = s.seq.load(Acquire);
        if seq & 1 != 0 {
            continue;
        }
        let start = s.start.load(Relaxed);
        let end = s.end.load(Relaxed);
        let fixup = s.fixup.load(Relaxed);
        let data = s.data.load(Relaxed);
        let dynamic = s.dynamic.load(Relaxed);
        fence(Acquire);
        if s.seq.load(Relaxed) != seq || start == 0 || ip < start || ip >= end {
            continue;
        }
        return Some(if dynamic {
            // SAFETY: a dynamic slot's `fixup` was stored from a `DynamicFixup` in
            // `add_dynamic_range`, and the seqlock check shows the fields are one consistent
            // write; function pointers round-trip through usize.
            Action::Dynamic(unsafe { std::mem::transmute::<usize, DynamicFixup>(fixup) }, data)
        } else {
            Action::Resume(fixup)
        });
    }
    None
}

/// Whether a fault at `ip` would be handled by a registered range (for tests).
#[cfg(test)]
pub(crate) fn covers(ip: usize) -> bool {
    lookup(ip).is_some()
}

/// A function called (once) when a fault no range covers reaches the handler: the process
/// is about to take the previous disposition (usually to die). It must be async-signal-safe.
static FATAL_HOOK: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Sets the function told of the first fault outside every registered range (its signal and
/// address), before the previous disposition takes over: called in the signal handler, on
/// the faulting thread, so it must be async-signal-safe.
pub fn set_fatal_hook(f: extern "C" fn(libc::c_int, usize)) {
    FATAL_HOOK.store(f as usize, std::sync::atomic::Ordering::Relaxed);
}

/// Installs the fault handler (once per process). Called by the copy functions themselves;
/// call it early to keep the first probe hit free of the `sigaction` calls.
pub fn install() {
    INSTALL.call_once(|| {
        for (start, fixup) in [
            (userbpf_guard_copy as *const () as usize, userbpf_guard_copy_end as *const () as usize),
            (userbpf_guard_strcpy as *const () as usize, userbpf_guard_strcpy_end as *const () as usize),
        ] {
            // The table is empty at this point, so this cannot fail; the ids are never removed.
            let _ = claim(start, fixup, fixup, 0, false);
        }
        // SAFETY: a zeroed sigaction is valid; we fill in a handler with the SA_SIGINFO
        // signature and store the previous actions in statics written only here, inside
        // `call_once`, before the handler can run.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = handler as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_NODEFER;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(libc::SIGSEGV, &sa, (&raw mut OLD_SEGV).cast());
            libc::sigaction(libc::SIGBUS, &sa, (&raw mut OLD_BUS).cast());
        }
    });
}

extern "C" fn handler(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo_t and ucontext_t for SA_SIGINFO handlers; we
    // read the fault address and read and write the saved registers, which is how the
    // interrupted thread resumes. Everything called here is async-signal-safe.
    unsafe {
        let uc = ctx.cast::<libc::ucontext_t>();
        let rip = (*uc).uc_mcontext.gregs[libc::REG_RIP as usize] as usize;
        // A fault the kernel raised (si_code > 0) at an instruction of ours is ours to
        // recover; the same signal sent by kill(), tgkill() or sigqueue() (si_code <= 0) never
        // is, wherever the thread happened to be.
        let fault = !info.is_null() && (*info).si_code > 0;
        match if fault { lookup(rip) } else { None } {
            Some(Action::Resume(fixup)) => {
                (*uc).uc_mcontext.gregs[libc::REG_RIP as usize] = fixup as i64;
                return;
            }
            Some(Action::Dynamic(f, data)) => {
                let addr = if info.is_null() { 0 } else { (*info).si_addr() as usize };
                let mut fault = FaultContext { uc, addr, sig };
                if f(data, &mut fault) {
                    return;
                }
            }
            None => {}
        }
        // Not ours: say so (the fatal hook, once), then behave as the previous disposition
        // would.
        if fault {
            let hook = FATAL_HOOK.swap(0, std::sync::atomic::Ordering::Relaxed);
            if hook != 0 {
                let hook: extern "C" fn(libc::c_int, usize) = std::mem::transmute(hook);
                hook(sig, (*info).si_addr() as usize);
            }
        }
        let old = if sig == libc::SIGBUS {
            (&raw const OLD_BUS).cast::<libc::sigaction>()
        } else {
            (&raw const OLD_SEGV).cast::<libc::sigaction>()
        };
        let old = &*old;
        match old.sa_sigaction {
            libc::SIG_IGN => {}
            libc::SIG_DFL => {
                // Restore the default and return: the instruction faults again and the
                // process ends as it would have without us. A signal that was sent, not
                // raised by a fault, would not come again: send it once more (it stays
                // pending while this handler runs, then takes the default action).
                libc::signal(sig, libc::SIG_DFL);
                if !fault {
                    libc::syscall(libc::SYS_tgkill, libc::getpid(), libc::syscall(libc::SYS_gettid), sig);
                }
            }
            f if old.sa_flags & libc::SA_SIGINFO != 0 => {
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) = std::mem::transmute(f);
                f(sig, info, ctx);
            }
            f => {
                let f: extern "C" fn(libc::c_int) = std::mem::transmute(f);
                f(sig);
            }
        }
    }
}

/// Copies `len` bytes from `src` to `dst`; 0, or [`EFAULT_RET`] if either address faults
/// (then `dst` may be partly written).
///
/// # Safety
/// `dst` must not overlap memory Rust code holds references to, other than as plain bytes
/// the caller owns; any `src` is fine.
#[unsafe(link_section = ".text.hot.userbpf")]
pub unsafe fn copy(dst: *mut u8, src: *const u8, len: u64) -> i64 {
    install();
    // SAFETY: the routine only touches [src, src+len) and [dst, dst+len); faults there are
    // recovered by the handler installed above.
    unsafe { userbpf_guard_copy(dst, src, len) }
}

/// Copies a NUL-terminated string of at most `size` bytes (NUL included) from `src`; returns
/// the bytes written including the NUL, or [`EFAULT_RET`]. `size` must be > 0.
///
/// # Safety
/// As for [`copy`].
pub unsafe fn copy_str(dst: *mut u8, src: *const u8, size: u64) -> i64 {
    if size == 0 {
        return -(libc::EINVAL as i64);
    }
    install();
    // SAFETY: as for `copy`.
    unsafe { userbpf_guard_strcpy(dst, src, size) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_and_recovers() {
        let src = *b"hello\0world";
        let mut dst = [0xffu8; 16];
        // SAFETY: valid buffers.
        unsafe {
            assert_eq!(copy(dst.as_mut_ptr(), src.as_ptr(), 5), 0);
            assert_eq!(&dst[..5], b"hello");
            assert_eq!(copy(dst.as_mut_ptr(), 8 as *const u8, 4), EFAULT_RET);
            assert_eq!(copy(dst.as_mut_ptr(), usize::MAX as *const u8, 4), EFAULT_RET);
            assert_eq!(copy_str(dst.as_mut_ptr(), src.as_ptr(), 16), 6);
            assert_eq!(&dst[..6], b"hello\0");
            assert_eq!(copy_str(dst.as_mut_ptr(), src.as_ptr(), 3), 3);
            assert_eq!(&dst[..3], b"he\0");
            assert_eq!(copy_str(dst.as_mut_ptr(), 16 as *const u8, 3), EFAULT_RET);
            assert_eq!(copy_str(dst.as_mut_ptr(), src.as_ptr(), 0), -(libc::EINVAL as i64));
        }
    }

    #[test]
    fn copies_every_size_exactly_and_faults_at_the_last_byte() {
        let src: Vec<u8> = (0..9000u32).map(|i| (i * 7 + 3) as u8).collect();
        for len in (0..=300).chain([511, 512, 513, 4095, 4096, 4097, 8191]) {
            for off in [0usize, 1, 7] {
                let mut dst = vec![0xeeu8; len + 32];
                // SAFETY: src holds off + len bytes, dst len + 32.
                assert_eq!(unsafe { copy(dst.as_mut_ptr().add(8), src.as_ptr().add(off), len as u64) }, 0);
                assert_eq!(&dst[8..8 + len], &src[off..off + len], "len {len} off {off}");
                assert!(dst[..8].iter().chain(&dst[8 + len..]).all(|&b| b == 0xee), "len {len}: written outside");
            }
        }
        // A readable page followed by an unreadable one: a copy ending on its last byte works,
        // one byte further faults, at every size class.
        // SAFETY: a private anonymous mapping of two pages, the second made inaccessible; the
        // copies below read it only through the guard.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                8192,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            ) as *mut u8;
            assert_ne!(p as *mut libc::c_void, libc::MAP_FAILED);
            assert_eq!(libc::mprotect(p.add(4096).cast(), 4096, libc::PROT_NONE), 0);
            let mut dst = vec![0u8; 4096];
            for len in [1usize, 2, 3, 4, 7, 8, 15, 16, 17, 32, 33, 64, 65, 100, 612, 4096] {
                let end = p.add(4096);
                assert_eq!(copy(dst.as_mut_ptr(), end.sub(len), len as u64), 0, "len {len}");
                assert_eq!(copy(dst.as_mut_ptr(), end.sub(len - 1), len as u64), EFAULT_RET, "len {len}");
                assert_eq!(copy(end.sub(len - 1), dst.as_ptr(), len as u64), EFAULT_RET, "write, len {len}");
            }
            libc::munmap(p.cast(), 8192);
        }
    }

    unsafe fn never(_: usize, _: &mut FaultContext) -> bool {
        false
    }

    #[test]
    fn dynamic_ranges_come_and_go() {
        // Fake addresses in the never-mapped first page: no fault happens there.
        // SAFETY: `never` is async-signal-safe and uses no data.
        let id = unsafe { add_dynamic_range(0x100, 0x200, never, 0) }.expect("room in the table");
        assert!(covers(0x100) && covers(0x1ff));
        assert!(!covers(0xff) && !covers(0x200));
        remove(id);
        assert!(!covers(0x100));
        // SAFETY: as above.
        assert!(unsafe { add_dynamic_range(0, 0x10, never, 0) }.is_none(), "start 0 is refused");
        // SAFETY: as above.
        assert!(unsafe { add_dynamic_range(0x20, 0x20, never, 0) }.is_none(), "empty ranges are refused");
        // Slots are reused: far more registrations than the table holds.
        for k in 0..2 * MAX_RANGES {
            let start = 0x300 + 16 * (k % 8);
            // SAFETY: as above.
            let id = unsafe { add_dynamic_range(start, start + 8, never, k) }.expect("a slot");
            assert!(covers(start));
            remove(id);
        }
    }

    #[test]
    fn the_table_is_bounded() {
        install();
        // Filling the table would make other tests' JIT compiles fail: do it in a child.
        // SAFETY: fork in a test; the child only uses the lock-free table (no allocation) and
        // then _exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let mut ids: [Option<RangeId>; MAX_RANGES] = [const { None }; MAX_RANGES];
            let mut n = 0;
            // SAFETY: `never` is async-signal-safe and uses no data.
            while let Some(id) = unsafe { add_dynamic_range(0x10_0000 + n, 0x10_0001 + n, never, 0) } {
                ids[n] = Some(id);
                n += 1;
            }
            // The two copy routines and the other tests' live programs hold the rest.
            let full_ok = n > MAX_RANGES - 64 && n <= MAX_RANGES - 2 && !add_range(1, 2, 3);
            if let Some(id) = ids[7].take() {
                remove(id);
            }
            // SAFETY: as above.
            let reused = unsafe { add_dynamic_range(0x9_0000, 0x9_0010, never, 0) }.is_some_and(|id| id.0 < MAX_RANGES);
            let code =
                if full_ok && reused && covers(0x10_0000) && !covers(0x10_0007) && covers(0x9_0000) { 0 } else { 1 };
            // SAFETY: _exit is always safe to call.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "status {status:#x}");
    }

    #[test]
    fn unrelated_faults_still_kill() {
        // A child that dereferences null outside the guard must die of SIGSEGV.
        install();
        // SAFETY: fork in a test; the child only faults or exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: deliberately faulting in the child.
            unsafe { std::ptr::read_volatile(8 as *const u8) };
            // SAFETY: _exit is always safe to call.
            unsafe { libc::_exit(0) };
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGSEGV, "status {status:#x}");
    }

    #[test]
    fn sent_sigsegv_and_sigbus_still_kill() {
        // kill(SIGSEGV) / kill(SIGBUS) is not a fault: with the default disposition behind
        // the guard's handler, the process must die of it, not carry on.
        install();
        for sig in [libc::SIGSEGV, libc::SIGBUS] {
            // SAFETY: fork in a test; the child only signals itself and exits.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                // The disposition behind the guard is the default one, as in a C program (the
                // Rust test harness has its own handler, which would lose a sent signal too).
                // SAFETY: the child is single-threaded here and the handler is not running:
                // nothing reads the statics while they are written; an all-zero sigaction is
                // SIG_DFL. kill has no memory arguments; _exit is always safe to call.
                unsafe {
                    (&raw mut OLD_SEGV).cast::<libc::sigaction>().write(std::mem::zeroed());
                    (&raw mut OLD_BUS).cast::<libc::sigaction>().write(std::mem::zeroed());
                    libc::kill(libc::getpid(), sig);
                    libc::_exit(0)
                };
            }
            let mut status = 0;
            // SAFETY: waiting for our own child.
            unsafe { libc::waitpid(pid, &mut status, 0) };
            assert!(libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == sig, "signal {sig}: status {status:#x}");
        }
    }
}
