//! `mmap` of our descriptors with the kernel's layouts: perf event rings, ring buffer maps,
//! `BPF_F_MMAPABLE` arrays.

use std::ffi::c_void;

/// Serves `mmap` when `fd` is ours; `None`: not ours, the kernel's.
pub fn mmap(addr: *mut c_void, len: usize, prot: i32, flags: i32, fd: i32, off: i64) -> Option<Result<*mut c_void, i32>> {
    let _ = (addr, len, prot, flags, fd, off);
    None
}

/// Forgets what was mapped in `[addr, addr + len)` (the kernel does the unmapping).
pub fn munmap(addr: *mut c_void, len: usize) {
    let _ = (addr, len);
}
