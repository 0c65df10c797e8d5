//! Names for the code userbpf makes inside a process, for profilers: with
//! `USERBPF_PERF_MAP=1` in the process's environment, every stub page, site stub, relocated
//! copy and JIT'd program gets a line `START SIZE NAME` (hex, as perf's JIT interface reads
//! `/tmp/perf-PID.map`), so `perf report` and `perf annotate` name samples there
//! (`userbpf_site_stub@0x401126`, `bpf_prog_count_entry`) instead of `//anon` addresses.
//!
//! Written when code is made (attach and load time, never on a hit): the file is opened,
//! appended to and closed for each line, so no descriptor stays open in the target. The name
//! uses the writing process's pid: a forked child's inherited code stays named in its parent's
//! file. The first line a process image writes empties the file (left by an earlier process
//! with the same pid, or by this one before an `exec`). Off by default, as for other JIT runtimes (perf reads the file of any process whose
//! samples fall in anonymous memory, so writing it unasked would leave files behind).

use std::io::Write;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether `USERBPF_PERF_MAP` asks for the map (read once).
pub fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("USERBPF_PERF_MAP").is_some_and(|v| !v.is_empty() && v != "0"))
}

/// The map file of the calling process.
pub fn path() -> String {
    format!("/tmp/perf-{}.map", std::process::id())
}

/// Names `len` bytes of code at `start` (no-op unless [`enabled`]). Failures to write are
/// ignored: names are a convenience and the code runs the same without them.
pub fn note(start: usize, len: usize, name: &str) {
    if !enabled() || len == 0 {
        return;
    }
    // One write per line (O_APPEND): lines from several threads never interleave. The
    // first line of this process image starts the file afresh (a file left by an earlier
    // process with the same pid, or by this one before an exec, names code that is gone).
    static STARTED: AtomicBool = AtomicBool::new(false);
    let fresh = !STARTED.swap(true, Ordering::SeqCst);
    let line = format!("{start:x} {len:x} {}\n", name.replace('\n', " "));
    let file = std::fs::OpenOptions::new().append(true).create(true).truncate(false).open(path());
    if fresh && let Ok(f) = &file {
        let _ = f.set_len(0);
    }
    if let Ok(mut f) = file {
        let _ = f.write_all(line.as_bytes());
    }
}
