//! Raw system calls. This library defines `syscall`, `ioctl`, `mmap` and friends, so calling
//! libc's from inside it would come back here (the dynamic linker binds our own exported
//! definitions first): what is not ours goes to the kernel through these.

use std::arch::asm;

/// A system call with six arguments; returns the kernel's raw result (`-errno` on error).
///
/// # Safety
/// The arguments must be valid for system call `nr` as the kernel defines it.
#[inline]
pub unsafe fn raw6(nr: i64, a1: i64, a2: i64, a3: i64, a4: i64, a5: i64, a6: i64) -> i64 {
    let ret: i64;
    // SAFETY: the x86-64 Linux system call convention: number in rax, arguments in rdi, rsi,
    // rdx, r10, r8, r9; the kernel clobbers rcx and r11. Memory effects are the caller's
    // contract (see above).
    unsafe {
        asm!("syscall", inlateout("rax") nr => ret, in("rdi") a1, in("rsi") a2, in("rdx") a3,
             in("r10") a4, in("r8") a5, in("r9") a6, lateout("rcx") _, lateout("r11") _,
             options(nostack));
    }
    ret
}

/// `errno` of the calling thread.
pub fn set_errno(e: i32) {
    // SAFETY: __errno_location returns the calling thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// A raw result as libc's wrappers give it: `-1` with `errno` set, or the value.
pub fn libc_ret(raw: i64) -> i64 {
    if (-4095..0).contains(&raw) {
        set_errno(-raw as i32);
        -1
    } else {
        raw
    }
}
