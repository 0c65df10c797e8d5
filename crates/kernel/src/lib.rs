//! The kernel half of an object: the programs only the kernel can run (tracepoints other than
//! the system call ones a process handles, raw and BTF tracepoints, kprobes, fentry, perf
//! events, ...) loaded and attached by libbpf itself (the system's `libbpf.so.1`), so the
//! kernel sees exactly what libbpf would give it for the same object: CO-RE against the
//! running kernel's BTF, the object's BTF and line info, `expected_attach_type`, kconfig.
//!
//! [`KernelObject::load`] opens the object with libbpf, turns autoload off for every program
//! the caller runs elsewhere (user space) and auto-creation off for every map no kernel program
//! uses, adds `BPF_F_MMAPABLE` to the arrays the caller shares with user space, and loads. A
//! program the kernel refuses gives the kernel verifier's log (libbpf asks for it on failure)
//! with libbpf's own warnings, never a crash. [`KernelObject::attach`] attaches every loaded
//! program as libbpf's auto-attach does (from its section name); the kernel's refusal (no
//! kprobe PMU on this kernel, fentry under lockdown) is passed on with libbpf's message.
//!
//! Maps are matched to the caller's by name: BTF and legacy maps by their name, libbpf's
//! internal maps (`OBJ.bss`, `OBJ.data.x`, `OBJ.rodata`, `OBJ.kconfig`: libbpf truncates the
//! object part to 8 bytes) by the part from the first `.`.
//!
//! [`sys`] holds the raw `bpf()` calls the caller needs for kernel maps (ids, lookups,
//! iteration).

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::path::Path;
use std::sync::Mutex;

pub mod sys;

#[repr(C)]
struct BpfObject {
    _p: [u8; 0],
}
#[repr(C)]
struct BpfProgram {
    _p: [u8; 0],
}
#[repr(C)]
struct BpfMap {
    _p: [u8; 0],
}
#[repr(C)]
struct BpfLink {
    _p: [u8; 0],
}

type PrintFn = unsafe extern "C" fn(c_int, *const c_char, *mut c_void) -> c_int;

#[link(name = "bpf")]
unsafe extern "C" {
    fn bpf_object__open_file(path: *const c_char, opts: *const c_void) -> *mut BpfObject;
    fn bpf_object__load(obj: *mut BpfObject) -> c_int;
    fn bpf_object__close(obj: *mut BpfObject);
    fn bpf_object__next_program(obj: *const BpfObject, prog: *mut BpfProgram) -> *mut BpfProgram;
    fn bpf_object__next_map(obj: *const BpfObject, map: *const BpfMap) -> *mut BpfMap;
    fn bpf_program__name(prog: *const BpfProgram) -> *const c_char;
    fn bpf_program__section_name(prog: *const BpfProgram) -> *const c_char;
    fn bpf_program__set_autoload(prog: *mut BpfProgram, autoload: bool) -> c_int;
    fn bpf_program__autoload(prog: *const BpfProgram) -> bool;
    fn bpf_program__set_log_buf(prog: *mut BpfProgram, buf: *mut c_char, size: usize) -> c_int;
    fn bpf_program__fd(prog: *const BpfProgram) -> c_int;
    fn bpf_program__attach(prog: *const BpfProgram) -> *mut BpfLink;
    fn bpf_link__destroy(link: *mut BpfLink) -> c_int;
    fn bpf_map__name(map: *const BpfMap) -> *const c_char;
    fn bpf_map__set_autocreate(map: *mut BpfMap, autocreate: bool) -> c_int;
    fn bpf_map__map_flags(map: *const BpfMap) -> u32;
    fn bpf_map__set_map_flags(map: *mut BpfMap, flags: u32) -> c_int;
    fn bpf_map__fd(map: *const BpfMap) -> c_int;
    fn libbpf_set_print(f: Option<PrintFn>) -> Option<PrintFn>;
}

unsafe extern "C" {
    /// glibc's; `ap` is a `va_list`, which the x86-64 ABI passes as a pointer.
    fn vsnprintf(buf: *mut c_char, n: usize, fmt: *const c_char, ap: *mut c_void) -> c_int;
}

/// `BPF_F_MMAPABLE`.
pub const BPF_F_MMAPABLE: u32 = 1 << 10;

/// Bytes of each program's verifier log buffer (the kernel's log of a refused program).
const LOG_SIZE: usize = 1 << 20;

/// libbpf's warnings since the last [`take_warnings`] (its print callback is process-wide).
static WARNINGS: Mutex<String> = Mutex::new(String::new());

/// libbpf's print callback: keeps warnings (level 0), drops info and debug lines.
unsafe extern "C" fn on_print(level: c_int, fmt: *const c_char, ap: *mut c_void) -> c_int {
    let r = std::panic::catch_unwind(|| {
        if level != 0 {
            return;
        }
        let mut buf = [0u8; 4096];
        // SAFETY: `buf` is writable for its length; `fmt` and `ap` are libbpf's format and
        // argument list for this call, used once.
        let n = unsafe { vsnprintf(buf.as_mut_ptr().cast(), buf.len(), fmt, ap) };
        if n <= 0 {
            return;
        }
        let len = (n as usize).min(buf.len() - 1);
        if let Ok(mut w) = WARNINGS.lock() {
            w.push_str(&String::from_utf8_lossy(&buf[..len]));
        }
    });
    let _ = r;
    0
}

fn take_warnings() -> String {
    WARNINGS.lock().map(|mut w| std::mem::take(&mut *w)).unwrap_or_default()
}

fn cstr(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: libbpf returns NUL-terminated names that live as long as the object.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// Whether libbpf's map name `kernel` is the caller's map `ours` (see the crate docs).
pub fn same_map_name(ours: &str, kernel: &str) -> bool {
    if ours == kernel {
        return true;
    }
    match (ours.find('.'), kernel.find('.')) {
        (Some(a), Some(b)) => ours[a..] == kernel[b..],
        _ => false,
    }
}

/// What to load.
pub struct LoadSpec<'a> {
    /// The object file.
    pub path: &'a Path,
    /// Programs (function names) to load into the kernel; every other program stays out.
    pub programs: &'a [String],
    /// Maps (the caller's names) the kernel programs use: created; every other map is not.
    pub maps: &'a [String],
    /// Of those, arrays shared with user space: created `BPF_F_MMAPABLE`.
    pub mmapable: &'a [String],
}

/// Why the kernel half could not be loaded or attached.
#[derive(Debug)]
pub struct KernelError {
    /// The program at fault, if one.
    pub program: Option<String>,
    pub message: String,
}

impl std::fmt::Display for KernelError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.program {
            Some(p) => write!(f, "kernel program `{p}`: {}", self.message),
            None => write!(f, "{}", self.message),
        }
    }
}

impl std::error::Error for KernelError {}

/// An object's kernel half, loaded (and, after [`KernelObject::attach`], attached). Dropping
/// it detaches and unloads everything.
pub struct KernelObject {
    obj: *mut BpfObject,
    links: Vec<*mut BpfLink>,
    /// Kernel programs, by name, with their section.
    programs: Vec<(String, String)>,
    /// Log buffers handed to libbpf: they must outlive the load.
    _logs: Vec<Vec<u8>>,
}

// SAFETY: the libbpf object and links are used only through `&mut self` or read-only
// accessors that libbpf allows from any thread; nothing is tied to the creating thread.
unsafe impl Send for KernelObject {}

impl KernelObject {
    /// Loads `spec.programs` of `spec.path` into the kernel (see the crate docs).
    pub fn load(spec: &LoadSpec<'_>) -> Result<KernelObject, KernelError> {
        let err = |program: Option<String>, message: String| KernelError { program, message };
        // SAFETY: `on_print` matches libbpf_print_fn_t on x86-64 (va_list as a pointer).
        unsafe { libbpf_set_print(Some(on_print)) };
        let _ = take_warnings();
        let path = CString::new(spec.path.as_os_str().as_encoded_bytes())
            .map_err(|_| err(None, format!("{}: path holds a NUL byte", spec.path.display())))?;
        // SAFETY: `path` is a NUL-terminated string; no options (NULL).
        let obj = unsafe { bpf_object__open_file(path.as_ptr(), std::ptr::null()) };
        if obj.is_null() {
            let e = std::io::Error::last_os_error();
            return Err(err(None, format!("libbpf cannot open {}: {e}\n{}", spec.path.display(), take_warnings())));
        }
        let mut this = KernelObject { obj, links: Vec::new(), programs: Vec::new(), _logs: Vec::new() };
        let mut found = Vec::new();
        for (prog, name) in this.all_programs() {
            let load = spec.programs.contains(&name);
            // SAFETY: `prog` is a program of the open object.
            unsafe { bpf_program__set_autoload(prog, load) };
            if load {
                let mut log = vec![0u8; LOG_SIZE];
                // SAFETY: the buffer is writable for LOG_SIZE bytes and kept in `_logs`
                // (a Vec's heap buffer does not move) for the object's life.
                unsafe { bpf_program__set_log_buf(prog, log.as_mut_ptr().cast(), LOG_SIZE) };
                this._logs.push(log);
                // SAFETY: as above.
                let section = cstr(unsafe { bpf_program__section_name(prog) });
                this.programs.push((name.clone(), section));
                found.push(name);
            }
        }
        if let Some(missing) = spec.programs.iter().find(|p| !found.contains(p)) {
            return Err(err(Some(missing.clone()), "libbpf does not see this program in the object".into()));
        }
        for (map, name) in this.all_maps() {
            let ours = spec.maps.iter().find(|m| same_map_name(m, &name));
            // SAFETY: `map` is a map of the open object, not yet created.
            unsafe { bpf_map__set_autocreate(map, ours.is_some()) };
            if ours.is_some_and(|o| spec.mmapable.contains(o)) {
                // SAFETY: as above.
                unsafe { bpf_map__set_map_flags(map, bpf_map__map_flags(map) | BPF_F_MMAPABLE) };
            }
        }
        // SAFETY: the object is open and configured.
        let r = unsafe { bpf_object__load(this.obj) };
        if r < 0 {
            let warnings = take_warnings();
            // The refused program is the one whose log the kernel filled.
            let mut refused = None;
            for (i, (name, section)) in this.programs.iter().enumerate() {
                let log = &this._logs[i];
                let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
                if end > 0 {
                    refused = Some((name.clone(), section.clone(), String::from_utf8_lossy(&log[..end]).into_owned()));
                    break;
                }
            }
            let errno = std::io::Error::from_raw_os_error(-r);
            return Err(match refused {
                Some((name, section, log)) => err(
                    Some(name),
                    format!(
                        "(section {section}) the kernel refused it ({errno}); the kernel verifier's log:\n{}{}",
                        log.trim_end_matches('\n'),
                        if warnings.is_empty() { String::new() } else { format!("\nlibbpf:\n{}", warnings.trim_end()) }
                    ),
                ),
                // Refused before the verifier ran (no log): libbpf's warnings name the program.
                None => {
                    let prog = warnings
                        .split("prog '")
                        .nth(1)
                        .and_then(|r| r.split_once('\''))
                        .map(|(n, _)| n.to_string())
                        .filter(|n| this.programs.iter().any(|(p, _)| p == n));
                    let section = prog
                        .as_ref()
                        .and_then(|n| this.programs.iter().find(|(p, _)| p == n))
                        .map(|(_, s)| format!("(section {s}) "))
                        .unwrap_or_default();
                    err(
                        prog,
                        format!(
                            "{section}the kernel refused to load it ({errno}), before its verifier ran\nlibbpf:\n{}",
                            warnings.trim_end()
                        ),
                    )
                }
            });
        }
        Ok(this)
    }

    fn all_programs(&self) -> Vec<(*mut BpfProgram, String)> {
        let mut v = Vec::new();
        let mut p = std::ptr::null_mut();
        loop {
            // SAFETY: the object is open; `p` is null or its previous program.
            p = unsafe { bpf_object__next_program(self.obj, p) };
            if p.is_null() {
                return v;
            }
            // SAFETY: a program of the object.
            v.push((p, cstr(unsafe { bpf_program__name(p) })));
        }
    }

    fn all_maps(&self) -> Vec<(*mut BpfMap, String)> {
        let mut v = Vec::new();
        let mut m: *mut BpfMap = std::ptr::null_mut();
        loop {
            // SAFETY: the object is open; `m` is null or its previous map.
            m = unsafe { bpf_object__next_map(self.obj, m) };
            if m.is_null() {
                return v;
            }
            // SAFETY: a map of the object.
            v.push((m, cstr(unsafe { bpf_map__name(m) })));
        }
    }

    /// Attaches every kernel program as libbpf's auto-attach does. Stops at the first refusal.
    /// A program libbpf cannot attach by itself (`perf_event`, bare `kprobe`, `xdp`, ...:
    /// `EOPNOTSUPP`) stays loaded and unattached, as a skeleton's attach leaves it; the
    /// returned notes say which.
    pub fn attach(&mut self) -> Result<Vec<String>, KernelError> {
        let mut notes = Vec::new();
        let _ = take_warnings();
        for (prog, name) in self.all_programs() {
            // SAFETY: a program of the loaded object.
            if !unsafe { bpf_program__autoload(prog) } {
                continue;
            }
            // SAFETY: a loaded program.
            let link = unsafe { bpf_program__attach(prog) };
            if link.is_null() {
                let e = std::io::Error::last_os_error();
                let section =
                    self.programs.iter().find(|(n, _)| *n == name).map(|(_, s)| s.clone()).unwrap_or_default();
                let w = take_warnings();
                if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
                    notes.push(format!(
                        "kernel program `{name}` (section {section}) is loaded, not attached: libbpf cannot attach this section by itself"
                    ));
                    continue;
                }
                return Err(KernelError {
                    program: Some(name),
                    message: format!(
                        "(section {section}) the kernel refused to attach it: {e}{}",
                        if w.is_empty() { String::new() } else { format!("\nlibbpf:\n{}", w.trim_end()) }
                    ),
                });
            }
            self.links.push(link);
        }
        Ok(notes)
    }

    /// Detaches every program (the object stays loaded: its maps can still be read).
    pub fn detach(&mut self) {
        for l in self.links.drain(..) {
            // SAFETY: a link libbpf returned, destroyed once.
            unsafe { bpf_link__destroy(l) };
        }
    }

    /// The kernel programs, by name, with their sections.
    pub fn programs(&self) -> &[(String, String)] {
        &self.programs
    }

    /// A loaded program's descriptor.
    pub fn program_fd(&self, name: &str) -> Option<c_int> {
        let (p, _) = self.all_programs().into_iter().find(|(_, n)| n == name)?;
        // SAFETY: a program of the object.
        let fd = unsafe { bpf_program__fd(p) };
        (fd >= 0).then_some(fd)
    }

    /// The programs the kernel skipped runs of, with how many: a tracepoint, kprobe or perf
    /// event program does not run while another one runs on the same CPU (an interrupt's
    /// event inside a program's run is dropped), so whatever the program counts may be short
    /// by that much.
    pub fn recursion_misses(&self) -> Vec<(String, u64)> {
        self.programs
            .iter()
            .filter_map(|(name, _)| {
                let n = sys::prog_recursion_misses(self.program_fd(name)?).ok()?;
                (n > 0).then(|| (name.clone(), n))
            })
            .collect()
    }

    /// The descriptor of the kernel map matching the caller's map `ours`, if it was created.
    pub fn map_fd(&self, ours: &str) -> Option<c_int> {
        let (m, _) = self.all_maps().into_iter().find(|(_, n)| same_map_name(ours, n))?;
        // SAFETY: a map of the object.
        let fd = unsafe { bpf_map__fd(m) };
        (fd >= 0).then_some(fd)
    }
}

impl Drop for KernelObject {
    fn drop(&mut self) {
        for l in self.links.drain(..) {
            // SAFETY: a link libbpf returned, destroyed once.
            unsafe { bpf_link__destroy(l) };
        }
        // SAFETY: the object libbpf opened, closed once (its links are gone).
        unsafe { bpf_object__close(self.obj) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_names_as_libbpf_truncates_them() {
        assert!(same_map_name("counts", "counts"));
        assert!(same_map_name("kernel_shared.bss", "kernel_s.bss"));
        assert!(same_map_name("obj.data.foo", "obj.data.foo"));
        assert!(same_map_name("iolatency.rodata", "iolatenc.rodata"));
        assert!(!same_map_name("kernel_shared.bss", "kernel_s.data"));
        assert!(!same_map_name("counts", "count"));
        assert!(!same_map_name("counts", "x.counts"));
    }
}
