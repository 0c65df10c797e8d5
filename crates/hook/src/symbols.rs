//! Probe targets: resolve `PATH:FUNC[+OFFSET]`, `FUNC[+OFFSET]` or `0xADDR`
//! to an address in this process, with the function's start and size.
//!
//! Loaded objects come from `dl_iterate_phdr` (file name + load bias); their
//! `.symtab` and `.dynsym` are read from disk with the `object` crate and the
//! bias added. GNU ifunc symbols (e.g. `strlen` in libc) are resolved to the
//! selected implementation with `dlsym`.
//!
//! Libraries loaded later: [`LibraryWatcher::changes`] compares the
//! `dl_iterate_phdr` list (cheaply: glibc's `dlpi_adds`/`dlpi_subs` counters
//! first) with what it saw before and returns the objects mapped and unmapped
//! since. [`crate::dlnotify`] calls it from the dynamic loader's debugger
//! notification, so a dlopen or dlclose is seen before it returns.

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

pub use userbpf_elf::symbols::has_function;
use userbpf_elf::symbols::{FunctionSymbol, function_symbols, name_matches};

use crate::HookError;

/// An object (executable or shared library) mapped in this process. (The runtime's
/// `LoadedObject` is an eBPF object loaded into a session: a different thing.)
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MappedObject {
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
    objs: Vec<MappedObject>,
    /// The `PT_LOAD` ranges of each object (same order as `objs`).
    segments: Vec<Vec<(usize, usize)>>,
    adds: u64,
    subs: u64,
}

unsafe extern "C" fn phdr_cb(info: *mut libc::dl_phdr_info, _size: usize, data: *mut libc::c_void) -> libc::c_int {
    // SAFETY: dl_iterate_phdr passes a valid info and our &mut Collect.
    let (info, c) = unsafe { (&*info, &mut *(data as *mut Collect)) };
    c.adds = info.dlpi_adds;
    c.subs = info.dlpi_subs;
    let name = if info.dlpi_name.is_null() {
        String::new()
    } else {
        // SAFETY: dlpi_name is a NUL-terminated string owned by the loader.
        unsafe { CStr::from_ptr(info.dlpi_name) }.to_string_lossy().into_owned()
    };
    let path = if name.is_empty() {
        if !c.objs.is_empty() {
            return 0; // the vdso is also reported without a file name
        }
        std::fs::read_link("/proc/self/exe").unwrap_or_default()
    } else {
        PathBuf::from(name)
    };
    let bias = info.dlpi_addr as usize;
    let mut segs = Vec::new();
    if !info.dlpi_phdr.is_null() {
        for i in 0..info.dlpi_phnum as usize {
            // SAFETY: dlpi_phdr points to dlpi_phnum program headers of a loaded object.
            let ph = unsafe { &*info.dlpi_phdr.add(i) };
            if ph.p_type == libc::PT_LOAD {
                let start = bias.wrapping_add(ph.p_vaddr as usize);
                segs.push((start, start.wrapping_add(ph.p_memsz as usize)));
            }
        }
    }
    c.objs.push(MappedObject { path, bias });
    c.segments.push(segs);
    0
}

fn iterate() -> Collect {
    let mut c = Collect { objs: Vec::new(), segments: Vec::new(), adds: 0, subs: 0 };
    // SAFETY: the callback only writes into `c`, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(phdr_cb), &mut c as *mut Collect as *mut libc::c_void) };
    c
}

/// The objects loaded in this process, the executable first.
pub fn loaded_objects() -> Vec<MappedObject> {
    iterate().objs.into_iter().filter(|o| o.path.is_file()).collect()
}

/// The objects of the executable and its libraries that are mapped and unmapped between two
/// looks (see [`LibraryWatcher::changes`]).
#[derive(Debug, Default, Clone)]
pub struct ObjectChanges {
    /// Objects mapped since the last look.
    pub added: Vec<MappedObject>,
    /// Objects unmapped since the last look, with the address ranges their `PT_LOAD`
    /// segments covered.
    pub removed: Vec<(MappedObject, Vec<(usize, usize)>)>,
}

impl ObjectChanges {
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty()
    }
}

/// Reports objects loaded and unloaded since the previous look (dlopen, dlclose).
#[derive(Debug, Default)]
pub struct LibraryWatcher {
    known: HashMap<MappedObject, Vec<(usize, usize)>>,
    adds: u64,
    subs: u64,
}

impl LibraryWatcher {
    /// A watcher that considers every currently loaded object known.
    pub fn new() -> Self {
        let c = iterate();
        LibraryWatcher { known: c.objs.into_iter().zip(c.segments).collect(), adds: c.adds, subs: c.subs }
    }

    /// Objects loaded since the last call (or since `new`).
    pub fn poll(&mut self) -> Vec<MappedObject> {
        self.changes().added
    }

    /// Objects loaded and unloaded since the last call (or since `new`).
    pub fn changes(&mut self) -> ObjectChanges {
        let c = iterate();
        if c.adds == self.adds && c.subs == self.subs {
            return ObjectChanges::default();
        }
        self.adds = c.adds;
        self.subs = c.subs;
        let now: HashMap<MappedObject, Vec<(usize, usize)>> = c.objs.into_iter().zip(c.segments).collect();
        let added = now.keys().filter(|o| !self.known.contains_key(*o) && o.path.is_file()).cloned().collect();
        let removed =
            self.known.iter().filter(|(o, _)| !now.contains_key(*o)).map(|(o, s)| (o.clone(), s.clone())).collect();
        self.known = now;
        ObjectChanges { added, removed }
    }
}

/// Whether `obj` (a loaded object's path) is the file `want` names: the same path, the same
/// file name when `want` is a bare name (`libc.so.6`), or the same file through links.
pub fn same_file(obj: &Path, want: &str) -> bool {
    let w = Path::new(want);
    if obj == w || (w.components().count() == 1 && obj.file_name() == w.file_name()) {
        return true;
    }
    if w.components().count() == 1 {
        return false;
    }
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(obj), std::fs::metadata(w)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// The loaded object `want` names (see [`same_file`]); `None` when it is not mapped in this
/// process. An empty `want` is the executable.
pub fn find_loaded(want: &str) -> Option<MappedObject> {
    let objs = loaded_objects();
    if want.is_empty() {
        return objs.into_iter().next();
    }
    objs.into_iter().find(|o| same_file(&o.path, want))
}

/// The address where file offset `off` of `obj` is mapped (as the kernel's uprobes take
/// their offsets), if a `PT_LOAD` segment maps it.
pub fn file_offset_to_addr(obj: &MappedObject, off: u64) -> Option<usize> {
    let vaddr = userbpf_elf::symbols::offset_to_vaddr(&obj.path, off)?;
    Some(obj.bias.wrapping_add(vaddr as usize))
}

/// Set while resolving from inside the dynamic loader (see [`crate::dlnotify`]): libraries
/// being loaded are not relocated yet, so their ifunc resolvers must not run.
static IN_LOADER: AtomicBool = AtomicBool::new(false);

/// Marks the start (`true`) and end of work done inside a loader notification.
pub fn set_in_loader(on: bool) {
    IN_LOADER.store(on, Ordering::SeqCst);
}

/// Start of the message of a [`HookError::Symbol`] for a target that can only be resolved
/// once the loader is done (an ifunc of a library being loaded): try again later.
pub const DEFERRED: &str = "deferred: ";

fn parse_num(s: &str) -> Option<usize> {
    if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        usize::from_str_radix(h, 16).ok()
    } else {
        s.parse().ok()
    }
}

fn path_matches(obj: &Path, want: &str) -> bool {
    same_file(obj, want)
}

fn ifunc_target(path: &Path, is_exe: bool, name: &str) -> Option<usize> {
    let cname = CString::new(name).ok()?;
    let cpath = CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: RTLD_NOLOAD only returns a handle of an already loaded object
    // (bumping its refcount, released by dlclose); dlsym resolves the ifunc.
    unsafe {
        let h =
            libc::dlopen(if is_exe { std::ptr::null() } else { cpath.as_ptr() }, libc::RTLD_NOLOAD | libc::RTLD_LAZY);
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
        return Ok(lookup_addr(addr).map(|r| Resolved { addr, ..r }).unwrap_or(Resolved {
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
        Some((f, o)) => (f, parse_num(o).ok_or_else(|| err(format!("bad offset `{o}` in `{spec}`")))?),
        None => (rest, 0),
    };
    if func.is_empty() {
        return Err(err(format!("no function name in `{spec}`")));
    }
    let objs = loaded_objects();
    let mut searched = false;
    for (i, o) in objs.iter().enumerate() {
        if let Some(p) = path
            && !path_matches(&o.path, p)
        {
            continue;
        }
        searched = true;
        let Ok(syms) = function_symbols(&o.path) else {
            continue;
        };
        // Prefer a symbol with a size (.symtab and .dynsym may both list it).
        let mut best: Option<&FunctionSymbol> = None;
        for s in syms.iter().filter(|s| name_matches(&s.name, func)) {
            if best.is_none_or(|b| b.size == 0 && s.size > 0) {
                best = Some(s);
            }
        }
        let Some(s) = best else { continue };
        let (start, size) = if s.ifunc {
            if IN_LOADER.load(Ordering::SeqCst) {
                return Err(err(format!(
                    "{DEFERRED}`{func}` in {} is an ifunc, resolved once the loader is done",
                    o.path.display()
                )));
            }
            let t = ifunc_target(&o.path, i == 0, func)
                .ok_or_else(|| err(format!("cannot resolve the ifunc `{func}` in {}", o.path.display())))?;
            (t, lookup_addr(t).filter(|r| r.func_start == t).and_then(|r| r.size))
        } else {
            (s.value.wrapping_add(o.bias), (s.size > 0).then_some(s.size))
        };
        if let Some(sz) = size
            && off >= sz
        {
            return Err(err(format!("offset {off} is beyond `{func}` ({sz} bytes)")));
        }
        return Ok(Resolved { addr: start + off, func_start: start, size, name: s.name.clone(), path: o.path.clone() });
    }
    match path {
        Some(p) if !searched => Err(err(format!("`{p}` is not loaded in this process"))),
        Some(p) => Err(err(format!("no function `{func}` in `{p}`"))),
        None => Err(err(format!("no function `{func}` in the executable or its loaded libraries"))),
    }
}

/// The function (with a sized symbol) containing `addr`, if any.
pub fn lookup_addr(addr: usize) -> Option<Resolved> {
    for o in loaded_objects() {
        let Ok(syms) = function_symbols(&o.path) else {
            continue;
        };
        for s in syms {
            let start = s.value.wrapping_add(o.bias);
            if s.size > 0 && addr >= start && addr < start + s.size {
                return Some(Resolved { addr, func_start: start, size: Some(s.size), name: s.name, path: o.path });
            }
        }
    }
    None
}

/// Bytes of alignment padding that follow the code ending at `end` (a function's end) and
/// belong to no symbol: the object holding `end` is found among the loaded ones, the symbol
/// table (`.symtab` and `.dynsym`, every defined symbol but sections and files) gives the
/// next symbol after `end` (or the end of the section) and shows that none covers `end`; the
/// bytes up to there (at most 64 are looked at) must decode as `int3` or `nop` in memory.
/// When the next symbol is further than that (stripped objects list no static functions),
/// only the padding before the next 16-byte boundary counts. 0 when nothing is proven.
pub fn gap_after(end: usize) -> usize {
    let c = iterate();
    let Some((obj, _)) =
        c.objs.iter().zip(&c.segments).find(|(_, segs)| segs.iter().any(|(s, e)| *s < end && end <= *e))
    else {
        return 0;
    };
    let path = if obj.path.is_file() { obj.path.clone() } else { return 0 };
    let Ok(data) = std::fs::read(&path) else { return 0 };
    let rel = end.wrapping_sub(obj.bias) as u64;
    let Some(whole) = userbpf_elf::symbols::unclaimed_after(&data, rel) else { return 0 };
    let whole = whole as usize;
    let gap = whole.min(64);
    if gap == 0 {
        return 0;
    }
    let Some(m) = crate::patch::mapping_of(end) else { return 0 };
    let gap = gap.min(m.end - end);
    // SAFETY: [end, end+gap) lies inside a mapped, readable (text) mapping of this process.
    let bytes = unsafe { std::slice::from_raw_parts(end as *const u8, gap) };
    let mut dec = iced_x86::Decoder::with_ip(64, bytes, end as u64, iced_x86::DecoderOptions::NONE);
    let mut ok = 0;
    while dec.can_decode() {
        let ins = dec.decode();
        if ins.is_invalid() || !matches!(ins.mnemonic(), iced_x86::Mnemonic::Nop | iced_x86::Mnemonic::Int3) {
            break;
        }
        ok += ins.len();
    }
    if ok >= gap {
        gap
    } else if whole > gap {
        // The next symbol is far (a stripped object: static functions have none): only the
        // bytes before the next 16-byte boundary, where no function can start unless the
        // compiler was told to align functions less, are taken for padding.
        ok.min(((end + 15) & !15) - end)
    } else {
        0 // code without a symbol before the next one
    }
}
