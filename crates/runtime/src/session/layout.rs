//! The layout of a session directory: the one place that names its files and directories.
//! Every crate (the agent, the syscall server, the CLI) reaches a session file through a
//! [`Layout`]; none joins a session path itself.
//!
//! ```text
//! userbpf-UID-NAME/
//!   lock                    flock'ed while the registry changes (never on a hot path)
//!   next_id                 the last id handed out (maps, programs, links, BTF share one space)
//!   members/PID.START.N     one file per handle of a process using the session
//!   maps/ID                 a map (see userbpf-maps)
//!   maps/ID.json            its MapRecord
//!   maps/ID.frozen          MAP_FREEZE was called on it (or the loader froze its .rodata)
//!   maps/ID.poll            the FIFO a ring buffer's descriptors open (for epoll)
//!   progs/ID.json           a ProgRecord
//!   btf/ID                  raw BTF of an object
//!   kernel_btf/NAME         the kernel's BTF objects as a loader opened them
//!   links/ID.json           a LinkRecord: every agent the link is for attaches it
//!   links/gen               the links generation (see `handshake`)
//!   links/nudge             rewritten after link changes: agents look at links/ again
//!   agents/PID.START        an agent's acknowledged generation (see `handshake`)
//!   perf/ID                 a loader's perf event (a FIFO its descriptors open)
//!   perf/link-ID            a LINK_CREATE(BPF_PERF_EVENT) link's descriptor file
//!   perf/owner-PID          the record paths of the links a loader owns (its watchdog's list)
//!   perf/injected-PID.START a running process loaders injected the agent into: their link ids
//!   perf/injected.lock      held while loaders inject or detach such a process
//!   perf/sema-LINK          a USDT semaphore a link raises (SemaphoreRecord)
//!   perf/sema-LINK.PID.START  claim: who raised it in process PID
//!   pins/ENCODED            a pin of the BPF filesystem (`KIND ID`)
//!   attach/LINK.PID         whether process PID attached LINK (`userbpf run`'s reports)
//!   crashes/PID             the fault that killed process PID and its thread's last program
//!   usdt-specs-MAP.lock     serialises writers of a USDT spec map
//!   trace_pipe              bpf_trace_printk's ring
//!   cpus                    the CPU slots of the session's processes
//!   stats                   the file BPF_ENABLE_STATS' descriptor opens
//!   counters/PID.START      run statistics of the programs process PID runs (see `prog_stats`)
//!   counters/switch         the session's run-statistics switch (a byte every process maps)
//!   counters/hold-PID.START a process that wants runs counted (`userbpf export --run-stats`)
//!   counters/retired.json   the totals of processes gone, folded from their files
//!   counters/lock           flock'ed while files are folded or holders change
//! ```

use std::ffi::OsStr;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// The paths of one session directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    dir: PathBuf,
}

/// A file of the `perf/` directory, by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PerfFile {
    /// `perf/ID`: a perf event.
    Event(u32),
    /// `perf/link-ID`: a perf link.
    Link(u32),
}

impl Layout {
    /// The layout of the session directory `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Layout {
        Layout { dir: dir.into() }
    }

    /// The session directory itself.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// How the name of every session directory of this user starts (`userbpf-UID-`; the
    /// session's name follows).
    pub fn dir_name_prefix() -> String {
        // SAFETY: getuid has no preconditions.
        format!("userbpf-{}-", unsafe { libc::getuid() })
    }

    /// The subdirectories made when a session is opened.
    pub(crate) fn made_at_open(&self) -> [PathBuf; 5] {
        [self.members_dir(), self.maps_dir(), self.progs_dir(), self.btf_dir(), self.links_dir()]
    }

    /// The subdirectories whose contents a wipe (of a session whose members are all gone)
    /// removes.
    pub(crate) fn wiped(&self) -> [PathBuf; 5] {
        [self.maps_dir(), self.progs_dir(), self.btf_dir(), self.links_dir(), self.counters_dir()]
    }

    fn at(&self, parts: &[&dyn AsRef<OsStr>]) -> PathBuf {
        let mut p = self.dir.clone();
        for part in parts {
            p.push(part.as_ref());
        }
        p
    }

    /// `secret`: 32 random bytes, made with the directory (see [`super::broker`]).
    pub fn secret(&self) -> PathBuf {
        self.at(&[&"secret"])
    }
    /// `lock`.
    pub fn lock(&self) -> PathBuf {
        self.at(&[&"lock"])
    }
    /// `next_id`.
    pub fn next_id(&self) -> PathBuf {
        self.at(&[&"next_id"])
    }
    /// `members/`.
    pub fn members_dir(&self) -> PathBuf {
        self.at(&[&"members"])
    }
    /// `members/PID.START.HANDLE`.
    pub fn member(&self, pid: u32, start: u64, handle: u32) -> PathBuf {
        self.at(&[&"members", &format!("{pid}.{start}.{handle}")])
    }
    /// The name prefix of every member file of process `pid` started at `start`.
    pub fn member_prefix(pid: u32, start: u64) -> String {
        format!("{pid}.{start}.")
    }
    /// The pid and start time a member file name holds.
    pub fn parse_member(name: &str) -> Option<(u32, u64)> {
        let mut parts = name.split('.');
        Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
    }

    /// `maps/`.
    pub fn maps_dir(&self) -> PathBuf {
        self.at(&[&"maps"])
    }
    /// `maps/ID`: the map.
    pub fn map(&self, id: u32) -> PathBuf {
        self.at(&[&"maps", &id.to_string()])
    }
    /// `maps/ID.json`: its record.
    pub fn map_record(&self, id: u32) -> PathBuf {
        self.at(&[&"maps", &format!("{id}.json")])
    }
    /// `maps/ID.frozen`: present once the map is frozen.
    pub fn map_frozen(&self, id: u32) -> PathBuf {
        self.at(&[&"maps", &format!("{id}.frozen")])
    }
    /// `maps/ID.kernel`: the kernel map whose values this map's values are
    /// (`crate::kernel_map`), `kernel ID`.
    pub fn map_kernel(&self, id: u32) -> PathBuf {
        self.at(&[&"maps", &format!("{id}.kernel")])
    }
    /// `maps/ID.poll`: a ring buffer's FIFO.
    pub fn map_poll(&self, id: u32) -> PathBuf {
        self.at(&[&"maps", &format!("{id}.poll")])
    }

    /// `progs/`.
    pub fn progs_dir(&self) -> PathBuf {
        self.at(&[&"progs"])
    }
    /// `progs/ID.json`.
    pub fn prog(&self, id: u32) -> PathBuf {
        self.at(&[&"progs", &format!("{id}.json")])
    }

    /// `btf/`.
    pub fn btf_dir(&self) -> PathBuf {
        self.at(&[&"btf"])
    }
    /// `btf/ID`.
    pub fn btf(&self, id: u32) -> PathBuf {
        self.at(&[&"btf", &id.to_string()])
    }
    /// `kernel_btf/`.
    pub fn kernel_btf_dir(&self) -> PathBuf {
        self.at(&[&"kernel_btf"])
    }
    /// `kernel_btf/NAME` (`vmlinux`, a module's name, or a temporary name starting with `.`).
    pub fn kernel_btf(&self, name: &str) -> PathBuf {
        self.at(&[&"kernel_btf", &name])
    }

    /// `links/`.
    pub fn links_dir(&self) -> PathBuf {
        self.at(&[&"links"])
    }
    /// `links/ID.json`.
    pub fn link(&self, id: u32) -> PathBuf {
        self.at(&[&"links", &format!("{id}.json")])
    }
    /// `links/gen`: the links generation.
    pub fn links_gen(&self) -> PathBuf {
        self.at(&[&"links", &"gen"])
    }
    /// `links/nudge`.
    pub fn links_nudge(&self) -> PathBuf {
        self.at(&[&"links", &"nudge"])
    }

    /// `agents/`.
    pub fn agents_dir(&self) -> PathBuf {
        self.at(&[&"agents"])
    }
    /// `agents/PID.START`: the acknowledgement file of an agent.
    pub fn agent(&self, pid: u32, start: u64) -> PathBuf {
        self.at(&[&"agents", &format!("{pid}.{start}")])
    }
    /// The pid and start time of an acknowledgement file's name (`None` for another name,
    /// such as a temporary file).
    pub fn parse_agent(name: &str) -> Option<(u32, u64)> {
        let (pid, start) = name.split_once('.')?;
        Some((pid.parse().ok()?, start.parse().ok()?))
    }

    /// `crashes/`.
    pub fn crashes_dir(&self) -> PathBuf {
        self.at(&[&"crashes"])
    }
    /// `crashes/PID`: what the agent of process PID left when a fault outside eBPF code
    /// killed it (see `crate::crash`).
    pub fn crash(&self, pid: u32) -> PathBuf {
        self.at(&[&"crashes", &pid.to_string()])
    }

    /// `perf/`.
    pub fn perf_dir(&self) -> PathBuf {
        self.at(&[&"perf"])
    }
    /// `perf/ID`: a perf event's file.
    pub fn perf_event(&self, id: u32) -> PathBuf {
        self.at(&[&"perf", &id.to_string()])
    }
    /// `perf/link-ID`: a perf link's file.
    pub fn perf_link(&self, id: u32) -> PathBuf {
        self.at(&[&"perf", &format!("link-{id}")])
    }
    /// The path of a [`PerfFile`].
    pub fn perf_file(&self, f: PerfFile) -> PathBuf {
        match f {
            PerfFile::Event(id) => self.perf_event(id),
            PerfFile::Link(id) => self.perf_link(id),
        }
    }
    /// What a file name of `perf/` is, if it is an event's or a link's.
    pub fn parse_perf(name: &str) -> Option<PerfFile> {
        if let Some(id) = name.strip_prefix("link-") {
            return id.parse().ok().map(PerfFile::Link);
        }
        name.parse().ok().map(PerfFile::Event)
    }
    /// `perf/owner-PID`: the links loader `pid` owns.
    pub fn perf_owner(&self, pid: u32) -> PathBuf {
        self.at(&[&"perf", &format!("owner-{pid}")])
    }
    /// `perf/injected.lock`: held (flock) while loaders inject the agent into a running
    /// process, or take it out, for links naming it (`bpftrace -p`).
    pub fn injected_lock(&self) -> PathBuf {
        self.at(&[&"perf", &"injected.lock"])
    }
    /// `perf/injected-PID.START`: process `pid` got the agent from a loader, for the links
    /// listed (one id a line); the last of them gone, it is detached.
    pub fn injected(&self, pid: u32, start: u64) -> PathBuf {
        self.at(&[&"perf", &format!("injected-{pid}.{start}")])
    }
    /// `perf/sema-LINK`: the semaphore record of a link.
    pub fn semaphore(&self, link: u32) -> PathBuf {
        self.at(&[&"perf", &format!("sema-{link}")])
    }
    /// The link of a semaphore record's file name.
    pub fn parse_semaphore(name: &str) -> Option<u32> {
        name.strip_prefix("sema-")?.parse().ok()
    }
    /// `perf/sema-LINK.PID.START`: the claim of raising link `link`'s semaphore in a process.
    pub fn semaphore_claim(&self, link: u32, pid: u32, start: u64) -> PathBuf {
        self.at(&[&"perf", &format!("sema-{link}.{pid}.{start}")])
    }
    /// Whether file name `name` of `perf/` is a semaphore claim of link `link`.
    pub fn is_claim_of_link(name: &str, link: u32) -> bool {
        name.strip_prefix("sema-")
            .and_then(|r| r.strip_prefix(link.to_string().as_str()))
            .is_some_and(|r| r.starts_with('.'))
    }
    /// Whether file name `name` of `perf/` is a semaphore claim for process `pid` started at
    /// `start` (any link).
    pub fn is_claim_of_process(name: &str, pid: u32, start: u64) -> bool {
        name.starts_with("sema-") && name.ends_with(&format!(".{pid}.{start}"))
    }

    /// `pins/`.
    pub fn pins_dir(&self) -> PathBuf {
        self.at(&[&"pins"])
    }
    /// `pins/ENCODED`: the record of a pin at `path` (a path of the BPF filesystem, with or
    /// without its leading `/`): named by the path without its leading `/`, bytes other than
    /// alphanumerics, `.`, `_` and `-` as `%xx`.
    pub fn pin(&self, path: &[u8]) -> PathBuf {
        let mut name = String::new();
        let path = path.strip_prefix(b"/").unwrap_or(path);
        for &b in path {
            if b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-' {
                name.push(b as char);
            } else {
                name.push_str(&format!("%{b:02x}"));
            }
        }
        self.at(&[&"pins", &name])
    }

    /// `attach/`.
    pub fn attach_dir(&self) -> PathBuf {
        self.at(&[&"attach"])
    }
    /// `attach/LINK.PID`.
    pub fn attach_report(&self, link: u32, pid: u32) -> PathBuf {
        self.at(&[&"attach", &format!("{link}.{pid}")])
    }
    /// The link and pid of an attach report's file name.
    pub fn parse_attach_report(name: &str) -> Option<(u32, u32)> {
        let (link, pid) = name.split_once('.')?;
        Some((link.parse().ok()?, pid.parse().ok()?))
    }

    /// `usdt-specs-MAP.lock`.
    pub fn usdt_specs_lock(&self, map_id: u32) -> PathBuf {
        self.at(&[&format!("usdt-specs-{map_id}.lock")])
    }
    /// `trace_pipe`.
    pub fn trace_pipe(&self) -> PathBuf {
        self.at(&[&"trace_pipe"])
    }
    /// `cpus`: the CPU slots.
    pub fn cpus(&self) -> PathBuf {
        self.at(&[&"cpus"])
    }
    /// `stats`.
    pub fn stats(&self) -> PathBuf {
        self.at(&[&"stats"])
    }
    /// `counters/`: the programs' run statistics (see `crate::prog_stats`).
    pub fn counters_dir(&self) -> PathBuf {
        self.at(&[&"counters"])
    }
    /// `counters/PID.START`: the run statistics of process `pid` started at `start`.
    pub fn counters(&self, pid: u32, start: u64) -> PathBuf {
        self.at(&[&"counters", &format!("{pid}.{start}")])
    }
    /// The pid and start time of a `counters/` file name of a process (`PID.START`).
    pub fn parse_counters(name: &str) -> Option<(u32, u64)> {
        let (pid, start) = name.split_once('.')?;
        Some((pid.parse().ok()?, start.parse().ok()?))
    }
    /// `counters/switch`.
    pub fn counters_switch(&self) -> PathBuf {
        self.at(&[&"counters", &"switch"])
    }
    /// `counters/hold-PID.START`.
    pub fn counters_hold(&self, pid: u32, start: u64) -> PathBuf {
        self.at(&[&"counters", &format!("hold-{pid}.{start}")])
    }
    /// `counters/retired.json`.
    pub fn counters_retired(&self) -> PathBuf {
        self.at(&[&"counters", &"retired.json"])
    }
    /// `counters/lock`.
    pub fn counters_lock(&self) -> PathBuf {
        self.at(&[&"counters", &"lock"])
    }

    /// Whether a top-level entry survives the exit of the session's last process while
    /// agents of that process may still watch it (see the syscall server's leave at exit).
    pub fn kept_at_last_exit(name: &OsStr) -> bool {
        name == "lock" || name == "members" || name == "links"
    }
}

/// Makes directory `dir` (and its parents) with mode 0700 if missing.
pub fn make_dir(dir: &Path) -> io::Result<()> {
    super::broker::make_dir(dir)
}

/// The temporary file [`write_atomic`] writes `path`'s contents into: beside it, named
/// `NAME.tmpPID` (a name no reader of the layout parses).
pub fn temp_beside(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".tmp{}", std::process::id()));
    path.with_file_name(name)
}

/// Writes a file by renaming a complete temporary one over it, so readers never see half.
pub fn write_atomic(path: &Path, data: &[u8]) -> io::Result<()> {
    let tmp = temp_beside(path);
    let mut f = fs::File::from(super::broker::open(&tmp, libc::O_CREAT | libc::O_TRUNC | libc::O_WRONLY, 0o600)?);
    f.write_all(data)?;
    drop(f);
    super::broker::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        let l = Layout::new("/s");
        assert_eq!(l.link(7), Path::new("/s/links/7.json"));
        assert_eq!(l.agent(12, 34), Path::new("/s/agents/12.34"));
        assert_eq!(Layout::parse_agent("12.34"), Some((12, 34)));
        assert_eq!(Layout::parse_agent("12.34.tmp"), None);
        assert_eq!(Layout::parse_perf("link-9"), Some(PerfFile::Link(9)));
        assert_eq!(Layout::parse_perf("9"), Some(PerfFile::Event(9)));
        assert_eq!(Layout::parse_perf("owner-9"), None);
        assert_eq!(l.perf_file(PerfFile::Link(9)), l.perf_link(9));
        assert_eq!(Layout::parse_semaphore("sema-5"), Some(5));
        assert_eq!(Layout::parse_semaphore("sema-5.1.2"), None);
        assert!(Layout::is_claim_of_link("sema-5.1.2", 5));
        assert!(!Layout::is_claim_of_link("sema-55.1.2", 5));
        assert!(Layout::is_claim_of_process("sema-5.1.2", 1, 2));
        assert_eq!(l.pin(b"/sys/fs/bpf/a b"), Path::new("/s/pins/sys%2ffs%2fbpf%2fa%20b"));
        assert_eq!(l.pin(b"sys/fs/bpf/a"), l.pin(b"/sys/fs/bpf/a"));
        assert_eq!(Layout::parse_member("1.2.3"), Some((1, 2)));
        assert_eq!(Layout::parse_attach_report("4.5"), Some((4, 5)));
        assert_eq!(Layout::parse_counters("12.34"), Some((12, 34)));
        assert_eq!(Layout::parse_counters("hold-12.34"), None);
        assert_eq!(Layout::parse_counters("retired.json"), None);
        assert_eq!(temp_beside(&l.links_gen()).parent(), Some(l.links_dir().as_path()));
    }
}
