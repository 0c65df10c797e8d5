//! The server's state in this process, in one struct: everything the library keeps between
//! the loader's calls, each part owned by the module named beside it. One `static` holds it
//! ([`server`]), because the C entry points ([`crate::shim`]) have nowhere else to find it;
//! it is built at compile time (no lazy initialisation, no allocation until used).
//!
//! What stays outside: facts of the process or the system computed once (`serving`, the
//! trace switch, the uprobe PMU's type, tracepoint ids), `Once` guards of threads started
//! once, and the real `dlsym`, which must work before anything else.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicUsize};
use std::sync::{Arc, Condvar, Mutex, OnceLock, RwLock};

use userbpf_runtime::Session;
use userbpf_runtime::context::CpuSlots;

use crate::error::Error;
use crate::{attach, bpf, mmap, objects, perf_event};

/// The state of the syscall server in this process.
pub struct Server {
    /// The session the calls are served in ([`objects::session`]).
    pub(crate) session: OnceLock<Result<Session, i32>>,
    /// The descriptors of session objects handed out ([`objects`]).
    pub(crate) objects: RwLock<Vec<objects::Entry>>,
    /// Maps and programs opened in this process ([`bpf::state`]).
    pub(crate) bpf: OnceLock<Mutex<bpf::State>>,
    /// Links made here: id -> program id ([`bpf::link`]).
    pub(crate) links: OnceLock<Mutex<HashMap<u32, u32>>>,
    /// The session's CPU slots, for programs prepared here ([`Server::slots`]).
    slots: OnceLock<Result<Arc<CpuSlots>, Error>>,
    /// Perf events opened by the loader ([`perf_event`]).
    pub(crate) events: Mutex<Vec<perf_event::Event>>,
    /// Rings and maps mapped, ring watchers ([`mmap`]).
    pub(crate) mmap: mmap::State,
    /// Attachments, owned links, raised semaphores, timers' programs ([`attach`]).
    pub(crate) attach: attach::State,
}

static SERVER: Server = Server {
    session: OnceLock::new(),
    objects: RwLock::new(Vec::new()),
    bpf: OnceLock::new(),
    links: OnceLock::new(),
    slots: OnceLock::new(),
    events: Mutex::new(Vec::new()),
    mmap: mmap::State {
        internal_fds: Mutex::new(Vec::new()),
        events: Mutex::new(None),
        maps: Mutex::new(None),
        watchers: Mutex::new(None),
        watched: AtomicUsize::new(0),
    },
    attach: attach::State {
        attached: Mutex::new(None),
        loader: AtomicU32::new(0),
        owned: Mutex::new(Vec::new()),
        raised: Mutex::new(None),
        programs: Mutex::new(None),
        last_change: Mutex::new(None),
        changed: Condvar::new(),
        closing: Mutex::new(()),
        targets: Mutex::new(None),
    },
};

/// This process's server state.
pub fn server() -> &'static Server {
    &SERVER
}

impl Server {
    /// The session's CPU slots (shared with the agent and the targets), opened on first use.
    pub fn slots(&self) -> Result<Arc<CpuSlots>, Error> {
        self.slots
            .get_or_init(|| {
                let s = objects::session().map_err(|e| Error::new(e, "no session"))?;
                let path = s.layout().cpus();
                CpuSlots::open(&path)
                    .map(Arc::new)
                    .map_err(|e| Error::new(e.raw_os_error().unwrap_or(libc::EIO), format!("{}: {e}", path.display())))
            })
            .clone()
    }
}
