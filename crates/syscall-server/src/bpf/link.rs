//! Attachment commands: LINK_CREATE, LINK_DETACH, LINK_UPDATE, PROG_ATTACH/PROG_DETACH,
//! RAW_TRACEPOINT_OPEN, PROG_QUERY and TASK_FD_QUERY.

use std::collections::HashMap;
use std::mem::offset_of;

use userbpf_runtime::LinkRecord;

use super::attr::{self, end_of};
use super::prog::{
    BPF_PROG_TYPE_KPROBE, BPF_PROG_TYPE_PERF_EVENT, BPF_PROG_TYPE_RAW_TRACEPOINT, BPF_PROG_TYPE_TRACEPOINT, prog_of_fd,
};
use super::{Attr, io_errno, read_user_str, write_user};
use crate::error::{Context, Error};
use crate::objects::{self, Kind};

/// enum bpf_attach_type values used here.
pub const BPF_TRACE_RAW_TP: u32 = 23;
pub const BPF_PERF_EVENT: u32 = 41;
pub const BPF_TRACE_KPROBE_MULTI: u32 = 42;

/// Links created by this process: id -> program id (info on a link whose record is gone).
fn created() -> std::sync::MutexGuard<'static, HashMap<u32, u32>> {
    crate::server::server().links.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner())
}

/// The program of a link created here whose session record is gone.
pub fn detached_prog(id: u32) -> Option<u32> {
    created().get(&id).copied()
}

/// BPF_LINK_CREATE. Perf event links (uprobes, tracepoints, software events) go to
/// [`crate::perf_event::attach`]; kprobe multi-links need the kernel's fprobes (a kernel
/// without them answers `EOPNOTSUPP`); other attach types do not exist for the program types
/// the runtime runs (`EINVAL`).
pub fn create(a: &Attr) -> Result<i64, Error> {
    let at: attr::LinkCreate = a.get(std::mem::size_of::<attr::LinkCreate>())?;
    let p = prog_of_fd(at.prog_fd).context(|| format!("prog_fd {}", at.prog_fd))?;
    let (target_fd, attach_type, flags) = (at.target_fd, at.attach_type, at.flags);
    match attach_type {
        BPF_PERF_EVENT => {
            if !matches!(p.prog_type, BPF_PROG_TYPE_KPROBE | BPF_PROG_TYPE_TRACEPOINT | BPF_PROG_TYPE_PERF_EVENT) {
                return Err(Error::inval(format!("a program of type {} cannot attach to a perf event", p.prog_type)));
            }
            if flags != 0 {
                return Err(Error::inval(format!("flags {flags:#x} unknown")));
            }
            // The perf event: EBADF for anything but one of ours (as perf_event_get).
            objects::get_kind(target_fd, Kind::PerfEvent)
                .map_err(|_| Error::new(libc::EBADF, format!("target_fd {target_fd} is not a perf event")))?;
            let cookie = at.bpf_cookie;
            let (id, path) = super::events::perf_attach(target_fd, p.id, cookie)
                .context(|| format!("attaching to perf event fd {target_fd}"))?;
            created().insert(id, p.id);
            Ok(objects::install(Kind::Link, id, &path)? as i64)
        }
        BPF_TRACE_KPROBE_MULTI => {
            if p.prog_type != BPF_PROG_TYPE_KPROBE || p.expected_attach_type != BPF_TRACE_KPROBE_MULTI {
                return Err(Error::inval(
                    "kprobe multi-links are for kprobe programs loaded with expected_attach_type BPF_TRACE_KPROBE_MULTI",
                ));
            }
            Err(Error::new(libc::EOPNOTSUPP, "kprobe multi-links need the kernel's fprobes"))
        }
        _ => Err(Error::inval(format!("attach_type {attach_type} is not one the runtime's program types attach with"))),
    }
}

/// BPF_LINK_DETACH: perf event and raw tracepoint links have no detach operation in the
/// kernel (`EOPNOTSUPP`); they go when their last descriptor is closed.
pub fn detach(a: &Attr) -> Result<i64, Error> {
    let at: attr::LinkDetach = a.get(end_of!(attr::LinkDetach, link_fd))?;
    objects::get_kind(at.link_fd, Kind::Link).context(|| format!("link_fd {}", at.link_fd))?;
    Err(Error::new(libc::EOPNOTSUPP, "perf event and raw tracepoint links have no detach: close them"))
}

/// BPF_LINK_UPDATE: no link type here can change its program (`EINVAL`, as the kernel for
/// links without `update_prog`).
pub fn update(a: &Attr) -> Result<i64, Error> {
    let at: attr::LinkUpdate = a.get(end_of!(attr::LinkUpdate, old_prog_fd))?;
    objects::get_kind(at.link_fd, Kind::Link).context(|| format!("link_fd {}", at.link_fd))?;
    let flags = at.flags;
    if flags & !4 != 0 {
        return Err(Error::inval(format!("flags {flags:#x} unknown")));
    }
    prog_of_fd(at.new_prog_fd).context(|| format!("new_prog_fd {}", at.new_prog_fd))?;
    Err(Error::inval("no link here can change its program"))
}

/// BPF_PROG_ATTACH / BPF_PROG_DETACH attach cgroup, socket, flow dissector and lirc programs:
/// none of those types runs here, so every attach type is one this "kernel" lacks (`EINVAL`).
pub fn prog_attach(a: &Attr, cmd: i32) -> Result<i64, Error> {
    let _: attr::ProgAttach = a.get(end_of!(attr::ProgAttach, replace_bpf_fd))?;
    Err(Error::inval(format!(
        "{}: cgroup, socket, flow dissector and lirc programs do not run here",
        super::cmd_name(cmd)
    )))
}

/// BPF_RAW_TRACEPOINT_OPEN: the system call raw tracepoints the agent serves (`sys_enter`,
/// `sys_exit`) become session links; other names do not exist here (`ENOENT`).
pub fn raw_tracepoint_open(a: &Attr) -> Result<i64, Error> {
    let at: attr::RawTracepointOpen = a.get(end_of!(attr::RawTracepointOpen, prog_fd))?;
    let p = prog_of_fd(at.prog_fd).context(|| format!("prog_fd {}", at.prog_fd))?;
    if p.prog_type != BPF_PROG_TYPE_RAW_TRACEPOINT {
        return Err(Error::inval(format!("program type {} is not a raw tracepoint program", p.prog_type)));
    }
    let uname = at.name;
    if uname == 0 {
        return Err(Error::inval("no tracepoint name"));
    }
    let name = read_user_str(uname, 128)
        .map_err(|e| if e == libc::EINVAL { libc::EFAULT } else { e })
        .context(|| "the tracepoint name")?;
    let name = String::from_utf8_lossy(&name).into_owned();
    if name != "sys_enter" && name != "sys_exit" {
        return Err(Error::new(
            libc::ENOENT,
            format!("raw tracepoint {name:?}: only sys_enter and sys_exit exist here"),
        ));
    }
    let session = objects::session()?;
    let rec = LinkRecord {
        id: 0,
        prog_id: p.id,
        kind: "raw_tracepoint".into(),
        path: String::new(),
        func: Some(name),
        offset: 0,
        cookie: 0,
        pid: None,
    };
    let rec = session.add_link(rec).map_err(|e| io_errno(&e))?;
    created().insert(rec.id, p.id);
    Ok(objects::install(Kind::Link, rec.id, &session.layout().link(rec.id))? as i64)
}

/// BPF_PROG_QUERY: queries cgroup, netns and device attachments, none of which exist here.
pub fn prog_query(a: &Attr) -> Result<i64, Error> {
    // Up to `prog_cnt`, with the padding after it (where newer kernels have more fields).
    let _: attr::ProgQuery = a.get(std::mem::size_of::<attr::ProgQuery>())?;
    Err(Error::inval("no cgroup, netns or device attachments here"))
}

/// BPF_TASK_FD_QUERY for this process's descriptors: perf events with a program (uprobes:
/// `BPF_FD_TYPE_UPROBE`/`URETPROBE` with the file and offset; tracepoints:
/// `BPF_FD_TYPE_TRACEPOINT` with the name) and raw tracepoint links (`BPF_FD_TYPE_RAW_TRACEPOINT`
/// with the name). An event without a program is `ENOENT`, a software event's program
/// `EOPNOTSUPP`, other descriptors `ENOTSUPP`, as the kernel answers.
pub fn task_fd_query(a: &Attr) -> Result<i64, Error> {
    let at: attr::TaskFdQuery = a.get(end_of!(attr::TaskFdQuery, probe_addr))?;
    let (pid, fd, flags, buf_len, buf) = (at.pid, at.fd, at.flags, at.buf_len, at.buf);
    if flags != 0 {
        return Err(Error::inval(format!("flags {flags:#x} unknown")));
    }
    if pid != std::process::id() {
        // Descriptors of other processes: their events live in those processes.
        return Err(Error::new(libc::ENOENT, format!("pid {pid}: only the loader's own descriptors are known here")));
    }
    let obj = objects::get(fd).ok_or(libc::EBADF)?;
    const BPF_FD_TYPE_RAW_TRACEPOINT: u32 = 0;
    const BPF_FD_TYPE_TRACEPOINT: u32 = 1;
    const BPF_FD_TYPE_UPROBE: u32 = 4;
    const BPF_FD_TYPE_URETPROBE: u32 = 5;
    if obj.kind == Kind::PerfEvent {
        use crate::perf_event::Spec;
        let found = crate::perf_event::with_events(|evs| {
            evs.iter().find(|e| e.id == obj.id).map(|e| (e.spec.clone(), e.prog, e.bpf_links.clone()))
        });
        let (spec, prog, links) = found.ok_or(libc::EBADF)?;
        // (The link table is looked up outside the events' lock.)
        let prog = prog.or_else(|| links.iter().find_map(|l| crate::attach::bpf_link_prog(*l))).ok_or(libc::ENOENT)?;
        let (fd_type, name, offset) = match spec {
            Spec::Uprobe { path, file_offset, retprobe, .. } => {
                (if retprobe { BPF_FD_TYPE_URETPROBE } else { BPF_FD_TYPE_UPROBE }, path, file_offset)
            }
            Spec::Tracepoint { func, .. } => {
                (BPF_FD_TYPE_TRACEPOINT, func.rsplit('/').next().unwrap_or(&func).to_string(), 0)
            }
            _ => return Err(Error::new(libc::EOPNOTSUPP, "a software event's program")),
        };
        a.put_u32(offset_of!(attr::TaskFdQuery, prog_id), prog)?;
        a.put_u32(offset_of!(attr::TaskFdQuery, fd_type), fd_type)?;
        a.put_u64(offset_of!(attr::TaskFdQuery, probe_offset), offset)?;
        a.put_u64(offset_of!(attr::TaskFdQuery, probe_addr), 0)?;
        return Ok(copy_name(a, buf, buf_len, &name)?);
    }
    if obj.kind != Kind::Link {
        return Err(userbpf_maps::ENOTSUPP.into());
    }
    let session = objects::session()?;
    let rec = session.links().map_err(|e| io_errno(&e))?.into_iter().find(|l| l.id == obj.id).ok_or(libc::ENOENT)?;
    if rec.kind != "raw_tracepoint" {
        return Err(userbpf_maps::ENOTSUPP.into());
    }
    a.put_u32(offset_of!(attr::TaskFdQuery, prog_id), rec.prog_id)?;
    a.put_u32(offset_of!(attr::TaskFdQuery, fd_type), BPF_FD_TYPE_RAW_TRACEPOINT)?;
    Ok(copy_name(a, buf, buf_len, &rec.func.clone().unwrap_or_default())?)
}

/// The name of a TASK_FD_QUERY answer: `buf_len` gets the name's length; the buffer, if
/// any, as much as fits with a NUL (`ENOSPC` when cut).
fn copy_name(a: &Attr, buf: u64, buf_len: u32, name: &str) -> Result<i64, i32> {
    let mut b = name.as_bytes().to_vec();
    b.push(0);
    let needed = b.len() as u32 - 1;
    a.put_u32(offset_of!(attr::TaskFdQuery, buf_len), needed)?;
    if buf != 0 && buf_len != 0 {
        let n = (buf_len as usize).min(b.len());
        let mut part = b[..n].to_vec();
        if let Some(last) = part.last_mut() {
            *last = 0;
        }
        write_user(buf, &part)?;
        if buf_len < needed + 1 {
            return Err(libc::ENOSPC);
        }
    }
    Ok(0)
}
