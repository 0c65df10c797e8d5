//! The agent: a shared library that a target process loads (`LD_PRELOAD`, set by
//! `userbpf run` and `userbpf start`). At load it opens the session named by
//! `USERBPF_SESSION`, prepares the session's programs and attaches its links with inline
//! hooks; a thread watching the session's `links/` directory (inotify: notified, never
//! polled on the hot path) attaches links added later and detaches removed ones.
//!
//! A probe hit runs the program on the hook's `struct pt_regs`; nothing on that path
//! allocates, locks or makes a system call. Errors at start-up are printed once to stderr,
//! prefixed `userbpf-agent:`, and the target runs on without the probe.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};

use userbpf_hook::{ProbeId, ProbeKind, PtRegs, HOOK_CONTINUE};
use userbpf_runtime::context::{CpuSlots, RunContext};
use userbpf_runtime::loader::prepare_record;
use userbpf_runtime::{Engine, LinkRecord, LoadedProgram, Session};

mod tracepoint;
mod usdt;

/// Environment variable choosing the interpreter (`1`) over the JIT.
pub const INTERPRETER_ENV: &str = "USERBPF_INTERPRETER";

/// What a hook's handler gets as its data: the program and what the run context needs.
struct Attached {
    prog: Arc<LoadedProgram>,
    cookie: u64,
    func_ip: u64,
    retprobe: bool,
    /// The probed address when the hook sits before it (USDT probes sharing a hook at the
    /// first of consecutive `nop`s): the program sees a copy of the registers with this `ip`.
    /// 0: the hook's own.
    ip: u64,
}

/// The agent's state in this process.
pub struct Agent {
    session: Session,
    slots: Arc<CpuSlots>,
    engine: Engine,
    programs: HashMap<u32, Arc<LoadedProgram>>,
    /// Attached links: their probes (none when attaching failed, so it is reported once).
    links: HashMap<u32, AttachedLink>,
}

/// What attaching one link made: its probes and the USDT semaphores it raised.
#[derive(Default)]
struct AttachedLink {
    probes: Vec<ProbeId>,
    semaphores: Vec<usize>,
    /// Hook addresses of USDT probes (see `usdt::claim`).
    anchors: Vec<usize>,
}

impl AttachedLink {
    fn detach(self) {
        for p in self.probes {
            let _ = userbpf_hook::detach(p);
        }
        for s in self.semaphores {
            usdt::semaphore_add(s, -1);
        }
        for a in self.anchors {
            usdt::release(a);
        }
    }
}

static AGENT: OnceLock<Mutex<Agent>> = OnceLock::new();

fn log(msg: &str) {
    eprintln!("userbpf-agent: {msg}");
}

/// The hit path: run the program on the probe's registers.
unsafe extern "C" fn on_hit(data: *mut c_void, regs: *mut PtRegs) -> u32 {
    // SAFETY: `data` is the `Attached` leaked for this probe when it was attached; it is
    // never freed (a thread may still be in this handler after detach).
    let a = unsafe { &*(data as *const Attached) };
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: `regs` points to the hook's saved registers for this hit.
        let ax = unsafe { (*regs).ax };
        let mut copy;
        let regs = if a.ip != 0 {
            // SAFETY: as above; the copy lives until the program returns.
            copy = unsafe { *regs };
            copy.ip = a.ip;
            &mut copy as *mut PtRegs
        } else {
            regs
        };
        let info = RunContext {
            regs: regs as u64,
            func_ip: a.func_ip,
            cookie: a.cookie,
            nr_args: 6,
            retval: a.retprobe.then_some(ax),
            ..Default::default()
        };
        let _ = a.prog.run(regs.cast::<u8>(), std::mem::size_of::<PtRegs>(), info);
    }));
    drop(r);
    HOOK_CONTINUE
}

/// `bpf_probe_read_kernel` as the runtime has it.
static READ_KERNEL: OnceLock<userbpf_vm::HelperFn> = OnceLock::new();

/// `bpf_probe_read_kernel` for probes: the probe's `struct pt_regs` is kernel memory in the
/// kernel, and libbpf's `usdt.bpf.h` reads registers from `ctx` with this helper. A read
/// lying inside the run's `pt_regs` is a copy; any other goes to the runtime's helper.
unsafe extern "C" fn probe_read_kernel(dst: u64, size: u64, src: u64, a4: u64, a5: u64) -> u64 {
    let size = size as u32 as u64;
    if let Some(c) = userbpf_runtime::context::current() {
        let regs = c.regs;
        if regs != 0 && src >= regs && src.checked_add(size).is_some_and(|e| e <= regs + std::mem::size_of::<PtRegs>() as u64) {
            // SAFETY: the source lies inside the probe's pt_regs (live for the run); `dst` is
            // the program's buffer of `size` bytes, as for the runtime's own helper.
            unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, size as usize) };
            return 0;
        }
    }
    match READ_KERNEL.get() {
        // SAFETY: the runtime's helper, called as the VM would.
        Some(f) => unsafe { f(dst, size, src, a4, a5) },
        None => (-libc::EFAULT) as i64 as u64,
    }
}

/// The runtime's helpers, with [`probe_read_kernel`] in place of its own.
fn helpers() -> Arc<userbpf_vm::HelperRegistry> {
    static REG: OnceLock<Arc<userbpf_vm::HelperRegistry>> = OnceLock::new();
    REG.get_or_init(|| {
        let base = userbpf_runtime::helpers::registry();
        let mut reg = (*base).clone();
        if let Some(h) = base.get(113) {
            let _ = READ_KERNEL.set(h.func);
            reg.register(userbpf_vm::Helper { func: probe_read_kernel, ..*h });
        }
        Arc::new(reg)
    })
    .clone()
}

impl Agent {
    /// Opens the session of this process and attaches its links.
    pub fn start() -> Result<&'static Mutex<Agent>, String> {
        if let Some(a) = AGENT.get() {
            return Ok(a);
        }
        let session = match Session::from_env() {
            Some(s) => s.map_err(|e| format!("opening the session: {e}"))?,
            None => return Err("USERBPF_SESSION is not set".into()),
        };
        let slots = Arc::new(CpuSlots::open(&session.dir().join("cpus")).map_err(|e| format!("CPU slots: {e}"))?);
        let engine = if std::env::var(INTERPRETER_ENV).is_ok_and(|v| v == "1") { Engine::Interpreter } else { Engine::Jit };
        userbpf_vm::guard::install();
        let agent = Agent { session, slots, engine, programs: HashMap::new(), links: HashMap::new() };
        let cell = AGENT.get_or_init(|| Mutex::new(agent));
        cell.lock().unwrap_or_else(|e| e.into_inner()).sync();
        Ok(cell)
    }

    /// Attaches links that appeared and detaches links that are gone.
    pub fn sync(&mut self) {
        let links = match self.session.links() {
            Ok(l) => l,
            Err(e) => return log(&format!("reading links: {e}")),
        };
        let me = std::process::id();
        let live: Vec<u32> = links.iter().map(|l| l.id).collect();
        let gone: Vec<u32> = self.links.keys().copied().filter(|id| !live.contains(id)).collect();
        for id in gone {
            if let Some(l) = self.links.remove(&id) {
                l.detach();
            }
        }
        for link in links {
            if self.links.contains_key(&link.id) || link.pid.is_some_and(|p| p != me) {
                continue;
            }
            match self.attach(&link) {
                Ok(l) => {
                    self.links.insert(link.id, l);
                }
                Err(e) => {
                    log(&format!("link {} ({} {}): {e}", link.id, link.kind, target_spec(&link)));
                    // Remember the failure so it is reported once.
                    self.links.insert(link.id, AttachedLink::default());
                }
            }
        }
    }

    fn program(&mut self, id: u32) -> Result<Arc<LoadedProgram>, String> {
        if let Some(p) = self.programs.get(&id) {
            return Ok(p.clone());
        }
        let rec = self.session.progs().map_err(|e| e.to_string())?.into_iter().find(|p| p.id == id).ok_or(format!("program {id} is not in the session"))?;
        let prog = Arc::new(prepare_record(&self.session, &rec, helpers(), self.engine, self.slots.clone())?);
        userbpf_runtime::programs::register(prog.clone());
        self.programs.insert(id, prog.clone());
        Ok(prog)
    }

    fn attach(&mut self, link: &LinkRecord) -> Result<AttachedLink, String> {
        let prog = self.program(link.prog_id)?;
        if link.kind == "usdt" {
            return usdt::attach(&self.session, link, prog);
        }
        if link.kind == "tracepoint" || link.kind == "raw_tracepoint" {
            return tracepoint::attach(link, prog);
        }
        let kind = if link.kind == "uretprobe" { ProbeKind::Return } else { ProbeKind::Entry };
        let resolved = userbpf_hook::symbols::resolve(&target_spec(link)).map_err(|e| e.to_string())?;
        let data = Box::into_raw(Box::new(Attached { prog, cookie: link.cookie, func_ip: resolved.func_start as u64, retprobe: kind == ProbeKind::Return, ip: 0 }));
        let ext = resolved.size.filter(|s| *s > 0).map(|len| userbpf_hook::FuncExtent { start: resolved.func_start, len });
        let id = userbpf_hook::attach_with(resolved.addr, kind, on_hit, data.cast(), ext).map_err(|e| e.to_string())?;
        Ok(AttachedLink { probes: vec![id], ..Default::default() })
    }
}

/// The hook crate's target syntax for a link (USDT links: `PATH:PROVIDER:NAME`): `PATH:FUNC+OFF`, `FUNC+OFF` or an address.
fn target_spec(link: &LinkRecord) -> String {
    let func = match &link.func {
        Some(f) if link.offset != 0 => format!("{f}+{}", link.offset),
        Some(f) => f.clone(),
        None => format!("{:#x}", link.offset),
    };
    if link.path.is_empty() {
        func
    } else {
        format!("{}:{func}", link.path)
    }
}

/// Watches the session's `links/` directory and syncs on every change.
fn watch(dir: std::path::PathBuf) {
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else { return };
    // SAFETY: inotify_init1 has no preconditions; the descriptor is owned by this thread.
    let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
    if fd < 0 {
        return log("inotify_init1 failed: links added later will not be attached");
    }
    // SAFETY: `c` is a valid path; `fd` is ours.
    if unsafe { libc::inotify_add_watch(fd, c.as_ptr(), libc::IN_MOVED_TO | libc::IN_CREATE | libc::IN_DELETE) } < 0 {
        return log("watching the session's links failed: links added later will not be attached");
    }
    let mut buf = [0u8; 4096];
    loop {
        // SAFETY: reading into a buffer we own, of its length.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        if let Some(a) = AGENT.get() {
            a.lock().unwrap_or_else(|e| e.into_inner()).sync();
        }
    }
}

extern "C" fn agent_init() {
    if std::env::var_os("USERBPF_SESSION").is_none() {
        return;
    }
    let _ = std::panic::catch_unwind(|| match Agent::start() {
        Ok(a) => {
            let dir = a.lock().unwrap_or_else(|e| e.into_inner()).session.dir().join("links");
            let _ = std::thread::Builder::new().name("userbpf-agent".into()).spawn(move || watch(dir));
        }
        Err(e) => log(&e),
    });
}

/// Runs when the library is loaded (LD_PRELOAD or dlopen).
#[used]
#[link_section = ".init_array"]
static AGENT_INIT: extern "C" fn() = agent_init;
