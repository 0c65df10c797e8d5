//! System call tracepoints in a process: links of kind `tracepoint` (`func`:
//! `syscalls/sys_enter_NAME`, `syscalls/sys_exit_NAME`, `raw_syscalls/sys_enter`,
//! `raw_syscalls/sys_exit`) and `raw_tracepoint` (`func`: `sys_enter`, `sys_exit`).
//!
//! Every system call the process makes is seen through Syscall User Dispatch
//! (`userbpf_hook::sud`, turned on while a system call tracepoint is attached): libc's
//! wrappers, glibc's internal calls (`__close_nocancel`, the `openat` of `fopen`, `opendir` and
//! locale loading...), inline `syscall` instructions in the program or other libraries, the
//! dynamic loader's calls made after the agent is loaded. The programs run before and after
//! each call with its number and arguments as the kernel has them, and the call returns its
//! real result. libc's own `syscall` sites are rewritten into jumps meanwhile
//! (`userbpf_hook::rewrite`: the call costs a function call); every other call traps (a
//! `SIGSYS`). The agent's own calls (its threads, and its work on the target's
//! threads) are not seen. What remains invisible is listed in `userbpf_hook::sud` (the dynamic
//! loader's calls before the agent is loaded, a new thread's first calls before its start
//! routine, the return of `clone`s, calls answered by the vDSO as for the kernel).
//!
//! The program runs on a context laid out as the kernel lays out the tracepoint's record:
//! from `/sys/kernel/tracing/events/CAT/NAME/format` when it can be read (offsets, sizes,
//! the event id in `common_type`), else the kernel's usual layout (`__syscall_nr` at 8, the
//! arguments or `ret` as 8-byte fields from 16). `common_pid` is the thread id; the flags and
//! preempt count are 0. Raw tracepoints get `{ struct pt_regs *regs, long id }` (sys_enter)
//! or `{ regs, long ret }` (sys_exit), the registers the system call's: arguments in di, si,
//! dx, r10, r8, r9, the number in orig_ax.
//!
//! Where the kernel has no Syscall User Dispatch (before 5.11), the libc functions issuing a
//! system call (`userbpf_hook::syscalls::wrappers_of`: the function of the call's name, plus
//! `open`/`creat` for `openat`, `stat`/`lstat` for `newfstatat`, ...) get an entry probe
//! (sys_enter) or a return probe (sys_exit) instead, and libc's `syscall()` an entry probe:
//! the call's arguments are then the wrapper's, mapped as the wrapper passes them
//! (`open(p, f, m)` is `openat(AT_FDCWD, p, f, m)`), its return value the wrapper's, with
//! `-1` turned back into `-errno` (a 32-bit `-1` in eax counts as `-1` too); calls made inside
//! libc without a public wrapper, inline ones and the return of `syscall()` are not seen.

use std::ffi::c_void;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Arc, Mutex};

use userbpf_hook::syscalls::{self, ArgSrc, Wrapper};
use userbpf_hook::{HOOK_CONTINUE, ProbeKind, PtRegs, sud};
use userbpf_runtime::context::RunContext;
use userbpf_runtime::{LinkRecord, LoadedProgram};

use super::{AttachedLink, log};

#[derive(Clone, Copy, Debug, Default)]
struct Field {
    off: u16,
    size: u8,
}

/// Where the tracepoint's record puts what the program reads.
#[derive(Clone, Copy, Debug, Default)]
struct Layout {
    size: usize,
    common_type: u16,
    nr: Field,
    args: [Option<Field>; 6],
    ret: Option<Field>,
}

const MAX_RECORD: usize = 128;

#[derive(Clone, Copy)]
enum Shape {
    /// A tracepoint record.
    Record(Layout),
    /// A raw tracepoint's `u64 args[2]`.
    Raw,
}

struct Probe {
    prog: Arc<LoadedProgram>,
    cookie: u64,
    exit: bool,
    shape: Shape,
    /// The system call, or `None` for libc's `syscall()` (its number in the first argument).
    nr: Option<u32>,
    /// Only this call (libc's `syscall()` for one call's tracepoint).
    only: Option<u32>,
    args: [ArgSrc; 6],
}

/// The calling thread's id (the runtime's cache, refreshed after fork).
fn tid() -> i32 {
    userbpf_runtime::helpers::task::pid_tgid() as u32 as i32
}

fn put(buf: &mut [u8], f: Field, v: u64) {
    let (o, n) = (f.off as usize, (f.size as usize).min(8));
    if let Some(d) = buf.get_mut(o..o + n) {
        d.copy_from_slice(&v.to_le_bytes()[..n]);
    }
}

unsafe extern "C" fn on_hit(data: *mut c_void, regs: *mut PtRegs) -> u32 {
    // SAFETY: `data` is the `Probe` leaked for this probe when it was attached (never freed).
    let p = unsafe { &*(data as *const Probe) };
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: `regs` points to the hook's saved registers for this hit.
        let r = unsafe { *regs };
        let (nr, args) = match p.nr {
            Some(nr) => {
                let a = p.args.map(|s| match s {
                    ArgSrc::Arg(i) => r.arg(i as usize).unwrap_or(0),
                    ArgSrc::Const(c) => c,
                });
                (nr as u64, a)
            }
            None => {
                // syscall(nr, a0..a5): a5 is on the stack, above the return address.
                // SAFETY: at a function's entry, sp + 8 is the caller's frame (readable).
                let a5 = unsafe { *((r.sp + 8) as *const u64) };
                (r.di, [r.si, r.dx, r.cx, r.r8, r.r9, a5])
            }
        };
        if p.only.is_some_and(|o| o as u64 != nr) {
            return;
        }
        let ret = if p.exit {
            // int-returning wrappers leave the upper half of rax clear: a value with bit 31
            // set and nothing above is taken as a negative int (so a long result of 2 GiB
            // or more with a clear upper half reads as negative: a known limit).
            let v = if r.ax >> 31 == 1 { r.ax as u32 as i32 as i64 } else { r.ax as i64 };
            // SAFETY: errno of this thread; the wrapper just set it when returning -1.
            if v == -1 { -(unsafe { *libc::__errno_location() }) as i64 } else { v }
        } else {
            0
        };
        fire(p, nr, args, ret, regs);
    }));
    drop(r);
    HOOK_CONTINUE
}

/// Runs the probe's program for system call `nr` with `args` (and `ret` at exit); `regs` are
/// the registers of the hit (a wrapper's, or the system call's for raw calls).
fn fire(p: &Probe, nr: u64, args: [u64; 6], ret: i64, regs: *mut PtRegs) {
    // SAFETY: `regs` points to live registers of this hit.
    let r = unsafe { *regs };
    let mut info = RunContext { regs: regs as u64, cookie: p.cookie, ..Default::default() };
    match p.shape {
        Shape::Record(l) => {
            let mut buf = [0u8; MAX_RECORD];
            buf[0..2].copy_from_slice(&l.common_type.to_le_bytes());
            buf[4..8].copy_from_slice(&tid().to_le_bytes());
            put(&mut buf, l.nr, nr);
            if let Some(f) = l.ret {
                put(&mut buf, f, ret as u64);
            }
            for (f, v) in l.args.iter().zip(args) {
                if let Some(f) = f {
                    put(&mut buf, *f, v);
                }
            }
            let _ = p.prog.run(buf.as_mut_ptr(), l.size, info);
        }
        Shape::Raw => {
            let mut sys = r;
            sys.orig_ax = nr;
            if p.exit {
                sys.ax = ret as u64;
            } else {
                sys.ax = (-(libc::ENOSYS as i64)) as u64;
                (sys.di, sys.si, sys.dx, sys.r10, sys.r8, sys.r9) =
                    (args[0], args[1], args[2], args[3], args[4], args[5]);
            }
            info.regs = &sys as *const PtRegs as u64;
            let mut ctx = [&sys as *const PtRegs as u64, if p.exit { ret as u64 } else { nr }];
            let _ = p.prog.run(ctx.as_mut_ptr().cast(), 16, info);
        }
    }
}

/// A probe run for system calls made outside libc (`userbpf_hook::sud`).
#[derive(Clone, Copy)]
struct RawProbe {
    probe: &'static Probe,
    /// Only this call (`sys_enter_NAME`); `None`: every call (raw_syscalls, raw tracepoints).
    nr: Option<u32>,
}

/// The probes of raw system calls: a table replaced whole under `RAW_LOCK`, read without a
/// lock from the SIGSYS handler (old tables are leaked: a handler may still read one).
static RAW: AtomicPtr<Vec<RawProbe>> = AtomicPtr::new(std::ptr::null_mut());
static RAW_LOCK: Mutex<()> = Mutex::new(());

fn raw_table() -> &'static [RawProbe] {
    let p = RAW.load(Ordering::Acquire);
    // SAFETY: tables are leaked boxes, never freed.
    if p.is_null() { &[] } else { unsafe { &*p } }
}

fn raw_publish(edit: impl FnOnce(&mut Vec<RawProbe>)) {
    let _g = RAW_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let mut t = raw_table().to_vec();
    edit(&mut t);
    let empty = t.is_empty();
    // The calls each side has programs for: wanted before the new table is published (a
    // call seeing them with the older table runs what it had), and only the new table's
    // after.
    let (old_enter, old_exit) = (wants(raw_table(), false), wants(raw_table(), true));
    let (enter, exit) = (wants(&t, false), wants(&t, true));
    sud::want_callbacks(both(enter.clone(), old_enter).as_deref(), both(exit.clone(), old_exit).as_deref());
    RAW.store(Box::into_raw(Box::new(t)), Ordering::Release);
    sud::want_callbacks(enter.as_deref(), exit.as_deref());
    if empty {
        sud::disable();
    }
}

/// The system calls the table's enter (or exit) probes are for; `None`: every call.
fn wants(t: &[RawProbe], exit: bool) -> Option<Vec<u32>> {
    let mut nrs = Vec::new();
    for rp in t.iter().filter(|rp| rp.probe.exit == exit) {
        nrs.push(rp.nr?);
    }
    Some(nrs)
}

/// Both sets of calls (`None`: every call).
fn both(a: Option<Vec<u32>>, b: Option<Vec<u32>>) -> Option<Vec<u32>> {
    let (mut a, b) = (a?, b?);
    a.extend(b);
    Some(a)
}

fn raw_run(regs: &PtRegs, exit: bool) {
    let table = raw_table();
    if table.is_empty() {
        return;
    }
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let nr = regs.orig_ax;
        let args = [regs.di, regs.si, regs.dx, regs.r10, regs.r8, regs.r9];
        let mut copy = *regs;
        for rp in table {
            if rp.probe.exit == exit && rp.nr.is_none_or(|n| n as u64 == nr) {
                fire(rp.probe, nr, args, regs.ax as i64, &mut copy);
            }
        }
    }));
}

fn raw_enter(regs: &PtRegs) {
    raw_run(regs, false);
}

fn raw_exit(regs: &PtRegs) {
    raw_run(regs, true);
}

/// The return of the `execve` that made this process image, run by the image's constructor
/// once the session's links are attached: the kernel reports it in the new image (`ret` 0,
/// the new name), and the previous image's agent, whose call never returned, could not. (The
/// number is `execve`'s: an image made by `execveat` reports it as `execve`.)
pub fn exec_returned() {
    // Once an image: the syscall server's library, acting as the agent, calls it from both its
    // constructors.
    static DONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if raw_table().is_empty() || DONE.swap(true, Ordering::SeqCst) {
        return;
    }
    let regs = PtRegs { orig_ax: libc::SYS_execve as u64, ax: 0, ..Default::default() };
    raw_run(&regs, true);
}

/// An exec in a `vfork` child (see `sud::set_vfork_exec_callback`): the programs run with the
/// child's pid as its pid and tid (the runtime's cache is the parent's, whose thread block the
/// child shares; restored after the run).
fn vfork_exec(regs: &PtRegs, exit: bool) {
    // SAFETY: getpid has no preconditions; made in the child, it gives the child's pid.
    let pid = unsafe { libc::getpid() } as u32 as u64;
    userbpf_runtime::helpers::task::with_pid_tgid(pid << 32 | pid, || raw_run(regs, exit));
}

/// Removes probes added by `attach` (addresses of their leaked `Probe`s) from the table.
pub fn raw_remove(probes: &[usize]) {
    if !probes.is_empty() {
        raw_publish(|t| t.retain(|rp| !probes.contains(&(rp.probe as *const Probe as usize))));
    }
}

/// Adds a probe for raw system calls and turns dispatch on; `Err` when it cannot be.
fn raw_add(rp: RawProbe) -> Result<(), String> {
    static CALLBACKS: std::sync::Once = std::sync::Once::new();
    CALLBACKS.call_once(|| {
        sud::set_callbacks(raw_enter, raw_exit);
        sud::set_vfork_exec_callback(vfork_exec);
    });
    sud::enable()?;
    if let Some(e) = sud::rewrite_error() {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| log(&format!("libc's system call sites are not rewritten (each call costs a SIGSYS): {e}")));
    }
    raw_publish(|t| t.push(rp));
    Ok(())
}

/// Parses a tracefs `format` file.
fn parse_format(text: &str) -> Option<Layout> {
    let mut l = Layout::default();
    let mut nargs = 0;
    for line in text.lines() {
        let line = line.trim();
        if let Some(id) = line.strip_prefix("ID:") {
            l.common_type = id.trim().parse().ok()?;
            continue;
        }
        let Some(rest) = line.strip_prefix("field:") else { continue };
        let mut decl = "";
        let (mut off, mut size) = (None, None);
        for part in rest.split(';') {
            let part = part.trim();
            if let Some(v) = part.strip_prefix("offset:") {
                off = v.parse::<u16>().ok();
            } else if let Some(v) = part.strip_prefix("size:") {
                size = v.parse::<u16>().ok();
            } else if decl.is_empty() {
                decl = part;
            }
        }
        let (off, size) = (off?, size?);
        l.size = l.size.max(off as usize + size as usize);
        let name = decl.rsplit([' ', '*']).next().unwrap_or("");
        let name = name.split('[').next().unwrap_or(name);
        let f = Field { off, size: size.min(8) as u8 };
        match name {
            n if n.starts_with("common_") => {}
            "__syscall_nr" | "id" => l.nr = f,
            "ret" => l.ret = Some(f),
            "args" => {
                // unsigned long args[6]
                for i in 0..6 {
                    l.args[i] = Some(Field { off: off + 8 * i as u16, size: 8 });
                }
            }
            _ if nargs < 6 => {
                l.args[nargs] = Some(f);
                nargs += 1;
            }
            _ => {}
        }
    }
    (l.size > 0 && l.size <= MAX_RECORD).then_some(l)
}

/// The record of `cat/name` from tracefs, or the kernel's usual one.
fn layout(cat: &str, name: &str, exit: bool) -> Layout {
    for root in ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"] {
        if let Ok(t) = std::fs::read_to_string(format!("{root}/events/{cat}/{name}/format"))
            && let Some(l) = parse_format(&t)
        {
            return l;
        }
    }
    let raw = cat == "raw_syscalls";
    let nr = Field { off: 8, size: if raw { 8 } else { 4 } };
    if exit {
        Layout { size: 24, common_type: 0, nr, args: [None; 6], ret: Some(Field { off: 16, size: 8 }) }
    } else {
        Layout {
            size: 64,
            common_type: 0,
            nr,
            args: std::array::from_fn(|i| Some(Field { off: 16 + 8 * i as u16, size: 8 })),
            ret: None,
        }
    }
}

/// Attaches a system call tracepoint or raw tracepoint link.
pub fn attach(link: &LinkRecord, prog: Arc<LoadedProgram>) -> Result<AttachedLink, String> {
    let what = link.func.as_deref().unwrap_or("");
    let (shape_of, exit, call): (Option<(&str, &str)>, bool, Option<&str>) = match (
        link.kind.as_str(),
        what.split_once('/'),
    ) {
        ("raw_tracepoint", _) if what == "sys_enter" || what == "sys_exit" => (None, what == "sys_exit", None),
        ("tracepoint", Some(("raw_syscalls", n))) if n == "sys_enter" || n == "sys_exit" => {
            (Some(("raw_syscalls", n)), n == "sys_exit", None)
        }
        ("tracepoint", Some(("syscalls", n))) => match (n.strip_prefix("sys_enter_"), n.strip_prefix("sys_exit_")) {
            (Some(c), _) => (Some(("syscalls", n)), false, Some(c)),
            (_, Some(c)) => (Some(("syscalls", n)), true, Some(c)),
            _ => return Err(format!("`{what}` is not a system call tracepoint (sys_enter_NAME or sys_exit_NAME)")),
        },
        _ => {
            return Err(format!(
                "{} `{what}`: only system call tracepoints (syscalls/sys_enter_NAME, syscalls/sys_exit_NAME, raw_syscalls/sys_enter, raw_syscalls/sys_exit) can be attached in a process",
                link.kind
            ));
        }
    };
    let shape = match shape_of {
        Some((cat, name)) => Shape::Record(layout(cat, name, exit)),
        None => Shape::Raw,
    };
    let only = match call {
        Some(c) => Some(syscalls::number(c).ok_or(format!("no x86-64 system call `{c}`"))?),
        None => None,
    };
    // Every system call, through dispatch.
    let probe: &'static Probe = Box::leak(userbpf_arena::scope(|| {
        Box::new(Probe {
            prog: prog.clone(),
            cookie: link.cookie,
            exit,
            shape,
            nr: None,
            only: None,
            args: [ArgSrc::Const(0); 6],
        })
    }));
    let dispatch_err = match raw_add(RawProbe { probe, nr: only }) {
        Ok(()) => return Ok(AttachedLink { raw: vec![probe as *const Probe as usize], ..Default::default() }),
        Err(e) => e,
    };
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| log(&format!("system calls are traced at libc's wrappers only (glibc's internal calls and inline `syscall` instructions are not seen): {dispatch_err}")));
    let wrappers: Vec<Wrapper> = match call {
        Some(c) => {
            let w = syscalls::wrappers_of(c);
            if w.is_empty() {
                return Err(format!(
                    "system call `{c}` has no libc wrapper that userbpf hooks (its libc function is not a plain wrapper, or it has none), and system call dispatch is not available: {dispatch_err}"
                ));
            }
            w
        }
        None => syscalls::all_wrappers(),
    };
    let (libc_path, funcs) = syscalls::libc_functions()?;
    let mut done = AttachedLink::default();
    let mut seen = std::collections::HashSet::new();
    let mut refused = Vec::new();
    let mut sites: Vec<(&str, Option<u32>, [ArgSrc; 6])> =
        wrappers.iter().map(|w| (w.func, syscalls::number(w.syscall), w.args)).filter(|s| s.1.is_some()).collect();
    if !exit {
        sites.push(("syscall", None, [ArgSrc::Const(0); 6]));
    }
    for (func, nr, args) in sites {
        let Some(f) = funcs.get(func) else { continue };
        if !seen.insert(f.addr) {
            continue;
        }
        let probe = Box::into_raw(Box::new(Probe {
            prog: prog.clone(),
            cookie: link.cookie,
            exit,
            shape,
            nr,
            only: if nr.is_none() { only } else { None },
            args,
        }));
        let kind = if exit { ProbeKind::Return } else { ProbeKind::Entry };
        let ext = Some(userbpf_hook::FuncExtent { start: f.addr, len: f.size });
        match userbpf_hook::attach_with(f.addr, kind, on_hit, probe.cast(), ext) {
            Ok(id) => done.probes.push(id),
            Err(e) => refused.push(format!("{func} ({e})")),
        }
    }
    if done.probes.is_empty() {
        return Err(format!(
            "no libc function of `{what}` could be hooked in {}{}",
            libc_path.display(),
            if refused.is_empty() { String::new() } else { format!(": {}", refused.join(", ")) }
        ));
    }
    if !refused.is_empty() {
        log(&format!("link {} ({what}): {} libc functions not hooked: {}", link.id, refused.len(), refused.join(", ")));
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_are_read_as_the_kernel_writes_them() {
        let f = "name: sys_enter_openat\nID: 782\nformat:\n\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n\tfield:int __syscall_nr;\toffset:8;\tsize:4;\tsigned:1;\n\tfield:int dfd;\toffset:16;\tsize:8;\tsigned:0;\n\tfield:const char * filename;\toffset:24;\tsize:8;\tsigned:0;\n\tfield:int flags;\toffset:32;\tsize:8;\tsigned:0;\n\tfield:umode_t mode;\toffset:40;\tsize:8;\tsigned:0;\n";
        let l = parse_format(f).unwrap();
        assert_eq!((l.size, l.common_type, l.nr.off, l.nr.size), (48, 782, 8, 4));
        assert_eq!(l.args.iter().flatten().map(|f| f.off).collect::<Vec<_>>(), [16, 24, 32, 40]);
        let raw = "ID: 21\nformat:\n\tfield:long id;\toffset:8;\tsize:8;\tsigned:1;\n\tfield:unsigned long args[6];\toffset:16;\tsize:48;\tsigned:0;\n";
        let l = parse_format(raw).unwrap();
        assert_eq!((l.size, l.nr.size, l.args[5].unwrap().off), (64, 8, 56));
        let exit = "ID: 20\nformat:\n\tfield:long id;\toffset:8;\tsize:8;\tsigned:1;\n\tfield:long ret;\toffset:16;\tsize:8;\tsigned:1;\n";
        assert_eq!(parse_format(exit).unwrap().ret.unwrap().off, 16);
    }
}
