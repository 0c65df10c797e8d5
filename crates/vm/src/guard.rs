//! Fault-tolerant memory access: copies from addresses a program hands to a helper
//! (`bpf_probe_read_user` and friends) that return `-EFAULT` on a bad address instead of
//! killing the process, the way the kernel's exception tables work.
//!
//! The copy routines are a few lines of assembly. A SIGSEGV/SIGBUS handler, installed once,
//! looks at the faulting instruction: inside one of these routines it resumes at the routine's
//! fixup, which returns `-EFAULT`; anywhere else it hands the signal to whatever handler was
//! there before (or the default action), so the process behaves as if we were not there.

use std::sync::Once;

/// The negated errno a failed copy returns.
pub const EFAULT_RET: i64 = -(libc::EFAULT as i64);

std::arch::global_asm!(
    ".pushsection .text.userbpf_guard,\"ax\",@progbits",
    ".balign 16",
    // i64 userbpf_guard_copy(void *dst, const void *src, u64 len): 0 or -EFAULT.
    ".globl userbpf_guard_copy",
    ".hidden userbpf_guard_copy",
    "userbpf_guard_copy:",
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

extern "C" {
    fn userbpf_guard_copy(dst: *mut u8, src: *const u8, len: u64) -> i64;
    fn userbpf_guard_copy_end();
    fn userbpf_guard_strcpy(dst: *mut u8, src: *const u8, size: u64) -> i64;
    fn userbpf_guard_strcpy_end();
}

/// Code ranges whose faults are recovered, and where execution resumes. More ranges (JIT
/// code) can be added by [`add_range`]; the table is fixed-size so the handler never locks.
const MAX_RANGES: usize = 64;

struct Range {
    start: std::sync::atomic::AtomicUsize,
    end: std::sync::atomic::AtomicUsize,
    fixup: std::sync::atomic::AtomicUsize,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Range = Range {
    start: std::sync::atomic::AtomicUsize::new(0),
    end: std::sync::atomic::AtomicUsize::new(0),
    fixup: std::sync::atomic::AtomicUsize::new(0),
};
static RANGES: [Range; MAX_RANGES] = [EMPTY; MAX_RANGES];

static mut OLD_SEGV: std::mem::MaybeUninit<libc::sigaction> = std::mem::MaybeUninit::zeroed();
static mut OLD_BUS: std::mem::MaybeUninit<libc::sigaction> = std::mem::MaybeUninit::zeroed();
static INSTALL: Once = Once::new();

/// Registers `[start, end)` as code whose faults resume at `fixup`. Returns false when the
/// table is full.
pub fn add_range(start: usize, end: usize, fixup: usize) -> bool {
    use std::sync::atomic::Ordering::*;
    install();
    for r in &RANGES {
        if r.start.compare_exchange(0, usize::MAX, AcqRel, Acquire).is_ok() {
            r.fixup.store(fixup, Release);
            r.end.store(end, Release);
            r.start.store(start, Release);
            return true;
        }
    }
    false
}

/// Forgets a range added by [`add_range`].
pub fn remove_range(start: usize) {
    use std::sync::atomic::Ordering::*;
    for r in &RANGES {
        if r.start.load(Acquire) == start {
            r.end.store(0, Release);
            r.start.store(0, Release);
        }
    }
}

fn lookup(ip: usize) -> Option<usize> {
    use std::sync::atomic::Ordering::*;
    RANGES.iter().find_map(|r| {
        let s = r.start.load(Acquire);
        (s != 0 && s != usize::MAX && ip >= s && ip < r.end.load(Acquire)).then(|| r.fixup.load(Acquire))
    })
}

/// Installs the fault handler (once per process). Called by the copy functions themselves;
/// call it early to keep the first probe hit free of the `sigaction` calls.
pub fn install() {
    INSTALL.call_once(|| {
        add_builtin(userbpf_guard_copy as *const () as usize, userbpf_guard_copy_end as *const () as usize);
        add_builtin(userbpf_guard_strcpy as *const () as usize, userbpf_guard_strcpy_end as *const () as usize);
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

fn add_builtin(start: usize, fixup: usize) {
    use std::sync::atomic::Ordering::*;
    for r in &RANGES {
        if r.start.compare_exchange(0, usize::MAX, AcqRel, Acquire).is_ok() {
            r.fixup.store(fixup, Release);
            r.end.store(fixup, Release);
            r.start.store(start, Release);
            return;
        }
    }
}

extern "C" fn handler(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid ucontext_t for SA_SIGINFO handlers; we only read and
    // write its saved RIP, which is how the interrupted thread resumes.
    unsafe {
        let uc = ctx.cast::<libc::ucontext_t>();
        let rip = &mut (*uc).uc_mcontext.gregs[libc::REG_RIP as usize];
        if let Some(fixup) = lookup(*rip as usize) {
            *rip = fixup as i64;
            return;
        }
        // Not ours: behave as the previous disposition would.
        let old = if sig == libc::SIGBUS { (&raw const OLD_BUS).cast::<libc::sigaction>() } else { (&raw const OLD_SEGV).cast::<libc::sigaction>() };
        let old = &*old;
        match old.sa_sigaction {
            libc::SIG_IGN => {}
            libc::SIG_DFL => {
                // Restore the default and return: the instruction faults again and the
                // process ends as it would have without us.
                libc::signal(sig, libc::SIG_DFL);
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
}
