//! `perf_event_open(2)` for the uprobe PMU, syscall tracepoints and the BPF output software
//! event, and the ioctls on those events.

/// Serves `perf_event_open(attr, pid, cpu, group_fd, flags)`.
pub fn perf_event_open(attr: *const u8, pid: i32, cpu: i32, group_fd: i32, flags: libc::c_ulong) -> Result<i64, i32> {
    let _ = (attr, pid, cpu, group_fd, flags);
    Err(libc::ENOSYS)
}

/// Serves `ioctl(fd, req, arg)` when `fd` is one of our perf events (or programs, links);
/// `None`: not ours, the kernel's.
pub fn ioctl(fd: i32, req: libc::c_ulong, arg: libc::c_ulong) -> Option<Result<i64, i32>> {
    let _ = (fd, req, arg);
    None
}
