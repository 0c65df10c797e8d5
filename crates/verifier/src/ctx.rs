//! Program types and their context: what a program may read or write through `r1`, as the
//! kernel's `is_valid_access` callbacks for each type.

/// The kernel program type a program is verified as.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ProgType {
    /// `BPF_PROG_TYPE_KPROBE`: uprobes, uretprobes and USDT probes. The context is a
    /// read-only `struct pt_regs` (168 bytes on x86-64).
    Kprobe,
    /// `BPF_PROG_TYPE_TRACEPOINT`: the context is the tracepoint's record; the kernel allows
    /// reads from offset 8 (after the common fields) up to 2048 at load time and checks the
    /// furthest read against the record size at attach time. `record_size`, when known,
    /// makes the verifier check it at load time.
    Tracepoint { record_size: Option<u32> },
    /// `BPF_PROG_TYPE_RAW_TRACEPOINT`: the context is an array of up to 12 u64 arguments;
    /// `args`, when known, bounds it at load time (the kernel checks at attach time).
    RawTracepoint { args: Option<u32> },
    /// `BPF_PROG_TYPE_PERF_EVENT` (bpftrace's `interval`, `profile`): the context is a
    /// read-only `struct bpf_perf_event_data` (`pt_regs`, then `sample_period` and `addr`).
    PerfEvent,
    /// `BPF_PROG_TYPE_SYSCALL`: the context is a caller-given buffer, read and written at
    /// any aligned offset below 65535 (its size is checked when the program runs).
    Syscall,
    /// `BPF_PROG_TYPE_SOCKET_FILTER` (loaders' feature probes): userbpf gives these no
    /// packet, so the context may only be passed to helpers, not read.
    SocketFilter,
}

/// `sizeof(struct pt_regs)` on x86-64.
pub const PT_REGS_SIZE: i64 = 168;
/// The kernel's `PERF_MAX_TRACE_SIZE`.
pub const PERF_MAX_TRACE_SIZE: i64 = 2048;
/// The kernel's `MAX_BPF_FUNC_ARGS`.
pub const MAX_FUNC_ARGS: i64 = 12;

impl ProgType {
    /// The kernel's name (`kprobe`, `tracepoint`, `raw_tracepoint`).
    pub fn name(self) -> &'static str {
        match self {
            ProgType::Kprobe => "kprobe",
            ProgType::Tracepoint { .. } => "tracepoint",
            ProgType::RawTracepoint { .. } => "raw_tracepoint",
            ProgType::PerfEvent => "perf_event",
            ProgType::Syscall => "syscall",
            ProgType::SocketFilter => "socket_filter",
        }
    }

    /// Whether an access of `size` bytes at offset `off` of the context is allowed.
    pub fn ctx_access_ok(self, off: i64, size: i64, write: bool) -> bool {
        if self == ProgType::Syscall {
            return off >= 0 && off % size == 0 && off + size <= u16::MAX as i64;
        }
        if write || off < 0 || off % size != 0 {
            return false;
        }
        match self {
            ProgType::Syscall | ProgType::SocketFilter => false,
            // The registers are read as whole longs; sample_period and addr narrowly too.
            ProgType::PerfEvent => off + size <= PT_REGS_SIZE + 16 && (size == 8 || off >= PT_REGS_SIZE),
            ProgType::Kprobe => off + size <= PT_REGS_SIZE,
            ProgType::Tracepoint { record_size } => {
                let end = record_size.map_or(PERF_MAX_TRACE_SIZE, |s| (s as i64).min(PERF_MAX_TRACE_SIZE));
                off >= 8 && off + size <= end
            }
            ProgType::RawTracepoint { args } => {
                let n = args.map_or(MAX_FUNC_ARGS, |a| (a as i64).min(MAX_FUNC_ARGS));
                off + size <= n * 8
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts() {
        let k = ProgType::Kprobe;
        assert!(k.ctx_access_ok(0, 8, false));
        assert!(k.ctx_access_ok(160, 8, false));
        assert!(!k.ctx_access_ok(168, 8, false));
        assert!(!k.ctx_access_ok(164, 8, false));
        assert!(!k.ctx_access_ok(4, 8, false));
        assert!(!k.ctx_access_ok(0, 8, true));
        let tp = ProgType::Tracepoint { record_size: None };
        assert!(!tp.ctx_access_ok(0, 8, false));
        assert!(tp.ctx_access_ok(8, 8, false));
        assert!(tp.ctx_access_ok(2040, 8, false));
        assert!(!tp.ctx_access_ok(2048, 8, false));
        let tp = ProgType::Tracepoint { record_size: Some(24) };
        assert!(tp.ctx_access_ok(16, 8, false));
        assert!(!tp.ctx_access_ok(24, 8, false));
        let pe = ProgType::PerfEvent;
        assert!(pe.ctx_access_ok(176, 8, false));
        assert!(pe.ctx_access_ok(168, 4, false));
        assert!(!pe.ctx_access_ok(0, 4, false));
        assert!(!pe.ctx_access_ok(184, 8, false));
        assert!(ProgType::Syscall.ctx_access_ok(8, 8, true));
        assert!(!ProgType::SocketFilter.ctx_access_ok(0, 4, false));
        let raw = ProgType::RawTracepoint { args: None };
        assert!(raw.ctx_access_ok(88, 8, false));
        assert!(!raw.ctx_access_ok(96, 8, false));
    }
}
