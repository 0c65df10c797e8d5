//! `bpf(2)` served from the userspace runtime.

/// Serves `bpf(cmd, attr, size)`: the call's return value, or an errno.
pub fn bpf(cmd: i32, attr: *mut u8, size: u32) -> Result<i64, i32> {
    let _ = (cmd, attr, size);
    Err(libc::ENOSYS)
}
