//! Map commands: MAP_CREATE, the element operations, the batch operations and MAP_FREEZE.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use userbpf_maps::{ENOTSUPP, MapSpec, MapType};
use userbpf_runtime::MapRecord;

use std::mem::offset_of;

use super::attr::{self, end_of};
use super::{Attr, MapEntry, io_errno, read_user, state, write_user};
use crate::error::{Context, Error};
use crate::objects::{self, Kind};

/// The kernel's BPF_MAP_TYPE_CGROUP_ARRAY (the maps crate's own type: an update's value is a
/// cgroup2 directory's descriptor in this process, stored as the cgroup's id, which
/// `bpf_current_task_under_cgroup` checks in the targets).
pub const BPF_MAP_TYPE_CGROUP_ARRAY: u32 = MapType::BPF_MAP_TYPE_CGROUP_ARRAY as u32;

const BPF_F_LOCK: u64 = 4;
const BPF_F_RDONLY: u32 = 1 << 3;
const BPF_F_WRONLY: u32 = 1 << 4;
const BPF_F_INNER_MAP: u32 = 1 << 12;

/// The kernel's `bpf_obj_name_cpy`: letters, digits, `_` and `.`, at most 15 bytes.
pub fn check_name(name: &[u8], field_len: usize) -> Result<String, Error> {
    if name.len() >= field_len || !name.iter().all(|&b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.') {
        return Err(Error::inval(format!(
            "name {:?}: letters, digits, '_' and '.' only, at most {} bytes",
            String::from_utf8_lossy(name),
            field_len - 1
        )));
    }
    Ok(String::from_utf8_lossy(name).into_owned())
}

fn map_errno(e: userbpf_maps::MapError) -> i32 {
    e.errno()
}

/// BPF_MAP_CREATE.
pub fn create(a: &Attr) -> Result<i64, Error> {
    let at: attr::MapCreate = a.get(end_of!(attr::MapCreate, map_extra))?;
    let (map_type, key_size, value_size, max_entries, map_flags) =
        (at.map_type, at.key_size, at.value_size, at.max_entries, at.map_flags);
    let inner_map_fd = at.inner_map_fd;
    let name = check_name(&attr::c_name(&at.map_name), 16)?;
    let (ifindex, btf_fd, btf_key, btf_value, btf_vmlinux_value) =
        (at.map_ifindex, at.btf_fd, at.btf_key_type_id, at.btf_value_type_id, at.btf_vmlinux_value_type_id);
    let map_extra = at.map_extra;
    if ifindex != 0 {
        // Offload to a device: no device here.
        return Err(Error::inval(format!("map_ifindex {ifindex}: no device to offload to")));
    }
    if btf_vmlinux_value != 0 {
        // Only struct_ops maps, which need the kernel's BTF.
        return Err(Error::inval("btf_vmlinux_value_type_id is for struct_ops maps, which need the kernel"));
    }
    if map_flags & (1 << 2) != 0 && at.numa_node != 0 && at.numa_node != u32::MAX {
        // BPF_F_NUMA_NODE: node 0 (or NUMA_NO_NODE) is all there is here.
        return Err(Error::inval(format!("numa_node {}: node 0 is all there is", at.numa_node)));
    }
    let map_type = MapType::from_u32(map_type).ok_or_else(|| Error::inval(format!("map_type {map_type} unknown")))?;
    let inner = match map_type {
        MapType::BPF_MAP_TYPE_ARRAY_OF_MAPS | MapType::BPF_MAP_TYPE_HASH_OF_MAPS => {
            let inner = map_of_fd(inner_map_fd).context(|| format!("inner_map_fd {inner_map_fd}"))?;
            if matches!(
                inner.map.map_type(),
                MapType::BPF_MAP_TYPE_ARRAY_OF_MAPS
                    | MapType::BPF_MAP_TYPE_HASH_OF_MAPS
                    | MapType::BPF_MAP_TYPE_PROG_ARRAY
            ) {
                return Err(Error::inval(format!(
                    "inner_map_fd {inner_map_fd}: a map of maps or a program array cannot be an inner map"
                )));
            }
            let s = inner.map.spec();
            Some((inner.map_type, s.key_size, s.value_size, s.max_entries, inner.map_flags))
        }
        _ => None,
    };
    let btf_id = if btf_fd != 0 || btf_key != 0 || btf_value != 0 {
        if btf_value == 0 && btf_key != 0 {
            return Err(Error::inval("btf_key_type_id without btf_value_type_id"));
        }
        let id = objects::get_kind(btf_fd, Kind::Btf).context(|| format!("btf_fd {btf_fd}"))?.id;
        // The kernel's own BTF cannot describe a map (as the kernel answers).
        if super::kbtf::is_kernel(id) {
            return Err(Error::new(
                libc::EACCES,
                format!("btf_fd {btf_fd} is the kernel's BTF, which cannot describe a map"),
            ));
        }
        Some(id)
    } else {
        None
    };
    let spec = MapSpec {
        map_type,
        key_size,
        value_size,
        max_entries,
        map_flags: map_flags & !BPF_F_INNER_MAP,
        map_extra,
        name: name.clone(),
    };
    let session = objects::session()?;
    let record = MapRecord {
        id: 0,
        name,
        btf_id,
        key_type_id: btf_id.map(|_| btf_key).filter(|&k| k != 0),
        value_type_id: btf_id.map(|_| btf_value).filter(|&v| v != 0),
        object: None,
        pinned: None,
    };
    let (record, map) = session.create_map(&spec, record).map_err(|e| {
        let errno = match &e {
            userbpf_runtime::SessionError::Map(m) => m.errno(),
            userbpf_runtime::SessionError::Io(e) => io_errno(e),
            _ => libc::EINVAL,
        };
        Error::new(errno, e.to_string())
    })?;
    let id = record.id;
    let map = Arc::new(map);
    userbpf_runtime::helpers::maps::register_map(id, map.clone());
    super::events::map_created(id, &map);
    let entry = Arc::new(MapEntry {
        map: map.clone(),
        map_type: map_type as u32,
        btf_id: btf_id.unwrap_or(0),
        btf_key_type_id: btf_key,
        btf_value_type_id: btf_value,
        map_flags,
        map_extra,
        inner,
        frozen: Default::default(),
    });
    state().maps.insert(id, entry);
    Ok(install_map_fd(id, map_type)? as i64)
}

/// A new descriptor of map `id` (ring buffers get the pollable path the mmap module keeps).
pub fn install_map_fd(id: u32, t: MapType) -> Result<i32, i32> {
    let session = objects::session()?;
    let path =
        if t == MapType::BPF_MAP_TYPE_RINGBUF { super::events::ringbuf_fd_path(id)? } else { session.map_path(id) };
    objects::install(Kind::Map, id, &path)
}

/// The map with session id `id`, opened in this process if it was not yet.
pub fn map_by_id(id: u32) -> Result<Arc<MapEntry>, i32> {
    if let Some(e) = state().maps.get(&id) {
        return Ok(e.clone());
    }
    let session = objects::session()?;
    let map = session.open_map(id).map_err(|_| libc::ENOENT)?;
    let record = session.maps().ok().and_then(|v| v.into_iter().find(|r| r.id == id));
    let spec = map.spec().clone();
    let map = Arc::new(map);
    userbpf_runtime::helpers::maps::register_map(id, map.clone());
    let entry = Arc::new(MapEntry {
        map_type: map.map_type() as u32,
        map,
        btf_id: record.as_ref().and_then(|r| r.btf_id).unwrap_or(0),
        btf_key_type_id: record.as_ref().and_then(|r| r.key_type_id).unwrap_or(0),
        btf_value_type_id: record.as_ref().and_then(|r| r.value_type_id).unwrap_or(0),
        map_flags: spec.map_flags,
        map_extra: spec.map_extra,
        inner: None,
        frozen: frozen_marker(session, id).exists().into(),
    });
    Ok(state().maps.entry(id).or_insert(entry).clone())
}

/// The map `fd` refers to (`EBADF`, or `EINVAL` for another kind of descriptor).
pub fn map_of_fd(fd: i32) -> Result<Arc<MapEntry>, i32> {
    let obj = match objects::get_kind(fd, Kind::Map) {
        Ok(o) => o,
        // A session map whose descriptor became the kernel's (kernel passthrough).
        Err(e) => return super::passthrough::session_map_of(fd).map_or(Err(e), map_by_id),
    };
    map_by_id(obj.id)
}

/// The key of an element operation: `key_size` bytes at `ukey`; maps without keys (queue,
/// stack, bloom filter) take a null pointer (`EINVAL` otherwise, as `__bpf_copy_key`).
fn read_key(e: &MapEntry, ukey: u64) -> Result<Vec<u8>, Error> {
    let ks = e.map.spec().key_size as usize;
    if ks == 0 {
        return if ukey != 0 { Err(Error::inval("key given for a map without keys")) } else { Ok(Vec::new()) };
    }
    let mut k = vec![0u8; ks];
    read_user(ukey, &mut k).context(|| format!("key ({ks} bytes at {ukey:#x})"))?;
    Ok(k)
}

fn is_perf_array(e: &MapEntry) -> bool {
    e.map.map_type() == MapType::BPF_MAP_TYPE_PERF_EVENT_ARRAY
}

fn can_read(e: &MapEntry) -> Result<(), Error> {
    if e.map_flags & BPF_F_WRONLY != 0 {
        return Err(Error::new(libc::EPERM, "the map is write-only (BPF_F_WRONLY)"));
    }
    Ok(())
}

fn can_write(e: &MapEntry) -> Result<(), Error> {
    if e.map_flags & BPF_F_RDONLY != 0 {
        return Err(Error::new(libc::EPERM, "the map is read-only (BPF_F_RDONLY)"));
    }
    if e.frozen.load(Ordering::Acquire) {
        return Err(Error::new(libc::EPERM, "the map is frozen"));
    }
    Ok(())
}

/// The map of an element command's `map_fd`.
fn map_arg(fd: i32) -> Result<Arc<MapEntry>, Error> {
    map_of_fd(fd).context(|| format!("map_fd {fd}"))
}

/// BPF_MAP_LOOKUP_ELEM.
pub fn lookup(a: &Attr) -> Result<i64, Error> {
    let at: attr::MapElem = a.get(end_of!(attr::MapElem, flags))?;
    let flags = at.flags;
    if flags & !BPF_F_LOCK != 0 {
        return Err(Error::inval(format!("flags {flags:#x} unknown")));
    }
    let e = map_arg(at.map_fd)?;
    can_read(&e)?;
    let key = read_key(&e, at.key)?;
    if is_perf_array(&e) || e.map.map_type() == MapType::BPF_MAP_TYPE_RINGBUF || e.map_type == BPF_MAP_TYPE_CGROUP_ARRAY
    {
        // fd arrays without a userspace lookup, and rings.
        return Err(Error::new(ENOTSUPP, format!("no lookup from user space in a {:?}", e.map.map_type())));
    }
    let mut value = vec![0u8; e.map.value_buf_size()];
    if e.map.map_type() == MapType::BPF_MAP_TYPE_BLOOM_FILTER {
        // The value is the input: the one to test.
        read_user(at.value, &mut value)?;
        e.map.lookup_elem(&key, &mut value).map_err(map_errno)?;
        return Ok(0);
    }
    if flags & BPF_F_LOCK != 0 {
        // No value here holds a bpf_spin_lock.
        return Err(Error::inval("BPF_F_LOCK: the map's value holds no bpf_spin_lock"));
    }
    e.map.lookup_elem(&key, &mut value).map_err(map_errno)?;
    write_user(at.value, &value).context(|| format!("value at {:#x}", at.value))?;
    Ok(0)
}

/// The value an update stores: fd-valued maps take a descriptor and store the object's id.
fn translate_value(e: &MapEntry, value: &mut [u8]) -> Result<(), i32> {
    let fd = || i32::from_ne_bytes(value[..4].try_into().expect("4 bytes"));
    match e.map.map_type() {
        MapType::BPF_MAP_TYPE_PROG_ARRAY => {
            let obj = objects::get_kind(fd(), Kind::Prog)?;
            value[..4].copy_from_slice(&obj.id.to_ne_bytes());
        }
        MapType::BPF_MAP_TYPE_ARRAY_OF_MAPS | MapType::BPF_MAP_TYPE_HASH_OF_MAPS => {
            let inner = map_of_fd(fd())?;
            if let Some((t, k, v, max, flags)) = e.inner {
                let s = inner.map.spec();
                let same = inner.map_type == t
                    && s.key_size == k
                    && s.value_size == v
                    && (inner.map_flags & !BPF_F_INNER_MAP) == (flags & !BPF_F_INNER_MAP)
                    && (flags & BPF_F_INNER_MAP != 0 || s.max_entries == max);
                if !same {
                    return Err(libc::EINVAL); // the inner map's template differs
                }
            }
            value[..4].copy_from_slice(&inner.map.id().to_ne_bytes());
        }
        _ => {}
    }
    Ok(())
}

/// BPF_MAP_UPDATE_ELEM.
pub fn update(a: &Attr) -> Result<i64, Error> {
    let at: attr::MapElem = a.get(end_of!(attr::MapElem, flags))?;
    let e = map_arg(at.map_fd)?;
    can_write(&e)?;
    let key = read_key(&e, at.key)?;
    let flags = at.flags;
    let mut value = vec![0u8; e.map.value_buf_size()];
    read_user(at.value, &mut value).context(|| format!("value at {:#x}", at.value))?;
    if is_perf_array(&e) {
        if flags > 2 {
            return Err(Error::inval(format!("flags {flags:#x} unknown")));
        }
        let idx = u32::from_ne_bytes(key[..4].try_into().expect("4-byte key"));
        let fd = i32::from_ne_bytes(value[..4].try_into().expect("4-byte value"));
        super::events::perf_array_update(e.map.id(), idx, fd)
            .context(|| format!("perf event fd {fd} at index {idx}"))?;
        return Ok(0);
    }
    translate_value(&e, &mut value).context(|| "the value's descriptor")?;
    e.map.update_elem(&key, &value, flags).map_err(map_errno)?;
    Ok(0)
}

/// BPF_MAP_DELETE_ELEM.
pub fn delete(a: &Attr) -> Result<i64, Error> {
    let at: attr::MapElem = a.get(end_of!(attr::MapElem, key))?;
    let e = map_arg(at.map_fd)?;
    can_write(&e)?;
    let key = read_key(&e, at.key)?;
    if is_perf_array(&e) {
        let idx = u32::from_ne_bytes(key[..4].try_into().expect("4-byte key"));
        super::events::perf_array_delete(e.map.id(), idx)?;
        return Ok(0);
    }
    e.map.delete_elem(&key).map_err(map_errno)?;
    Ok(0)
}

/// BPF_MAP_GET_NEXT_KEY.
pub fn get_next_key(a: &Attr) -> Result<i64, Error> {
    let at: attr::MapNextKey = a.get(end_of!(attr::MapNextKey, next_key))?;
    let e = map_arg(at.map_fd)?;
    can_read(&e)?;
    let ks = e.map.spec().key_size as usize;
    let ukey = at.key;
    let key = if ukey == 0 { None } else { Some(read_key(&e, ukey)?) };
    let mut next = vec![0u8; ks];
    if is_perf_array(&e) || e.map_type == BPF_MAP_TYPE_CGROUP_ARRAY {
        // Index arrays: the next index, whatever the slots hold.
        let max = e.map.spec().max_entries;
        let i = match &key {
            None => 0,
            Some(k) => {
                let i = u32::from_ne_bytes(k[..4].try_into().expect("4-byte key"));
                if i >= max { 0 } else { i + 1 }
            }
        };
        if i >= max {
            return Err(libc::ENOENT.into());
        }
        next.copy_from_slice(&i.to_ne_bytes());
    } else {
        e.map.get_next_key(key.as_deref(), &mut next).map_err(map_errno)?;
    }
    write_user(at.next_key, &next).context(|| format!("next_key at {:#x}", at.next_key))?;
    Ok(0)
}

/// BPF_MAP_LOOKUP_AND_DELETE_ELEM.
pub fn lookup_and_delete(a: &Attr) -> Result<i64, Error> {
    let at: attr::MapElem = a.get(end_of!(attr::MapElem, flags))?;
    let e = map_arg(at.map_fd)?;
    let flags = at.flags;
    let key = read_key(&e, at.key)?;
    let t = e.map.map_type();
    let hash = matches!(
        t,
        MapType::BPF_MAP_TYPE_HASH
            | MapType::BPF_MAP_TYPE_PERCPU_HASH
            | MapType::BPF_MAP_TYPE_LRU_HASH
            | MapType::BPF_MAP_TYPE_LRU_PERCPU_HASH
    );
    if flags & !BPF_F_LOCK != 0 || (flags != 0 && !hash) {
        return Err(Error::inval(format!("flags {flags:#x} unknown for a {t:?}")));
    }
    if flags & BPF_F_LOCK != 0 {
        return Err(Error::inval("BPF_F_LOCK: the map's value holds no bpf_spin_lock"));
    }
    if e.map_flags & (BPF_F_RDONLY | BPF_F_WRONLY) != 0 || e.frozen.load(Ordering::Acquire) {
        return Err(Error::new(libc::EPERM, "the map is read-only, write-only or frozen"));
    }
    if !(hash || matches!(t, MapType::BPF_MAP_TYPE_QUEUE | MapType::BPF_MAP_TYPE_STACK)) {
        return Err(Error::new(ENOTSUPP, format!("no lookup-and-delete in a {t:?}")));
    }
    let mut value = vec![0u8; e.map.value_buf_size()];
    e.map.lookup_and_delete_elem(&key, &mut value).map_err(map_errno)?;
    write_user(at.value, &value).context(|| format!("value at {:#x}", at.value))?;
    Ok(0)
}

/// BPF_MAP_FREEZE: syscall writes are refused (`EPERM`) from now on; programs still write.
pub fn freeze(a: &Attr) -> Result<i64, Error> {
    let at: attr::MapElem = a.get(end_of!(attr::MapElem, map_fd))?;
    let e = map_arg(at.map_fd)?;
    // A frozen map's descriptors lose write permission: freezing again is EPERM.
    if e.map_flags & BPF_F_RDONLY != 0 || e.frozen.swap(true, Ordering::AcqRel) {
        return Err(Error::new(libc::EPERM, "the map is read-only or frozen already"));
    }
    // Other processes of the session opening the map see it frozen too.
    if let Ok(session) = objects::session() {
        let _ = std::fs::write(frozen_marker(session, e.map.id()), b"");
    }
    Ok(0)
}

/// The file whose presence records that map `id` is frozen.
fn frozen_marker(session: &userbpf_runtime::Session, id: u32) -> std::path::PathBuf {
    session.layout().map_frozen(id)
}

/// The four batch commands.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Batch {
    Lookup,
    LookupAndDelete,
    Update,
    Delete,
}

/// The map families and which batch operations the kernel gives each.
fn batch_supported(e: &MapEntry, op: Batch) -> bool {
    use MapType::*;
    match e.map.map_type() {
        BPF_MAP_TYPE_HASH
        | BPF_MAP_TYPE_PERCPU_HASH
        | BPF_MAP_TYPE_LRU_HASH
        | BPF_MAP_TYPE_LRU_PERCPU_HASH
        | BPF_MAP_TYPE_HASH_OF_MAPS => true,
        BPF_MAP_TYPE_ARRAY | BPF_MAP_TYPE_PERCPU_ARRAY | BPF_MAP_TYPE_ARRAY_OF_MAPS => {
            matches!(op, Batch::Lookup | Batch::Update)
        }
        BPF_MAP_TYPE_LPM_TRIE => matches!(op, Batch::Lookup | Batch::Update | Batch::Delete),
        _ => false,
    }
}

fn is_hash(e: &MapEntry) -> bool {
    use MapType::*;
    matches!(
        e.map.map_type(),
        BPF_MAP_TYPE_HASH
            | BPF_MAP_TYPE_PERCPU_HASH
            | BPF_MAP_TYPE_LRU_HASH
            | BPF_MAP_TYPE_LRU_PERCPU_HASH
            | BPF_MAP_TYPE_HASH_OF_MAPS
    )
}

/// BPF_MAP_LOOKUP_BATCH, BPF_MAP_LOOKUP_AND_DELETE_BATCH, BPF_MAP_UPDATE_BATCH and
/// BPF_MAP_DELETE_BATCH. `count` is written back with the number of elements done. Hash
/// maps take a u32 position as the batch token (the kernel's is a bucket number, also a u32);
/// other maps take the last key, as the kernel's generic batch functions.
pub fn batch(a: &Attr, op: Batch) -> Result<i64, Error> {
    let at: attr::MapBatch = a.get(end_of!(attr::MapBatch, flags))?;
    let (in_batch, out_batch, ukeys, uvalues) = (at.in_batch, at.out_batch, at.keys, at.values);
    let max_count = at.count;
    let e = map_arg(at.map_fd)?;
    let (elem_flags, flags) = (at.elem_flags, at.flags);
    if !batch_supported(&e, op) {
        return Err(Error::new(ENOTSUPP, format!("no {op:?} batch for a {:?}", e.map.map_type())));
    }
    if flags != 0 {
        return Err(Error::inval(format!("flags {flags:#x} unknown")));
    }
    match op {
        Batch::Lookup => can_read(&e)?,
        Batch::Update | Batch::Delete => can_write(&e)?,
        Batch::LookupAndDelete => {
            can_read(&e)?;
            can_write(&e)?;
        }
    }
    if elem_flags & !BPF_F_LOCK != 0 && op != Batch::Update {
        return Err(Error::inval(format!("elem_flags {elem_flags:#x} unknown")));
    }
    if elem_flags & BPF_F_LOCK != 0 {
        return Err(Error::inval("BPF_F_LOCK: the map's value holds no bpf_spin_lock"));
    }
    let ks = e.map.spec().key_size as usize;
    let vs = e.map.value_buf_size();
    let count_off = offset_of!(attr::MapBatch, count);
    match op {
        Batch::Update | Batch::Delete => {
            let mut done = 0u32;
            let mut res = Ok(0);
            let mut key = vec![0u8; ks];
            let mut value = vec![0u8; vs];
            while done < max_count {
                let r = (|| {
                    read_user(ukeys + done as u64 * ks as u64, &mut key)?;
                    if op == Batch::Update {
                        read_user(uvalues + done as u64 * vs as u64, &mut value)?;
                        translate_value(&e, &mut value)?;
                        e.map.update_elem(&key, &value, elem_flags).map_err(map_errno)
                    } else {
                        e.map.delete_elem(&key).map_err(map_errno)
                    }
                })();
                if let Err(err) = r {
                    res = Err(err);
                    break;
                }
                done += 1;
            }
            a.put_u32(count_off, done)?;
            Ok(res?)
        }
        Batch::Lookup | Batch::LookupAndDelete => {
            if max_count == 0 {
                return Ok(0);
            }
            Ok(if is_hash(&e) {
                hash_lookup_batch(a, &e, op, in_batch, out_batch, ukeys, uvalues, max_count)?
            } else {
                generic_lookup_batch(a, &e, in_batch, out_batch, ukeys, uvalues, max_count)?
            })
        }
    }
}

/// Arrays and tries: walk with get_next_key from the key in `in_batch`; `out_batch` gets
/// the last key returned; `ENOENT` once the walk reaches the end.
#[allow(clippy::too_many_arguments)]
fn generic_lookup_batch(
    a: &Attr,
    e: &MapEntry,
    in_batch: u64,
    out_batch: u64,
    ukeys: u64,
    uvalues: u64,
    max_count: u32,
) -> Result<i64, i32> {
    let ks = e.map.spec().key_size as usize;
    let vs = e.map.value_buf_size();
    let mut prev: Option<Vec<u8>> = None;
    if in_batch != 0 {
        let mut k = vec![0u8; ks];
        read_user(in_batch, &mut k)?;
        prev = Some(k);
    }
    let mut key = vec![0u8; ks];
    let mut value = vec![0u8; vs];
    let mut cp = 0u32;
    let mut res: Result<i64, i32> = Ok(0);
    while cp < max_count {
        if let Err(err) = e.map.get_next_key(prev.as_deref(), &mut key).map_err(map_errno) {
            res = Err(err);
            break;
        }
        match e.map.lookup_elem(&key, &mut value).map_err(map_errno) {
            Ok(()) => {}
            Err(libc::ENOENT) => {
                // Deleted meanwhile: skip it.
                prev = Some(key.clone());
                continue;
            }
            Err(err) => return Err(err),
        }
        write_user(ukeys + cp as u64 * ks as u64, &key)?;
        write_user(uvalues + cp as u64 * vs as u64, &value)?;
        prev = Some(key.clone());
        cp += 1;
    }
    a.put_u32(offset_of!(attr::MapBatch, count), cp)?;
    if cp > 0
        && let Some(p) = &prev
    {
        write_user(out_batch, p)?;
    }
    res
}

/// Hash maps: the token is the number of elements, in iteration order, already walked past.
#[allow(clippy::too_many_arguments)]
fn hash_lookup_batch(
    a: &Attr,
    e: &MapEntry,
    op: Batch,
    in_batch: u64,
    out_batch: u64,
    ukeys: u64,
    uvalues: u64,
    max_count: u32,
) -> Result<i64, i32> {
    let ks = e.map.spec().key_size as usize;
    let vs = e.map.value_buf_size();
    let mut skip = 0u32;
    if in_batch != 0 {
        let mut b = [0u8; 4];
        read_user(in_batch, &mut b)?;
        skip = u32::from_ne_bytes(b);
    }
    // Collect the keys of this batch first (deleting while walking would restart the walk).
    let mut keys: Vec<Vec<u8>> = Vec::new();
    let mut prev: Option<Vec<u8>> = None;
    let mut pos = 0u32;
    let mut at_end = false;
    loop {
        let mut k = vec![0u8; ks];
        match e.map.get_next_key(prev.as_deref(), &mut k).map_err(map_errno) {
            Ok(()) => {}
            Err(libc::ENOENT) => {
                at_end = true;
                break;
            }
            Err(err) => return Err(err),
        }
        if pos >= skip {
            keys.push(k.clone());
        }
        pos += 1;
        prev = Some(k);
        if keys.len() as u32 == max_count {
            // Whether anything follows decides ENOENT.
            let mut probe = vec![0u8; ks];
            at_end = e.map.get_next_key(prev.as_deref(), &mut probe).is_err();
            break;
        }
        if pos > e.map.spec().max_entries.saturating_mul(2).saturating_add(16) {
            break;
        }
    }
    let mut value = vec![0u8; vs];
    let mut cp = 0u32;
    for k in &keys {
        let r = if op == Batch::LookupAndDelete {
            e.map.lookup_and_delete_elem(k, &mut value)
        } else {
            e.map.lookup_elem(k, &mut value)
        };
        match r.map_err(map_errno) {
            Ok(()) => {}
            Err(libc::ENOENT) => continue,
            Err(err) => return Err(err),
        }
        write_user(ukeys + cp as u64 * ks as u64, k)?;
        write_user(uvalues + cp as u64 * vs as u64, &value)?;
        cp += 1;
    }
    a.put_u32(offset_of!(attr::MapBatch, count), cp)?;
    let next = if op == Batch::LookupAndDelete { skip } else { skip + cp };
    write_user(out_batch, &next.to_ne_bytes())?;
    if at_end { Err(libc::ENOENT) } else { Ok(0) }
}
