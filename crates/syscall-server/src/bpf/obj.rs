//! Object commands: BTF_LOAD, OBJ_GET_INFO_BY_FD, the *_GET_NEXT_ID and *_GET_FD_BY_ID
//! commands, OBJ_PIN, OBJ_GET and ENABLE_STATS.

use std::mem::offset_of;
use std::path::PathBuf;

use userbpf_object::Btf;

use super::attr::{self, end_of};
use super::info::{BtfInfo, InfoStruct, LinkInfo, MapInfo, ProgInfo, bytes_of, name16};
use super::map::{install_map_fd, map_by_id, map_of_fd};
use super::prog::{VLog, prog_by_id, prog_of_fd, xlated};
use super::{Attr, io_errno, read_user, read_user_str, write_user};
use crate::error::{Context, Error};
use crate::objects::{self, Kind};

/// The kernel's BTF_MAX_SIZE.
const BTF_MAX_SIZE: u32 = 16 * 1024 * 1024;

/// BPF_BTF_LOAD: the BTF is parsed (malformed BTF is refused with `EINVAL` and the reason
/// in the log) and stored in the session.
pub fn btf_load(a: &Attr) -> Result<i64, Error> {
    let at: attr::BtfLoad = a.get(end_of!(attr::BtfLoad, btf_log_true_size))?;
    let (ubtf, log_buf, size, log_size, log_level) =
        (at.btf, at.btf_log_buf, at.btf_size, at.btf_log_size, at.btf_log_level);
    if size > BTF_MAX_SIZE {
        return Err(Error::new(libc::E2BIG, format!("btf_size {size} is over the kernel's limit of {BTF_MAX_SIZE}")));
    }
    let mut log = VLog::new(log_level, log_buf, log_size)?;
    let mut data = vec![0u8; size as usize];
    read_user(ubtf, &mut data).context(|| format!("btf ({size} bytes at {ubtf:#x})"))?;
    let parsed = Btf::parse(&data);
    if log.on() && data.len() >= 24 {
        let u = |o: usize| u32::from_le_bytes(data[o..o + 4].try_into().expect("4 bytes"));
        log.line(&format!(
            "magic: 0x{:x}\nversion: {}\nflags: 0x{:x}\nhdr_len: {}",
            u16::from_le_bytes([data[0], data[1]]),
            data[2],
            data[3],
            u(4)
        ));
        log.line(&format!(
            "type_off: {}\ntype_len: {}\nstr_off: {}\nstr_len: {}\nbtf_total_size: {}",
            u(8),
            u(12),
            u(16),
            u(20),
            data.len()
        ));
    }
    let r = match &parsed {
        Ok(btf) => {
            if log.on() {
                for (id, t) in btf.types() {
                    log.line(&type_line(btf, id, t));
                }
            }
            Ok(())
        }
        Err(e) => {
            // The reason goes into the log, as the kernel's BTF checker writes it there.
            log.line(&format!("{e}"));
            Err(Error::inval(format!("malformed BTF: {e}")))
        }
    };
    let (true_size, lr) = log.finish();
    let _ = a.put_u32(offset_of!(attr::BtfLoad, btf_log_true_size), true_size);
    r?;
    lr.context(|| format!("the BTF log ({true_size} bytes) does not fit btf_log_size {log_size}"))?;
    let session = objects::session()?;
    let id =
        session.add_btf(&data).map_err(|e| Error::new(io_errno(&e), format!("storing the BTF in the session: {e}")))?;
    Ok(objects::install(Kind::Btf, id, &session.layout().btf(id))? as i64)
}

/// One type as the kernel's BTF log prints it (`[ID] KIND name ...`, members indented).
fn type_line(btf: &Btf, id: u32, t: &userbpf_object::btf::BtfType) -> String {
    use userbpf_object::btf::TypeKind;
    let n = btf.name(id);
    let head = format!("[{id}] {} {}", t.kind().name().to_uppercase(), if n.is_empty() { "(anon)" } else { n });
    let name = |off: u32| btf.name_of(off).to_string();
    match &t.kind {
        TypeKind::Int(i) => {
            let enc = match i.encoding {
                1 => "SIGNED",
                2 => "CHAR",
                4 => "BOOL",
                _ => "(none)",
            };
            format!("{head} size={} bits_offset={} nr_bits={} encoding={enc}", i.size, i.offset, i.bits)
        }
        TypeKind::Struct(c) | TypeKind::Union(c) => {
            let mut s = format!("{head} size={} vlen={}", c.size, c.members.len());
            for m in &c.members {
                s.push_str(&format!("\n\t{} type_id={} bits_offset={}", name(m.name_off), m.type_id, m.bit_offset));
                if m.bitfield_size != 0 {
                    s.push_str(&format!(" bitfield_size={}", m.bitfield_size));
                }
            }
            s
        }
        TypeKind::Ptr(r)
        | TypeKind::Typedef(r)
        | TypeKind::Volatile(r)
        | TypeKind::Const(r)
        | TypeKind::Restrict(r)
        | TypeKind::TypeTag(r) => {
            format!("{head} type_id={r}")
        }
        TypeKind::Array(a) => {
            format!("{head} type_id={} index_type_id={} nr_elems={}", a.elem_type, a.index_type, a.nelems)
        }
        TypeKind::Float { size } => format!("{head} size={size}"),
        _ => head,
    }
}

/// The kernel's info copy protocol: the caller's `info_len` bytes beyond what we know must be
/// zero (`E2BIG`); we read the caller's struct (input pointers and lengths), fill it, write
/// back `min(info_len, size)` bytes and the length.
struct Info<T: InfoStruct> {
    /// The caller's struct (input pointers and lengths), then what is written back.
    v: T,
    len: usize,
    uinfo: u64,
}

impl<T: InfoStruct> Info<T> {
    fn read(a: &Attr) -> Result<Info<T>, i32> {
        let size = std::mem::size_of::<T>();
        let at: attr::InfoByFd = a.view();
        let (ulen, uinfo) = (at.info_len as usize, at.info);
        if ulen > size {
            // Checked a page at a time, as bpf_check_uarg_tail_zero (the length is the caller's).
            let mut chunk = [0u8; 4096];
            let mut at = size;
            while at < ulen {
                let n = (ulen - at).min(chunk.len());
                read_user(uinfo + at as u64, &mut chunk[..n])?;
                if chunk[..n].iter().any(|&b| b != 0) {
                    return Err(libc::E2BIG);
                }
                at += n;
            }
        }
        let len = ulen.min(size);
        let mut buf = vec![0u8; size];
        read_user(uinfo, &mut buf[..len])?;
        // SAFETY: `T` is plain data (any bytes are a valid value) of `size` bytes, read
        // unaligned from the buffer of that size.
        let v = unsafe { buf.as_ptr().cast::<T>().read_unaligned() };
        Ok(Info { v, len, uinfo })
    }

    fn finish(&self, a: &Attr) -> Result<i64, i32> {
        write_user(self.uinfo, &bytes_of(&self.v)[..self.len])?;
        a.put_u32(offset_of!(attr::InfoByFd, info_len), self.len as u32)?;
        Ok(0)
    }
}

/// Copies `min(user count, count)` records of `rec` bytes to the user array at `ptr`.
fn copy_array(ptr: u64, user_cnt: u32, data: &[u8], rec: usize) -> Result<(), i32> {
    if user_cnt == 0 || ptr == 0 {
        return Ok(());
    }
    let n = (user_cnt as usize).min(data.len() / rec.max(1));
    write_user(ptr, &data[..n * rec])
}

/// BPF_OBJ_GET_INFO_BY_FD for programs, maps, BTF and links.
pub fn get_info(a: &Attr) -> Result<i64, Error> {
    let at: attr::InfoByFd = a.get(end_of!(attr::InfoByFd, info))?;
    let fd = at.bpf_fd;
    let Some(obj) = objects::get(fd) else {
        // Not ours: EBADF for a closed descriptor, EINVAL for any other file.
        let errno = objects::get_kind(fd, Kind::Map).err().unwrap_or(libc::EINVAL);
        return Err(Error::new(errno, format!("bpf_fd {fd} is not a bpf object")));
    };
    let what = || format!("{} {} (bpf_fd {fd}), info_len {}", obj.kind.name(), obj.id, at.info_len);
    match obj.kind {
        Kind::Prog => prog_info(a, fd).context(what),
        Kind::Map => map_info(a, fd).context(what),
        Kind::Btf => btf_info(a, obj.id).context(what),
        Kind::Link => link_info(a, obj.id).context(what),
        Kind::PerfEvent => Err(Error::inval(format!("bpf_fd {fd} is a perf event"))),
    }
}

fn prog_info(a: &Attr, fd: i32) -> Result<i64, i32> {
    let p = prog_of_fd(fd)?;
    let mut i = Info::<ProgInfo>::read(a)?;
    let u = i.v; // the caller's pointers and counts
    let v = &mut i.v;
    v.r#type = p.prog_type;
    v.id = p.id;
    v.tag = p.tag;
    // No JIT image is exposed: jited_prog_len 0 (as a kernel with the JIT disabled).
    v.jited_prog_len = 0;
    let x = xlated(&p);
    v.xlated_prog_len = x.len() as u32;
    if u.xlated_prog_len != 0 && u.xlated_prog_insns != 0 {
        write_user(u.xlated_prog_insns, &x[..(u.xlated_prog_len as usize).min(x.len())])?;
    }
    v.load_time = p.load_time;
    v.created_by_uid = p.uid;
    let ids: Vec<u32> = p.map_ids.lock().unwrap_or_else(|e| e.into_inner()).clone();
    v.nr_map_ids = ids.len() as u32;
    let idb: Vec<u8> = ids.iter().flat_map(|v| v.to_ne_bytes()).collect();
    copy_array(u.map_ids, u.nr_map_ids, &idb, 4)?;
    v.name = name16(&p.name);
    v.ifindex = 0;
    v.gpl_compatible = u32::from(p.gpl);
    v.nr_jited_ksyms = 0;
    v.nr_jited_func_lens = 0;
    v.btf_id = p.btf_id;
    // func_info (records of 8 bytes) and line_info (16 bytes).
    let nf = if p.func_info_rec_size != 0 { p.func_info.len() / p.func_info_rec_size as usize } else { 0 };
    v.nr_func_info = nf as u32;
    if u.nr_func_info != 0 {
        if u.func_info_rec_size != 8 {
            return Err(libc::EINVAL);
        }
        let recs: Vec<u8> = p
            .func_info
            .chunks(p.func_info_rec_size.max(1) as usize)
            .flat_map(|c| c[..8.min(c.len())].to_vec())
            .collect();
        copy_array(u.func_info, u.nr_func_info, &recs, 8)?;
    }
    v.func_info_rec_size = 8;
    let nl = if p.line_info_rec_size != 0 { p.line_info.len() / p.line_info_rec_size as usize } else { 0 };
    v.nr_line_info = nl as u32;
    if u.nr_line_info != 0 {
        if u.line_info_rec_size != 16 {
            return Err(libc::EINVAL);
        }
        let recs: Vec<u8> = p
            .line_info
            .chunks(p.line_info_rec_size.max(1) as usize)
            .flat_map(|c| c[..16.min(c.len())].to_vec())
            .collect();
        copy_array(u.line_info, u.nr_line_info, &recs, 16)?;
    }
    v.line_info_rec_size = 16;
    v.nr_jited_line_info = 0;
    v.jited_line_info_rec_size = 0;
    v.nr_prog_tags = 1;
    copy_array(u.prog_tags, u.nr_prog_tags, &p.tag, 8)?;
    // Run statistics: the session's processes' (the targets', those gone included, see
    // `userbpf_runtime::prog_stats`) plus this process's own runs, which stay here.
    let (mut run_ns, mut run_cnt, mut misses) = match userbpf_runtime::program_table::get(p.id) {
        Some(lp) => {
            use std::sync::atomic::Ordering::Relaxed;
            (lp.stats.run_time_ns.load(Relaxed), lp.stats.run_cnt.load(Relaxed), lp.stats.missed.load(Relaxed))
        }
        None => (0, 0, 0),
    };
    if let Ok(session) = objects::session()
        && let Ok(snap) = userbpf_runtime::prog_stats::read(session.layout())
        && let Some(t) = snap.totals().get(&p.id)
    {
        (run_ns, run_cnt, misses) = (run_ns + t.run_time_ns, run_cnt + t.run_cnt, misses + t.missed);
    }
    (v.run_time_ns, v.run_cnt, v.recursion_misses) = (run_ns, run_cnt, misses);
    v.verified_insns = p.insns.len() as u32;
    v.attach_btf_obj_id = 0;
    v.attach_btf_id = 0;
    i.finish(a)
}

fn map_info(a: &Attr, fd: i32) -> Result<i64, i32> {
    let e = map_of_fd(fd)?;
    let s = e.map.spec();
    let mut i = Info::<MapInfo>::read(a)?;
    i.v = MapInfo {
        r#type: e.map_type,
        id: e.map.id(),
        key_size: s.key_size,
        value_size: s.value_size,
        max_entries: s.max_entries,
        map_flags: e.map_flags,
        name: name16(&s.name),
        btf_id: e.btf_id,
        btf_key_type_id: e.btf_key_type_id,
        btf_value_type_id: e.btf_value_type_id,
        map_extra: e.map_extra,
        ..MapInfo::default()
    };
    i.finish(a)
}

fn btf_info(a: &Attr, id: u32) -> Result<i64, i32> {
    // The kernel's own BTF (vmlinux, modules) has its name and kernel_btf = 1; BTF loaded
    // by a program has an empty name and kernel_btf = 0.
    let kernel = super::kbtf::recorded_name(id);
    let data = match &kernel {
        Some(name) => super::kbtf::data(name)?,
        None => objects::session()?.btf(id).map_err(|e| io_errno(&e))?,
    };
    let mut i = Info::<BtfInfo>::read(a)?;
    let u = i.v;
    let n = (u.btf_size as usize).min(data.len());
    if n > 0 {
        write_user(u.btf, &data[..n])?;
    }
    i.v.btf_size = data.len() as u32;
    i.v.id = id;
    let (uname, uname_len) = (u.name, u.name_len);
    if (uname == 0) != (uname_len == 0) {
        return Err(libc::EINVAL);
    }
    let name = kernel.as_deref().unwrap_or("").as_bytes();
    i.v.name_len = name.len() as u32;
    i.v.kernel_btf = u32::from(kernel.is_some());
    // As the kernel: the name and its NUL when they fit, else as much as fits, NUL-ended,
    // and ENOSPC (after the info is written back).
    let mut short = false;
    if uname != 0 {
        let fit = (uname_len as usize).min(name.len() + 1);
        let mut b = name[..fit - 1].to_vec();
        b.push(0);
        write_user(uname, &b)?;
        short = (uname_len as usize) < name.len() + 1;
    }
    i.finish(a)?;
    if short {
        return Err(libc::ENOSPC);
    }
    Ok(0)
}

/// bpf_link_type values.
pub const BPF_LINK_TYPE_RAW_TRACEPOINT: u32 = 1;
pub const BPF_LINK_TYPE_PERF_EVENT: u32 = 7;

fn link_info(a: &Attr, id: u32) -> Result<i64, i32> {
    let session = objects::session()?;
    let rec = session.links().map_err(|e| io_errno(&e))?.into_iter().find(|l| l.id == id);
    let mut i = Info::<LinkInfo>::read(a)?;
    let (ltype, prog_id) = match &rec {
        Some(r) if r.kind == "raw_tracepoint" => (BPF_LINK_TYPE_RAW_TRACEPOINT, r.prog_id),
        Some(r) => (BPF_LINK_TYPE_PERF_EVENT, r.prog_id),
        // Detached: the kernel keeps the link object (with its program) until its last fd
        // is closed; what we know is in the detached record, if any.
        None => (
            BPF_LINK_TYPE_PERF_EVENT,
            crate::attach::bpf_link_prog(id).or_else(|| super::link::detached_prog(id)).unwrap_or(0),
        ),
    };
    (i.v.r#type, i.v.id, i.v.prog_id) = (ltype, id, prog_id);
    if ltype == BPF_LINK_TYPE_RAW_TRACEPOINT {
        let name = rec.as_ref().and_then(|r| r.func.clone()).unwrap_or_default();
        let (uname, ulen) = (i.v.tp_name, i.v.tp_name_len);
        let mut b = name.into_bytes();
        b.push(0);
        i.v.tp_name_len = b.len() as u32;
        if uname != 0 && ulen != 0 {
            let n = (ulen as usize).min(b.len());
            let mut part = b[..n].to_vec();
            if let Some(last) = part.last_mut() {
                *last = 0;
            }
            write_user(uname, &part)?;
            if (ulen as usize) < b.len() {
                return Err(libc::ENOSPC);
            }
        }
    }
    i.finish(a)
}

/// Ids of the session's objects of `kind`, ascending.
pub fn ids_of(kind: Kind) -> Result<Vec<u32>, i32> {
    let session = objects::session()?;
    let mut v: Vec<u32> = match kind {
        Kind::Map => session.maps().map_err(|e| io_errno(&e))?.iter().map(|r| r.id).collect(),
        Kind::Prog => session.progs().map_err(|e| io_errno(&e))?.iter().map(|r| r.id).collect(),
        Kind::Link => session.links().map_err(|e| io_errno(&e))?.iter().map(|r| r.id).collect(),
        Kind::Btf => std::fs::read_dir(session.layout().btf_dir())
            .map_err(|e| io_errno(&e))?
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .chain(super::kbtf::all()?.into_iter().map(|(id, _)| id))
            .collect(),
        Kind::PerfEvent => Vec::new(),
    };
    v.sort_unstable();
    Ok(v)
}

/// BPF_{PROG,MAP,BTF,LINK}_GET_NEXT_ID: the smallest id above `start_id`, or `ENOENT`.
pub fn next_id(a: &Attr, kind: Kind) -> Result<i64, Error> {
    let at: attr::GetId = a.get(end_of!(attr::GetId, open_flags))?;
    let start = at.start_id;
    if start >= i32::MAX as u32 {
        return Err(libc::ENOENT.into());
    }
    let next = ids_of(kind)?.into_iter().find(|&i| i > start).ok_or(libc::ENOENT)?;
    a.put_u32(offset_of!(attr::GetId, next_id), next)?;
    Ok(0)
}

/// BPF_{PROG,MAP,BTF,LINK}_GET_FD_BY_ID.
pub fn fd_by_id(a: &Attr, kind: Kind) -> Result<i64, Error> {
    let at: attr::GetId = a.get(end_of!(attr::GetId, open_flags))?;
    let (id, open_flags) = (at.start_id, at.open_flags);
    const BPF_F_RDONLY: u32 = 1 << 3;
    const BPF_F_WRONLY: u32 = 1 << 4;
    let allowed = if kind == Kind::Map { BPF_F_RDONLY | BPF_F_WRONLY } else { 0 };
    if open_flags & !allowed != 0 || open_flags == BPF_F_RDONLY | BPF_F_WRONLY {
        return Err(Error::inval(format!("open_flags {open_flags:#x} invalid for a {}", kind.name())));
    }
    Ok(install_by_id(kind, id)? as i64)
}

/// A new descriptor of the session object `kind`/`id`; `ENOENT` if there is none.
pub fn install_by_id(kind: Kind, id: u32) -> Result<i32, i32> {
    let session = objects::session()?;
    match kind {
        Kind::Map => {
            let e = map_by_id(id)?;
            install_map_fd(id, e.map.map_type())
        }
        Kind::Prog => {
            prog_by_id(id)?;
            objects::install(Kind::Prog, id, &session.layout().prog(id)).map_err(not_found)
        }
        Kind::Btf => match super::kbtf::name_of(id)? {
            Some(name) => super::kbtf::install(id, &name).map_err(not_found),
            None => objects::install(Kind::Btf, id, &session.layout().btf(id)).map_err(not_found),
        },
        Kind::Link => {
            // Perf links open the perf module's link file; raw tracepoint links their record.
            let perf = crate::attach::link_file(id);
            let path = if perf.exists() { perf } else { session.layout().link(id) };
            objects::install(Kind::Link, id, &path).map_err(not_found)
        }
        Kind::PerfEvent => Err(libc::ENOENT),
    }
}

fn not_found(e: i32) -> i32 {
    if e == libc::ENOENT { libc::ENOENT } else { e }
}

/// Where pins of path `p` are recorded in the session (one file per pinned path).
fn pin_file(p: &[u8]) -> Result<PathBuf, i32> {
    let session = objects::session()?;
    std::fs::create_dir_all(session.layout().pins_dir()).map_err(|e| io_errno(&e))?;
    Ok(session.layout().pin(p))
}

/// A pin path, normalised: absolute, under the BPF filesystem (`/sys/fs/bpf`), without `.`
/// or `..` components. Others are refused as the kernel refuses a path outside a bpffs
/// (`EPERM`).
fn pin_path(a: &Attr) -> Result<Vec<u8>, Error> {
    let raw = read_user_str(a.view::<attr::Obj>().pathname, 4096)
        .map_err(|e| if e == libc::EINVAL { libc::ENAMETOOLONG } else { e })
        .context(|| "pathname")?;
    if raw.is_empty() {
        return Err(Error::new(libc::ENOENT, "empty pathname"));
    }
    let norm = normalise(&raw);
    if raw[0] != b'/' || !norm.starts_with(b"sys/fs/bpf/") {
        return Err(Error::new(
            libc::EPERM,
            format!("{}: not under the BPF filesystem (/sys/fs/bpf)", String::from_utf8_lossy(&raw)),
        ));
    }
    Ok(norm)
}

/// A path without its leading `/`, `.` and `..` components.
fn normalise(raw: &[u8]) -> Vec<u8> {
    let mut parts: Vec<&[u8]> = Vec::new();
    for c in raw.split(|&b| b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    parts.join(&b'/')
}

/// Whether the absolute path `raw` is the BPF filesystem's directory (`/sys/fs/bpf`) or lies
/// below it: there pins are the session's, so `statfs` reports the BPF filesystem (libbpf
/// checks that before it pins a map, program or link) whether or not a bpffs is mounted.
pub fn on_bpffs(raw: &[u8]) -> bool {
    let norm = normalise(raw);
    raw.first() == Some(&b'/') && (norm == b"sys/fs/bpf" || norm.starts_with(b"sys/fs/bpf/"))
}

/// BPF_OBJ_PIN: records the pin in the session (the real BPF filesystem is not touched).
pub fn pin(a: &Attr) -> Result<i64, Error> {
    let at: attr::Obj = a.get(end_of!(attr::Obj, path_fd))?;
    if at.file_flags != 0 {
        return Err(Error::inval(format!("file_flags {:#x}: none are known for a pin", at.file_flags)));
    }
    let fd = at.bpf_fd;
    let Some(obj) = objects::get(fd) else {
        let errno = objects::get_kind(fd, Kind::Map).err().unwrap_or(libc::EINVAL);
        return Err(Error::new(errno, format!("bpf_fd {fd} is not a bpf object")));
    };
    if obj.kind == Kind::PerfEvent {
        return Err(Error::inval(format!("bpf_fd {fd} is a perf event, which cannot be pinned")));
    }
    let path = pin_path(a)?;
    let file = pin_file(&path)?;
    let text = format!("{} {}\n", obj.kind.name(), obj.id);
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&file)
        .map_err(|e| Error::new(io_errno(&e), format!("/{}: {e}", String::from_utf8_lossy(&path))))?;
    f.write_all(text.as_bytes()).map_err(|e| io_errno(&e))?;
    if obj.kind == Kind::Map {
        // A pinned map keeps the session (and so its pins) when every process has left,
        // as a pin in the BPF filesystem outlives its loader.
        let path = String::from_utf8_lossy(&pin_path(a)?).into_owned();
        mark_pinned(obj.id, &format!("/{path}"))?;
    }
    Ok(0)
}

/// Records the pin in the map's session record (`MapRecord::pinned`).
fn mark_pinned(id: u32, path: &str) -> Result<(), i32> {
    let session = objects::session()?;
    let Some(mut rec) = session.maps().map_err(|e| io_errno(&e))?.into_iter().find(|r| r.id == id) else {
        return Ok(());
    };
    if rec.pinned.is_some() {
        return Ok(());
    }
    rec.pinned = Some(path.to_string());
    let json = serde_json::to_vec_pretty(&rec).map_err(|_| libc::EINVAL)?;
    userbpf_runtime::session::layout::write_atomic(&session.layout().map_record(id), &json).map_err(|e| io_errno(&e))
}

/// BPF_OBJ_GET: a new descriptor of the object pinned at the path.
pub fn obj_get(a: &Attr) -> Result<i64, Error> {
    let at: attr::Obj = a.get(end_of!(attr::Obj, path_fd))?;
    if at.bpf_fd != 0 {
        return Err(Error::inval("bpf_fd must be 0 for OBJ_GET"));
    }
    const BPF_F_RDONLY: u32 = 1 << 3;
    const BPF_F_WRONLY: u32 = 1 << 4;
    let flags = at.file_flags;
    if flags & !(BPF_F_RDONLY | BPF_F_WRONLY) != 0 || flags == BPF_F_RDONLY | BPF_F_WRONLY {
        return Err(Error::inval(format!("file_flags {flags:#x} invalid")));
    }
    let path = pin_path(a)?;
    let shown = || format!("/{}", String::from_utf8_lossy(&path));
    let file = pin_file(&path)?;
    let text = std::fs::read_to_string(&file).map_err(|e| Error::new(io_errno(&e), format!("{}: {e}", shown())))?;
    let bad = || Error::inval(format!("{}: the session's pin record {} is malformed", shown(), file.display()));
    let (kind, id) = text.trim().split_once(' ').ok_or_else(bad)?;
    let id: u32 = id.parse().map_err(|_| bad())?;
    let kind = match kind {
        "map" => Kind::Map,
        "prog" => Kind::Prog,
        "btf" => Kind::Btf,
        "link" => Kind::Link,
        _ => return Err(bad()),
    };
    Ok(install_by_id(kind, id).context(|| format!("{}: {} {id}", shown(), kind.name()))? as i64)
}

/// BPF_ENABLE_STATS: run statistics are always kept here; the descriptor the kernel hands
/// out (stats stay on while it is open) is a descriptor of a session file.
pub fn enable_stats(a: &Attr) -> Result<i64, Error> {
    let at: attr::EnableStats = a.get(end_of!(attr::EnableStats, r#type))?;
    if at.r#type != 0 {
        return Err(Error::inval(format!("type {}: only BPF_STATS_RUN_TIME (0) exists", at.r#type)));
    }
    userbpf_runtime::program::set_stats_enabled(true);
    let session = objects::session()?;
    // The targets count too, while this loader lives (the kernel's stay on while the
    // descriptor is open; the session's hold is let go when this process is gone).
    let hold = userbpf_runtime::prog_stats::hold_run_stats(session.layout()).map_err(|e| io_errno(&e))?;
    std::mem::forget(hold);
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(session.layout().stats())
        .map_err(|e| io_errno(&e))?;
    use std::os::fd::IntoRawFd;
    Ok(f.into_raw_fd() as i64)
}
