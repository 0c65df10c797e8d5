//! Map helpers (`map_lookup_elem` and friends) and the process-wide map registry they use.
//!
//! # The registry
//!
//! A program names a map by the address of a [`Map`] in this process (the loader resolves
//! `lddw` map references to `Arc::as_ptr(&map)`). Helpers accept only maps registered with
//! [`register_map`]: an unregistered address is refused instead of being dereferenced.
//! Map-in-map slots hold map ids; [`map_lookup_elem`] on an array or hash of maps returns the
//! inner map's address, found by id among the maps of the outer map's session.
//!
//! Ids are per session, and one process may use several sessions (tests do), so entries are
//! keyed by (session, id). The session of a map is the directory holding its file (found
//! once, at registration, through `/proc/thread-self/fd`), reduced to a 64-bit hash.
//!
//! Reads are lock-free: fixed open-addressing tables of atomics (by map address and by
//! (session, id)), written under a mutex by registration only. A registered map stays mapped
//! until the process exits: its `Arc` is leaked into the table, since a program on another
//! thread may hold its address at any time and nothing on the hot path could tell when it
//! stops.

use std::mem::MaybeUninit;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use userbpf_maps::{Map, MapType};
use userbpf_vm::HelperRegistry;

use super::{EINVAL, helper};
use crate::context::current_cpu;

/// Most maps a process can register.
pub const MAX_MAPS: usize = 4096;
/// Slots of each hash table (twice the maps: probes stay short).
const TBL: usize = 2 * MAX_MAPS;

struct Entry {
    map: AtomicPtr<Map>,
    session: AtomicU64,
    id: AtomicU32,
}

struct PtrSlot {
    /// Address of the map (0: empty). Written once.
    ptr: AtomicUsize,
    /// Index into ENTRIES.
    idx: AtomicU32,
}

struct IdSlot {
    session: AtomicU64,
    id: AtomicU32,
    /// Index into ENTRIES + 1 (0: empty). Published last.
    idx: AtomicU32,
}

#[allow(clippy::declare_interior_mutable_const)]
const ENTRY0: Entry =
    Entry { map: AtomicPtr::new(std::ptr::null_mut()), session: AtomicU64::new(0), id: AtomicU32::new(0) };
#[allow(clippy::declare_interior_mutable_const)]
const PTR0: PtrSlot = PtrSlot { ptr: AtomicUsize::new(0), idx: AtomicU32::new(0) };
#[allow(clippy::declare_interior_mutable_const)]
const ID0: IdSlot = IdSlot { session: AtomicU64::new(0), id: AtomicU32::new(0), idx: AtomicU32::new(0) };

static ENTRIES: [Entry; MAX_MAPS] = [ENTRY0; MAX_MAPS];
static COUNT: AtomicUsize = AtomicUsize::new(0);
static BY_PTR: [PtrSlot; TBL] = [PTR0; TBL];
static BY_ID: [IdSlot; TBL] = [ID0; TBL];
static WRITER: Mutex<()> = Mutex::new(());

/// Most kernel maps reached through `bpf()` a process can register.
const MAX_KERNEL_MAPS: usize = 256;
/// The registered kernel maps reached through `bpf()` ([`Map::Kernel`]): the runs' held values
/// are written back to them ([`write_back_kernel_values`]).
static KERNEL_MAPS: [AtomicPtr<Map>; MAX_KERNEL_MAPS] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; MAX_KERNEL_MAPS];
static KERNEL_COUNT: AtomicUsize = AtomicUsize::new(0);

/// The end of a run that looked up values of kernel maps reached through `bpf()`, holding CPU
/// slot `slot`: the values it changed go to the kernel (`userbpf_maps::kernel`).
#[cold]
pub fn write_back_kernel_values(slot: u32) {
    let n = KERNEL_COUNT.load(Ordering::Acquire).min(MAX_KERNEL_MAPS);
    for p in &KERNEL_MAPS[..n] {
        // SAFETY: non-null entries are registered maps, leaked (never released).
        if let Some(Map::Kernel(k)) = unsafe { p.load(Ordering::Acquire).as_ref() } {
            // SAFETY: the caller's run holds `slot` and has ended (no pointer into the buffers
            // is used after).
            unsafe { k.write_back(slot) };
        }
    }
}

/// The address table's first slot for map address `p`: its 16-byte granule, unmixed. Maps
/// are distinct objects at least that far apart, and the agent makes its maps' objects
/// together (`userbpf_arena`): their slots then sit side by side, on one page of the table
/// for every map a process's probes use, where a mixing hash gives each map a page of its
/// own to reach on a hit.
#[inline(always)]
fn ptr_hash(p: usize) -> usize {
    (p >> 4) % TBL
}

#[inline(always)]
fn id_hash(session: u64, id: u32) -> usize {
    ((session ^ (id as u64).wrapping_mul(0xff51_afd7_ed55_8ccd)).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 51) as usize
        % TBL
}

/// Why [`register_map`] failed, for an error message.
pub fn full_message() -> String {
    format!("this process already holds {MAX_MAPS} maps (they stay mapped while it lives), no room for another")
}

/// The session key of a map: a hash of the directory holding its file ("" if unknown). Read
/// through `/proc/thread-self`: the agent's thread has a descriptor table of its own (its maps'
/// descriptors are not the process's), and the map was opened on the calling thread.
pub fn session_key_of(map: &Map) -> u64 {
    let fd = map.shm().fd().as_raw_fd();
    let dir = std::fs::read_link(format!("/proc/thread-self/fd/{fd}"))
        .ok()
        .and_then(|p| p.parent().map(|d| d.as_os_str().to_owned()))
        .unwrap_or_default();
    // FNV-1a.
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for &b in std::os::unix::ffi::OsStrExt::as_bytes(dir.as_os_str()) {
        h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Makes `map` usable by helpers, under its session id `id` (its session is the directory of
/// its file). The `Arc` is leaked: the map stays mapped until the process exits. Registering
/// another map under the same (session, id) makes lookups by id find the new one. Returns
/// false if the registry is full ([`MAX_MAPS`]).
pub fn register_map(id: u32, map: Arc<Map>) -> bool {
    let session = session_key_of(&map);
    register_map_in(session, id, map)
}

/// [`register_map`] with an explicit session key.
pub fn register_map_in(session: u64, id: u32, map: Arc<Map>) -> bool {
    let _w = WRITER.lock().unwrap_or_else(|e| e.into_inner());
    let p = Arc::as_ptr(&map) as usize;
    // Already registered (the same map again): only its id entry changes.
    let idx = match find_ptr(p) {
        Some(i) => i,
        None => {
            let i = COUNT.load(Ordering::Relaxed);
            if i >= MAX_MAPS {
                return false;
            }
            if matches!(*map, Map::Kernel(_)) {
                let k = KERNEL_COUNT.load(Ordering::Relaxed);
                if k >= MAX_KERNEL_MAPS {
                    return false;
                }
                KERNEL_MAPS[k].store(Arc::as_ptr(&map) as *mut Map, Ordering::Release);
                KERNEL_COUNT.store(k + 1, Ordering::Release);
            }
            let e = &ENTRIES[i];
            e.session.store(session, Ordering::Relaxed);
            e.id.store(id, Ordering::Relaxed);
            e.map.store(Arc::into_raw(map) as *mut Map, Ordering::Release);
            COUNT.store(i + 1, Ordering::Release);
            let mut h = ptr_hash(p);
            loop {
                let s = &BY_PTR[h];
                if s.ptr.load(Ordering::Relaxed) == 0 {
                    s.idx.store(i as u32, Ordering::Relaxed);
                    s.ptr.store(p, Ordering::Release);
                    break;
                }
                h = (h + 1) % TBL;
            }
            i
        }
    };
    ENTRIES[idx].session.store(session, Ordering::Relaxed);
    ENTRIES[idx].id.store(id, Ordering::Relaxed);
    let mut h = id_hash(session, id);
    loop {
        let s = &BY_ID[h];
        let cur = s.idx.load(Ordering::Relaxed);
        if cur == 0 {
            s.session.store(session, Ordering::Relaxed);
            s.id.store(id, Ordering::Relaxed);
            s.idx.store(idx as u32 + 1, Ordering::Release);
            return true;
        }
        if s.session.load(Ordering::Relaxed) == session && s.id.load(Ordering::Relaxed) == id {
            s.idx.store(idx as u32 + 1, Ordering::Release);
            return true;
        }
        h = (h + 1) % TBL;
    }
}

#[inline]
fn find_ptr(p: usize) -> Option<usize> {
    if p == 0 {
        return None;
    }
    let mut h = ptr_hash(p);
    for _ in 0..TBL {
        let s = &BY_PTR[h];
        match s.ptr.load(Ordering::Acquire) {
            0 => return None,
            x if x == p => return Some(s.idx.load(Ordering::Relaxed) as usize),
            _ => h = (h + 1) % TBL,
        }
    }
    None
}

#[inline]
fn entry_map(i: usize) -> Option<&'static Map> {
    let p = ENTRIES.get(i)?.map.load(Ordering::Acquire);
    // SAFETY: non-null entries come from Arc::into_raw and are never released.
    unsafe { p.as_ref() }
}

/// The registered map at this address (what a program passes as a map argument), with its
/// session key.
#[inline]
pub fn map_at(addr: u64) -> Option<(&'static Map, u64)> {
    let i = find_ptr(addr as usize)?;
    let m = entry_map(i)?;
    Some((m, ENTRIES[i].session.load(Ordering::Relaxed)))
}

/// The registered map at this address, without its session: what the helpers' hot paths
/// need (one probe of the address table; the map itself is at the address).
#[inline]
pub fn map_ref(addr: u64) -> Option<&'static Map> {
    find_ptr(addr as usize)?;
    // SAFETY: a registered address is that of a `Map` whose `Arc` was leaked into the
    // registry (never released): it stays valid until the process exits.
    Some(unsafe { &*(addr as *const Map) })
}

/// The CPU slot for an operation on `m`: the run's for per-CPU maps and kernel maps reached
/// through `bpf()` (whose buffers are the slot's); the others ignore it, and skip the
/// thread-local read.
#[inline]
fn cpu_for(m: &Map) -> u32 {
    if m.map_type().is_percpu() || matches!(m, Map::Kernel(_)) { current_cpu() } else { 0 }
}

/// The registered map of `session` with this id.
#[inline]
pub fn map_by_session_id(session: u64, id: u32) -> Option<&'static Map> {
    if id == 0 {
        return None;
    }
    let mut h = id_hash(session, id);
    for _ in 0..TBL {
        let s = &BY_ID[h];
        let idx = s.idx.load(Ordering::Acquire);
        if idx == 0 {
            return None;
        }
        if s.id.load(Ordering::Relaxed) == id && s.session.load(Ordering::Relaxed) == session {
            return entry_map(idx as usize - 1);
        }
        h = (h + 1) % TBL;
    }
    None
}

/// A registered map with this id, in any session (the most recently registered one wins
/// among maps of different sessions with the same id). Not for the hot path.
pub fn map_by_id(id: u32) -> Option<&'static Map> {
    let n = COUNT.load(Ordering::Acquire);
    (0..n).rev().find(|&i| ENTRIES[i].id.load(Ordering::Relaxed) == id).and_then(entry_map)
}

/// Every registered map (in registration order).
pub fn registered_maps() -> impl Iterator<Item = &'static Map> {
    let n = COUNT.load(Ordering::Acquire);
    (0..n).filter_map(entry_map)
}

/// Whether `[addr, addr+len)` lies in memory of a registered map that programs may touch
/// (a value, a ring buffer's data): for the interpreter's memory policy, which needs it for
/// inner maps and ring buffer samples. A linear scan, off the hot path.
pub fn registry_contains(addr: u64, len: u64) -> bool {
    registered_maps().any(|m| m.contains(addr, len))
}

// ---- helpers ----

#[inline(always)]
fn is_map_in_map(m: &Map) -> bool {
    matches!(m.map_type(), MapType::BPF_MAP_TYPE_ARRAY_OF_MAPS | MapType::BPF_MAP_TYPE_HASH_OF_MAPS)
}

/// Reads the u32 id a map-in-map or prog-array slot holds.
///
/// # Safety
/// `p` points to a 4-byte slot returned by `Map::lookup`.
#[inline]
unsafe fn slot_id(p: *const u8) -> u32 {
    if (p as usize).is_multiple_of(4) {
        // SAFETY: aligned id slot in the map's mapping; other processes update it atomically.
        unsafe { AtomicU32::from_ptr(p as *mut u32).load(Ordering::Acquire) }
    } else {
        // SAFETY: readable slot (caller).
        unsafe { (p as *const u32).read_unaligned() }
    }
}

/// Whether keys and values given to map helpers are trusted: true while every program loaded
/// into this process was verified (see the module docs of `helpers`).
// The hit path reads it: with its other statics on one page (see `userbpf_arena`).
#[unsafe(link_section = "userbpf_hot")]
static TRUST_POINTERS: AtomicBool = AtomicBool::new(true);

/// From now on, map helpers distrust their key and value pointers (a program was loaded
/// unverified). For the rest of the process: its programs may already be running.
pub fn distrust_pointers() {
    TRUST_POINTERS.store(false, Ordering::Relaxed);
}

/// Whether map helpers trust their pointers (see [`distrust_pointers`]).
pub fn pointers_trusted() -> bool {
    TRUST_POINTERS.load(Ordering::Relaxed)
}

/// Bytes a distrusted key or value is copied into on the helper's stack; larger ones are
/// probed page by page and then used in place.
const COPY_MAX: usize = 512;

/// Whether `len` bytes at `p` can be read (`write`: and written), probing one byte of every
/// page through the guard (a write probe rewrites the byte with its own value).
fn probe(p: u64, len: usize, write: bool) -> bool {
    if len == 0 {
        return true;
    }
    let Some(end) = p.checked_add(len as u64 - 1) else { return false };
    let mut at = p;
    loop {
        let mut b = 0u8;
        // SAFETY: the guard's copy recovers a fault at `at` (giving EFAULT); `b` is ours.
        if unsafe { userbpf_vm::guard::copy(&mut b, at as *const u8, 1) } != 0 {
            return false;
        }
        // SAFETY: as above; writing back the byte just read leaves the memory as it was
        // (a racing writer could lose one store: the program is unverified).
        if write && unsafe { userbpf_vm::guard::copy(at as *mut u8, &b, 1) } != 0 {
            return false;
        }
        if at >= end & !4095 {
            break;
        }
        at = (at & !4095) + 4096;
    }
    // The last byte (its page may differ from the probed start of a page).
    let mut b = 0u8;
    // SAFETY: as above.
    unsafe { userbpf_vm::guard::copy(&mut b, end as *const u8, 1) == 0 }
}

/// A key or value the helper may read: `p` itself when pointers are trusted; otherwise a
/// guarded copy in `buf` (or `p` after probing, when larger than `buf`). `None`: it faults.
#[inline]
fn readable(p: u64, len: u32, buf: &mut MaybeUninit<[u8; COPY_MAX]>) -> Option<*const u8> {
    if pointers_trusted() {
        return Some(p as *const u8);
    }
    distrusted(p, len as usize, buf)
}

#[cold]
fn distrusted(p: u64, len: usize, buf: &mut MaybeUninit<[u8; COPY_MAX]>) -> Option<*const u8> {
    if len > COPY_MAX {
        return probe(p, len, false).then_some(p as *const u8);
    }
    let dst = buf.as_mut_ptr() as *mut u8;
    // SAFETY: `buf` holds COPY_MAX >= len bytes (written here, read only as those bytes);
    // the guard recovers faults on `p`.
    (unsafe { userbpf_vm::guard::copy(dst, p as *const u8, len as u64) } == 0).then_some(dst as *const u8)
}

const EFAULT: u64 = -(libc::EFAULT as i64) as u64;

/// `void *bpf_map_lookup_elem(map, key)`: the value's address in this process, or NULL. For
/// arrays and hashes of maps, the inner map's address (NULL if the slot is empty or names no
/// registered map of the session). Prog arrays: NULL (the kernel forbids the call).
#[unsafe(link_section = ".text.hot.userbpf")]
unsafe extern "C" fn map_lookup_elem(map: u64, key: u64, _: u64, _: u64, _: u64) -> u64 {
    let Some(m) = map_ref(map) else { return 0 };
    let mut buf = MaybeUninit::uninit();
    let Some(key) = readable(key, m.spec().key_size, &mut buf) else { return 0 };
    // SAFETY: key_size readable bytes: verified programs' keys are stack or map memory (see
    // the module docs of `helpers`), others' were copied or probed.
    let p = unsafe { m.lookup(key, cpu_for(m)) };
    if p.is_null() {
        return 0;
    }
    if matches!(m, Map::Kernel(_)) {
        // A copy of the kernel's value, written back at the run's end.
        crate::context::hold_kernel_values();
        return p as u64;
    }
    match m {
        Map::Array(_) | Map::Hash(_) if is_map_in_map(m) => {
            // SAFETY: lookup of a map-in-map returns its 4-byte id slot.
            let id = unsafe { slot_id(p) };
            let session = map_at(map).map_or(0, |(_, s)| s);
            map_by_session_id(session, id).map_or(0, |inner| inner as *const Map as u64)
        }
        Map::Array(_) if m.map_type() == MapType::BPF_MAP_TYPE_PROG_ARRAY => 0,
        _ => p as u64,
    }
}

/// `long bpf_map_update_elem(map, key, value, flags)`.
#[unsafe(link_section = ".text.hot.userbpf")]
unsafe extern "C" fn map_update_elem(map: u64, key: u64, value: u64, flags: u64, _: u64) -> u64 {
    let Some(m) = map_ref(map) else { return EINVAL };
    let (mut kbuf, mut vbuf) = (MaybeUninit::uninit(), MaybeUninit::uninit());
    let Some(key) = readable(key, m.spec().key_size, &mut kbuf) else { return EFAULT };
    let Some(value) = readable(value, m.spec().value_size, &mut vbuf) else { return EFAULT };
    // SAFETY: key and value readable (as in `map_lookup_elem`).
    match unsafe { m.update(key, value, flags, cpu_for(m)) } {
        Ok(()) => 0,
        Err(e) => e.to_helper_ret(),
    }
}

/// `long bpf_map_delete_elem(map, key)`.
#[unsafe(link_section = ".text.hot.userbpf")]
unsafe extern "C" fn map_delete_elem(map: u64, key: u64, _: u64, _: u64, _: u64) -> u64 {
    let Some(m) = map_ref(map) else { return EINVAL };
    let mut buf = MaybeUninit::uninit();
    let Some(key) = readable(key, m.spec().key_size, &mut buf) else { return EFAULT };
    let r = match m {
        // SAFETY: the key is readable (as in `map_lookup_elem`); the run holds its slot.
        Map::Kernel(k) => unsafe { k.delete(key, current_cpu()) },
        // SAFETY: the key is readable (as in `map_lookup_elem`).
        _ => unsafe { m.delete(key) },
    };
    match r {
        Ok(()) => 0,
        Err(e) => e.to_helper_ret(),
    }
}

/// `long bpf_map_push_elem(map, value, flags)`.
unsafe extern "C" fn map_push_elem(map: u64, value: u64, flags: u64, _: u64, _: u64) -> u64 {
    let Some(m) = map_ref(map) else { return EINVAL };
    let mut buf = MaybeUninit::uninit();
    let Some(value) = readable(value, m.spec().value_size, &mut buf) else { return EFAULT };
    // SAFETY: the value is readable (as in `map_lookup_elem`).
    match unsafe { m.push(value, flags) } {
        Ok(()) => 0,
        Err(e) => e.to_helper_ret(),
    }
}

/// Pop and peek: on an empty queue or stack the kernel zeroes the value.
fn pop_or_peek(map: u64, value: u64, pop: bool) -> u64 {
    let Some(m) = map_ref(map) else { return EINVAL };
    if !pointers_trusted() && !probe(value, m.spec().value_size as usize, true) {
        return EFAULT;
    }
    // SAFETY: value_size writable bytes: verified programs' buffers are stack or map memory,
    // others' were probed.
    let r = unsafe { if pop { m.pop(value as *mut u8) } else { m.peek(value as *mut u8) } };
    match r {
        Ok(()) => 0,
        Err(e) => {
            if e.errno() == libc::ENOENT && matches!(m, Map::QueueStack(_)) {
                // SAFETY: as above, value_size writable bytes.
                unsafe { std::ptr::write_bytes(value as *mut u8, 0, m.spec().value_size as usize) };
            }
            e.to_helper_ret()
        }
    }
}

/// `long bpf_map_pop_elem(map, value)`.
unsafe extern "C" fn map_pop_elem(map: u64, value: u64, _: u64, _: u64, _: u64) -> u64 {
    pop_or_peek(map, value, true)
}

/// `long bpf_map_peek_elem(map, value)`.
unsafe extern "C" fn map_peek_elem(map: u64, value: u64, _: u64, _: u64, _: u64) -> u64 {
    pop_or_peek(map, value, false)
}

/// `void *bpf_map_lookup_percpu_elem(map, key, cpu)`: the value of `cpu` in a per-CPU map,
/// NULL if `cpu` is not a possible CPU of the map or the map is not per-CPU.
unsafe extern "C" fn map_lookup_percpu_elem(map: u64, key: u64, cpu: u64, _: u64, _: u64) -> u64 {
    let Some(m) = map_ref(map) else { return 0 };
    let cpu = cpu as u32;
    if !m.map_type().is_percpu() || cpu >= m.nr_cpus() {
        return 0;
    }
    let mut buf = MaybeUninit::uninit();
    let Some(key) = readable(key, m.spec().key_size, &mut buf) else { return 0 };
    if let Map::Kernel(k) = m {
        // SAFETY: the key is readable (as in `map_lookup_elem`); the run holds its slot.
        let p = unsafe { k.lookup(key, current_cpu(), cpu) };
        if !p.is_null() {
            crate::context::hold_kernel_values();
        }
        return p as u64;
    }
    // SAFETY: the key is readable (as in `map_lookup_elem`).
    unsafe { m.lookup(key, cpu) as u64 }
}

pub(crate) fn register(reg: &mut HelperRegistry) {
    reg.register(helper(1, "map_lookup_elem", map_lookup_elem));
    reg.register(helper(2, "map_update_elem", map_update_elem));
    reg.register(helper(3, "map_delete_elem", map_delete_elem));
    reg.register(helper(87, "map_push_elem", map_push_elem));
    reg.register(helper(88, "map_pop_elem", map_pop_elem));
    reg.register(helper(89, "map_peek_elem", map_peek_elem));
    reg.register(helper(195, "map_lookup_percpu_elem", map_lookup_percpu_elem));
}
