//! Probe targets: resolve `PATH:FUNC[+OFFSET]`, `FUNC[+OFFSET]` or `0xADDR`
//! to an address in this process, with the function's start and size.
//!
//! Loaded objects come from `dl_iterate_phdr` (file name + load bias); their
//! `.symtab` and `.dynsym` are read from disk with the `object` crate and the
//! bias added. GNU ifunc symbols (e.g. `strlen` in libc) are resolved to the
//! selected implementation with `dlsym`.
//!
//! Libraries loaded later: [`LibraryWatcher::poll`] compares the
//! `dl_iterate_phdr` list (cheaply: glibc's `dlpi_adds` counter first) with
//! what it saw before and returns the new objects. Polling was chosen over
//! a return probe on `dlopen` calling back from inside a handler because
//! callbacks usually want to attach probes, which must not be done from a
//! handler (see the crate docs), and because it also sees libraries loaded
//! as dependencies or by `dlmopen`.

use std::collections::HashSet;
use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};

use object::{Object, ObjectSymbol, SymbolKind};

use crate::HookError;

/// An object (executable or shared library) mapped in this process.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LoadedObject {
    /// File path (the executable's from /proc/self/exe).
    pub path: PathBuf,
    /// Load bias: symbol value + bias = address.
    pub bias: usize,
}

/// A resolved probe target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    /// The address to probe (function start + offset).
    pub addr: usize,
    /// The function's start.
    pub func_start: usize,
    /// The function's size, when the symbol has one.
    pub size: Option<usize>,
    pub name: String,
    pub path: PathBuf,
}

struct Collect {
    objs: Vec<LoadedObject>,
    adds: u64,
}

unsafe extern "C" fn phdr_cb(
    info: *mut libc::dl_phdr_info,
    _size: usize,
    data: *mut libc::c_void,
) -> libc::c_int {
    // SAFETY: dl_iterate_phdr passes a valid info and our &mut Collect.
    let (info, c) = unsafe { (&*info, &mut *(data as *mut Collect)) };
    c.adds = info.dlpi_adds;
    let name = if info.dlpi_name.is_null() {
        String::new()
    } else {
        // SAFETY: dlpi_name is a NUL-terminated string owned by the loader.
        unsafe { CStr::from_ptr(info.dlpi_name) }
            .to_string_lossy()
            .into_owned()
    };
    let path = if name.is_empty() {
        if !c.objs.is_empty() {
            return 0; // the vdso is also reported without a file name
        }
        std::fs::read_link("/proc/self/exe").unwrap_or_default()
    } else {
        PathBuf::from(name)
    };
    c.objs.push(LoadedObject {
        path,
        bias: info.dlpi_addr as usize,
    });
    0
}

fn iterate() -> Collect {
    let mut c = Collect {
        objs: Vec::new(),
        adds: 0,
    };
    // SAFETY: the callback only writes into `c`, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(phdr_cb), &mut c as *mut Collect as *mut libc::c_void) };
    c
}

/// The objects loaded in this process, the executable first.
pub fn loaded_objects() -> Vec<LoadedObject> {
    iterate()
        .objs
        .into_iter()
        .filter(|o| o.path.is_file())
        .collect()
}

/// Reports objects loaded since the previous poll (including dlopen'ed ones).
#[derive(Debug, Default)]
pub struct LibraryWatcher {
    known: HashSet<LoadedObject>,
    adds: u64,
}

impl LibraryWatcher {
    /// A watcher that considers every currently loaded object known.
    pub fn new() -> Self {
        let c = iterate();
        LibraryWatcher {
            known: c.objs.into_iter().collect(),
            adds: c.adds,
        }
    }

    /// Objects loaded since the last call (or since `new`).
    pub fn poll(&mut self) -> Vec<LoadedObject> {
        let c = iterate();
        if c.adds == self.adds {
            return Vec::new();
        }
        self.adds = c.adds;
        let now: HashSet<LoadedObject> = c.objs.iter().cloned().collect();
        let new: Vec<LoadedObject> = c
            .objs
            .into_iter()
            .filter(|o| !self.known.contains(o) && o.path.is_file())
            .collect();
        self.known = now;
        new
    }
}

struct Sym {
    name: String,
    value: usize,
    size: usize,
    ifunc: bool,
}

fn read_symbols(path: &Path) -> Result<Vec<Sym>, String> {
    let data = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let file = object::File::parse(&*data).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut out = Vec::new();
    for sym in file.symbols().chain(file.dynamic_symbols()) {
        if sym.kind() != SymbolKind::Text || sym.is_undefined() || sym.address() == 0 {
            continue;
        }
        let Ok(name) = sym.name() else { continue };
        let ifunc =
            matches!(sym.flags(), object::SymbolFlags::Elf { st_info, .. } if st_info & 0xf == 10);
        out.push(Sym {
            name: name.to_string(),
            value: sym.address() as usize,
            size: sym.size() as usize,
            ifunc,
        });
    }
    Ok(out)
}

fn name_matches(sym: &str, want: &str) -> bool {
    sym == want || sym.split('@').next() == Some(want)
}

fn parse_num(s: &str) -> Option<usize> {
    if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        usize::from_str_radix(h, 16).ok()
    } else {
        s.parse().ok()
    }
}

fn path_matches(obj: &Path, want: &str) -> bool {
    let w = Path::new(want);
    obj == w || (w.components().count() == 1 && obj.file_name() == w.file_name())
}

fn ifunc_target(path: &Path, is_exe: bool, name: &str) -> Option<usize> {
    let cname = CString::new(name).ok()?;
    let cpath = CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: RTLD_NOLOAD only returns a handle of an already loaded object
    // (bumping its refcount, released by dlclose); dlsym resolves the ifunc.
    unsafe {
        let h = libc::dlopen(
            if is_exe {
                std::ptr::null()
            } else {
                cpath.as_ptr()
            },
            libc::RTLD_NOLOAD | libc::RTLD_LAZY,
        );
        if h.is_null() {
            return None;
        }
        let p = libc::dlsym(h, cname.as_ptr());
        libc::dlclose(h);
        (!p.is_null()).then_some(p as usize)
    }
}

/// Resolves `PATH:FUNC[+OFF]`, `FUNC[+OFF]` (executable first, then the
/// libraries in load order) or `0xADDR`.
pub fn resolve(spec: &str) -> Result<Resolved, HookError> {
    let spec = spec.trim();
    let err = |m: String| HookError::Symbol(m);
    if spec.starts_with("0x") || spec.starts_with("0X") {
        let addr = parse_num(spec).ok_or_else(|| err(format!("bad address `{spec}`")))?;
        return Ok(lookup_addr(addr)
            .map(|r| Resolved { addr, ..r })
            .unwrap_or(Resolved {
                addr,
                func_start: addr,
                size: None,
                name: String::new(),
                path: PathBuf::new(),
            }));
    }
    let (path, rest) = match spec.rsplit_once(':') {
        Some((p, r)) => (Some(p), r),
        None => (None, spec),
    };
    let (func, off) = match rest.rsplit_once('+') {
        Some((f, o)) => (
            f,
            parse_num(o).ok_or_else(|| err(format!("bad offset `{o}` in `{spec}`")))?,
        ),
        None => (rest, 0),
    };
    if func.is_empty() {
        return Err(err(format!("no function name in `{spec}`")));
    }
    let objs = loaded_objects();
    let mut searched = false;
    for (i, o) in objs.iter().enumerate() {
        if let Some(p) = path {
            if !path_matches(&o.path, p) {
                continue;
            }
        }
        searched = true;
        let Ok(syms) = read_symbols(&o.path) else {
            continue;
        };
        // Prefer a symbol with a size (.symtab and .dynsym may both list it).
        let mut best: Option<&Sym> = None;
        for s in syms.iter().filter(|s| name_matches(&s.name, func)) {
            if best.is_none_or(|b| b.size == 0 && s.size > 0) {
                best = Some(s);
            }
        }
        let Some(s) = best else { continue };
        let (start, size) = if s.ifunc {
            let t = ifunc_target(&o.path, i == 0, func).ok_or_else(|| {
                err(format!(
                    "cannot resolve the ifunc `{func}` in {}",
                    o.path.display()
                ))
            })?;
            (
                t,
                lookup_addr(t)
                    .filter(|r| r.func_start == t)
                    .and_then(|r| r.size),
            )
        } else {
            (s.value.wrapping_add(o.bias), (s.size > 0).then_some(s.size))
        };
        if let Some(sz) = size {
            if off >= sz {
                return Err(err(format!("offset {off} is beyond `{func}` ({sz} bytes)")));
            }
        }
        return Ok(Resolved {
            addr: start + off,
            func_start: start,
            size,
            name: s.name.clone(),
            path: o.path.clone(),
        });
    }
    match path {
        Some(p) if !searched => Err(err(format!("`{p}` is not loaded in this process"))),
        Some(p) => Err(err(format!("no function `{func}` in `{p}`"))),
        None => Err(err(format!(
            "no function `{func}` in the executable or its loaded libraries"
        ))),
    }
}

/// The function (with a sized symbol) containing `addr`, if any.
pub fn lookup_addr(addr: usize) -> Option<Resolved> {
    for o in loaded_objects() {
        let Ok(syms) = read_symbols(&o.path) else {
            continue;
        };
        for s in syms {
            let start = s.value.wrapping_add(o.bias);
            if s.size > 0 && addr >= start && addr < start + s.size {
                return Some(Resolved {
                    addr,
                    func_start: start,
                    size: Some(s.size),
                    name: s.name,
                    path: o.path,
                });
            }
        }
    }
    None
}
