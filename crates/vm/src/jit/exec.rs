//! Executable memory, W^X: no mapping is ever writable and executable at once, and code is
//! never written again once placed. The place is taken before the code is written
//! ([`ExecMemory::reserve`]), for code compiled for its address.
//!
//! Programs of up to [`ARENA_MAX`] bytes share pages: a probe hit on a target's cold caches
//! pays an instruction-TLB fill for every page of code it runs, and a tool's programs (an
//! entry and a return program, sslsniff's three) run one after the other. They are placed in
//! chunks of [`CHUNK`] bytes, each a shared anonymous mapping seen twice: read+execute where
//! the code runs, and a read-write alias (`mremap` of the same pages, never executable)
//! through which it is written. A chunk takes programs one after another, each on its own
//! 64-byte lines, the rest of its lines `int3` (a page is filled with `int3` when the first
//! place reaches it: the pages not reached take no memory). Space a dropped program leaves is
//! not used again (no code is ever written over code a thread may still be in). When a
//! program does not fit, a new chunk is opened and the old one closed (its alias unmapped
//! once the places it handed out are written: from then on its pages are only executable);
//! a closed chunk is unmapped when its last program is dropped. A child of `fork` shares the
//! chunks' pages with its parent (shared mappings), so it writes into none it inherited: a
//! chunk is open only in the process that made it. Larger programs get a mapping of their
//! own, written and then switched to read+execute.

use std::ptr::NonNull;
use std::sync::Mutex;

use crate::VmError;

/// Bytes of a shared chunk.
pub(crate) const CHUNK: usize = 256 << 10;
/// The largest program placed in a chunk.
pub(crate) const ARENA_MAX: usize = 32 << 10;
/// Programs in a chunk start on their own cache lines.
const LINE: usize = 64;

/// An immutable mapping of native code.
pub(crate) struct ExecMemory {
    ptr: NonNull<u8>,
    /// Bytes of code.
    len: usize,
    /// Bytes that may hold code: the mapping (whole pages) or the chunk's slice (whole lines).
    cap: usize,
    /// A mapping of its own, or the id of the chunk holding it.
    chunk: Option<u64>,
}

// SAFETY: the code is owned by this value alone, read-only (read+execute) for its whole life
// after `place` returns, and unmapped only in `drop` (a chunk's pages once no program in it
// lives); sharing or sending a pointer to immutable memory between threads is sound.
unsafe impl Send for ExecMemory {}
// SAFETY: as above: no method writes through the pointer, so concurrent shared use is sound.
unsafe impl Sync for ExecMemory {}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions; it only reads a system constant.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 { p as usize } else { 4096 }
}

/// An anonymous mapping of `len` bytes (`flags`: private or shared), read-write, at `hint` if
/// that range is free.
fn map_rw(hint: *mut libc::c_void, len: usize, flags: libc::c_int) -> Result<*mut libc::c_void, VmError> {
    // SAFETY: an anonymous mapping without MAP_FIXED touches no existing memory (the address
    // is a hint the kernel follows only where nothing is mapped); the arguments are valid
    // (non-zero length, no fd).
    let p = unsafe { libc::mmap(hint, len, libc::PROT_READ | libc::PROT_WRITE, flags | libc::MAP_ANONYMOUS, -1, 0) };
    if p == libc::MAP_FAILED { Err(os_error("mmap of the code failed")) } else { Ok(p) }
}

fn os_error(what: &str) -> VmError {
    VmError::Jit(format!("{what}: {}", std::io::Error::last_os_error()))
}

fn close(p: usize, near: usize) -> bool {
    (p as i64).wrapping_sub(near as i64).unsigned_abs() < 1 << 30
}

/// A read-write anonymous mapping of `map_len` bytes (`flags`) within 1 GiB of `near` when
/// the kernel can place it there (see [`ExecMemory::reserve`]).
fn map_near(map_len: usize, near: usize, flags: libc::c_int) -> Result<NonNull<u8>, VmError> {
    /// Ranges asked for below `near` before taking the kernel's place, and how far apart.
    const HINT_TRIES: usize = 32;
    const HINT_STEP: usize = 1 << 20;
    let page = page_size();
    let mut p = map_rw(std::ptr::null_mut(), map_len, flags)?;
    if !close(p as usize, near) {
        // The range just below is the first asked for; when something is mapped there (the
        // programs compiled before, other threads' among them), the kernel answers a hint
        // with its default place, and the next range down is asked for, a few times.
        let mut hint = (near & !(page - 1)).saturating_sub(map_len + (64 << 20));
        for _ in 0..HINT_TRIES {
            if let Ok(q) = map_rw(hint as *mut libc::c_void, map_len, flags) {
                if close(q as usize, near) {
                    // SAFETY: `p` is the mapping made above, of `map_len` bytes, not used.
                    unsafe { libc::munmap(p, map_len) };
                    p = q;
                    break;
                }
                // SAFETY: `q` was just made, of `map_len` bytes, and is not used.
                unsafe { libc::munmap(q, map_len) };
            }
            hint = hint.saturating_sub(map_len.max(HINT_STEP));
        }
    }
    NonNull::new(p.cast::<u8>()).ok_or_else(|| VmError::Jit("mmap returned a null mapping".into()))
}

/// A place for code that is not written yet: its address is known, so code that depends on
/// where it lies (relative calls out of it) can be compiled for it, then placed with
/// [`place`](Self::place).
pub(crate) struct Reserved(ExecMemory);

impl Reserved {
    /// Where the code will start.
    pub fn addr(&self) -> usize {
        self.0.addr()
    }

    /// Bytes of code it can take.
    pub fn capacity(&self) -> usize {
        self.0.cap
    }

    /// Copies `code` (at most [`capacity`](Self::capacity) bytes) in, fills the rest with
    /// `int3`, and makes it executable (its own mapping switched to read+execute; a chunk's
    /// slice is executable where it runs already, written through the chunk's alias).
    pub fn place(self, code: &[u8]) -> Result<ExecMemory, VmError> {
        let mut mem = self.0;
        if code.is_empty() || code.len() > mem.cap {
            return Err(VmError::Jit(format!("{} bytes of code for a place of {}", code.len(), mem.cap)));
        }
        if let Some(id) = mem.chunk {
            // On failure `mem` is dropped unwritten (len 0): its place stops being pending.
            arena().write(id, mem.addr(), code, mem.cap)?;
            mem.len = code.len();
            return Ok(mem);
        }
        mem.len = code.len();
        let ptr = mem.ptr;
        // SAFETY: the mapping is `cap >= code.len()` bytes, readable and writable (not yet
        // protected: `reserve` made it so and nothing changed it), and freshly made, so it
        // overlaps neither `code` nor any reference.
        unsafe {
            std::ptr::copy_nonoverlapping(code.as_ptr(), ptr.as_ptr(), code.len());
            std::ptr::write_bytes(ptr.as_ptr().add(code.len()), 0xcc, mem.cap - code.len());
        }
        // SAFETY: `ptr`/`cap` are exactly the mapping `reserve` made; from here on it is never
        // written again.
        let rc = unsafe { libc::mprotect(ptr.as_ptr().cast(), mem.cap, libc::PROT_READ | libc::PROT_EXEC) };
        if rc != 0 {
            // `mem` is dropped here, which unmaps it.
            return Err(os_error("mprotect of the code to read+execute failed"));
        }
        Ok(mem)
    }
}

impl ExecMemory {
    /// A place for `len` bytes of code, which [`Reserved::place`] fills and makes executable,
    /// within 1 GiB of `near` (the runtime's code) when the kernel can place it there, so
    /// that calls from it to the runtime can be `call rel32`s (see compile.rs, "Calls"): a
    /// slice of a shared chunk (see the module's documentation) for up to [`ARENA_MAX`]
    /// bytes, else a mapping of its own. A mapping is first made where the kernel maps by
    /// default (below the shared libraries, the agent's among them) and kept when it is that
    /// close: it shares the page-table pages of what lies around it. Else (the runtime in an
    /// executable, far from the libraries) it is asked for just below `near`, then further
    /// down while those ranges are taken, and taken wherever the kernel puts it if none of
    /// them is free.
    pub fn reserve(len: usize, near: usize) -> Result<Reserved, VmError> {
        if len == 0 {
            return Err(VmError::Jit("no code to map".into()));
        }
        let taken = if len <= ARENA_MAX { arena().take(len, near) } else { None };
        if let Some((addr, cap, id)) = taken
            && let Some(ptr) = NonNull::new(addr as *mut u8)
        {
            // Given back by its drop, whether or not code is placed in it.
            return Ok(Reserved(ExecMemory { ptr, len: 0, cap, chunk: Some(id) }));
        }
        let page = page_size();
        let map_len = len
            .checked_add(page - 1)
            .map(|l| l / page * page)
            .ok_or_else(|| VmError::Jit("code too large to map".into()))?;
        let ptr = map_near(map_len, near, libc::MAP_PRIVATE)?;
        // Unmapped by its drop, whether or not code is placed in it.
        Ok(Reserved(ExecMemory { ptr, len: 0, cap: map_len, chunk: None }))
    }

    /// Address of the first byte of code.
    pub fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    /// The code, as mapped.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the code is readable, at least `len` bytes long, lives as long as `self` and
        // is never written after `place`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for ExecMemory {
    fn drop(&mut self) {
        match self.chunk {
            Some(id) => arena().give_back(id, self.len > 0),
            // SAFETY: `ptr`/`cap` are the mapping this value owns; no reference into it outlives
            // `self` (slices borrow `self`), and JitProgram runs never outlive it.
            None => unsafe {
                libc::munmap(self.ptr.as_ptr().cast(), self.cap);
            },
        }
    }
}

/// One shared chunk (see the module's documentation).
struct Chunk {
    id: u64,
    /// Where its code runs (read+execute).
    rx: usize,
    /// Its read-write alias while it is open (0: closed).
    rw: usize,
    /// The process that made it: the only one that writes into it.
    pid: libc::pid_t,
    /// Bytes handed out (whole lines); the pages they reach are filled with `int3`.
    used: usize,
    /// Places handed out and not dropped yet.
    live: usize,
    /// Places handed out whose code is not written yet: the alias stays until they are.
    pending: usize,
    /// A program did not fit: no more places are handed out, and the alias is unmapped once
    /// none is pending.
    full: bool,
}

impl Chunk {
    /// Hands out the next `cap` bytes (the chunk is open and has room), filling the pages
    /// they reach with `int3` first: the code's address.
    fn hand_out(&mut self, cap: usize) -> usize {
        let page = page_size();
        let (filled, end) = (self.used.next_multiple_of(page), (self.used + cap).next_multiple_of(page).min(CHUNK));
        if end > filled {
            // SAFETY: the chunk is open (its alias `rw`, CHUNK bytes, mapped read-write) and
            // [filled, end) lies inside it, on pages no place reached yet: no code is there.
            unsafe { std::ptr::write_bytes((self.rw + filled) as *mut u8, 0xcc, end - filled) };
        }
        let at = self.rx + self.used;
        self.used += cap;
        self.live += 1;
        self.pending += 1;
        at
    }
}

#[derive(Default)]
struct Arena {
    chunks: Vec<Chunk>,
    next_id: u64,
}

fn arena() -> std::sync::MutexGuard<'static, Arena> {
    static ARENA: Mutex<Arena> = Mutex::new(Arena { chunks: Vec::new(), next_id: 1 });
    ARENA.lock().unwrap_or_else(|e| e.into_inner())
}

impl Arena {
    /// `len` bytes (rounded up to whole lines) in an open chunk within 1 GiB of `near`, opening
    /// one if none has room: (address, capacity, chunk id). None if no chunk can be made (the
    /// caller maps the code on its own).
    fn take(&mut self, len: usize, near: usize) -> Option<(usize, usize, u64)> {
        let cap = len.div_ceil(LINE) * LINE;
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() };
        let mut k = 0;
        while k < self.chunks.len() {
            let c = &self.chunks[k];
            if c.rw != 0 && !c.full && c.pid == pid && close(c.rx, near) {
                let c = &mut self.chunks[k];
                if c.used + cap <= CHUNK {
                    let at = c.hand_out(cap);
                    return Some((at, cap, c.id));
                }
                // Full for this program: closed (once the places handed out are written), and
                // the next one opened below.
                c.full = true;
                if c.pending == 0 && self.close_chunk(k) {
                    continue;
                }
            } else if c.rw != 0 && c.pid != pid {
                // Inherited through fork: the parent may still write into it (its alias's
                // pages are shared), so this process never does.
                if self.close_chunk(k) {
                    continue;
                }
            }
            k += 1;
        }
        let c = self.open(near, pid)?;
        let at = c.hand_out(cap);
        Some((at, cap, c.id))
    }

    /// A new chunk: its executable view near `near`, its alias anywhere (its pages are filled
    /// with `int3` as places reach them: the rest stays untouched, taking no memory).
    fn open(&mut self, near: usize, pid: libc::pid_t) -> Option<&mut Chunk> {
        let rx = map_near(CHUNK, near, libc::MAP_SHARED).ok()?.as_ptr() as usize;
        // SAFETY: `rx` is a shared mapping of CHUNK bytes made above; an old size of 0 asks
        // for a second mapping of the same pages (MREMAP_MAYMOVE: wherever the kernel puts
        // it), touching no other memory.
        let rw = unsafe { libc::mremap(rx as *mut libc::c_void, 0, CHUNK, libc::MREMAP_MAYMOVE) };
        let drop_rx = || {
            // SAFETY: `rx` is the mapping made above, not used yet.
            unsafe { libc::munmap(rx as *mut libc::c_void, CHUNK) }
        };
        if rw == libc::MAP_FAILED {
            drop_rx();
            return None;
        }
        let rw = rw as usize;
        // SAFETY: `rx` is ours (above); from here on its pages are written only through `rw`.
        if unsafe { libc::mprotect(rx as *mut libc::c_void, CHUNK, libc::PROT_READ | libc::PROT_EXEC) } != 0 {
            // SAFETY: the alias made above, not used.
            unsafe { libc::munmap(rw as *mut libc::c_void, CHUNK) };
            drop_rx();
            return None;
        }
        let id = self.next_id;
        self.next_id += 1;
        self.chunks.push(Chunk { id, rx, rw, pid, used: 0, live: 0, pending: 0, full: false });
        self.chunks.last_mut()
    }

    /// Closes chunk `k` (unmaps its alias, in this process); unmaps it too, and forgets it,
    /// if no program is in it (true: it is gone and `k` now names the next chunk).
    fn close_chunk(&mut self, k: usize) -> bool {
        let c = &mut self.chunks[k];
        if c.rw != 0 {
            // SAFETY: the alias this chunk made (or inherited), CHUNK bytes; nothing refers to
            // it but this record.
            unsafe { libc::munmap(c.rw as *mut libc::c_void, CHUNK) };
            c.rw = 0;
        }
        if c.live == 0 {
            // SAFETY: no program lives in the chunk: nothing runs or refers to its code.
            unsafe { libc::munmap(c.rx as *mut libc::c_void, CHUNK) };
            self.chunks.swap_remove(k);
            return true;
        }
        false
    }

    /// Writes `code` at `at` (a slice of `cap` bytes that [`take`](Self::take) gave out, in
    /// chunk `id`, written once) through the chunk's alias.
    fn write(&mut self, id: u64, at: usize, code: &[u8], cap: usize) -> Result<(), VmError> {
        let k = self.chunks.iter().position(|c| c.id == id).ok_or_else(|| VmError::Jit("code chunk gone".into()))?;
        let c = &mut self.chunks[k];
        if c.rw == 0 || c.pending == 0 || at < c.rx || at + cap > c.rx + c.used || code.len() > cap {
            return Err(VmError::Jit("code chunk closed before its code was placed".into()));
        }
        // SAFETY: [at, at + cap) is a slice of the chunk handed out once (by `take`) and not
        // written yet; through the alias at the same offset, mapped read-write while places
        // are pending (checked above, under the arena's lock).
        unsafe { std::ptr::copy_nonoverlapping(code.as_ptr(), (c.rw + (at - c.rx)) as *mut u8, code.len()) };
        self.placed(k);
        Ok(())
    }

    /// A place of chunk `k` was written, or dropped unwritten: the alias of a full chunk goes
    /// with the last one pending.
    fn placed(&mut self, k: usize) {
        let c = &mut self.chunks[k];
        c.pending = c.pending.saturating_sub(1);
        if c.full && c.pending == 0 && c.rw != 0 {
            self.close_chunk(k);
        }
    }

    /// A place of chunk `id` is dropped (`written`: after its code was placed): a closed chunk
    /// with none left is unmapped.
    fn give_back(&mut self, id: u64, written: bool) {
        if let Some(k) = self.chunks.iter().position(|c| c.id == id) {
            if !written {
                self.placed(k);
            }
            // `placed` may have closed and removed it.
            if let Some(k) = self.chunks.iter().position(|c| c.id == id) {
                let c = &mut self.chunks[k];
                c.live = c.live.saturating_sub(1);
                if c.live == 0 && c.rw == 0 {
                    self.close_chunk(k);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn near() -> usize {
        page_size as *const () as usize
    }

    /// `ret` with `rax` = `v`, padded to `len` bytes with `nop`s before it.
    fn returning(v: u32, len: usize) -> Vec<u8> {
        let mut c = vec![0x90u8; len - 6];
        c.push(0xb8);
        c.extend_from_slice(&v.to_le_bytes());
        c.push(0xc3);
        c
    }

    fn run(m: &ExecMemory) -> u64 {
        // SAFETY: the code is `mov eax, imm32; ret` after nops: a C function of no argument.
        let f: extern "C" fn() -> u64 = unsafe { std::mem::transmute(m.addr()) };
        f() & 0xffff_ffff
    }

    /// `code` placed in `arena` (not the process's): its address and chunk.
    fn put(arena: &mut Arena, code: &[u8]) -> (usize, u64) {
        let (at, cap, id) = arena.take(code.len(), near()).unwrap();
        arena.write(id, at, code, cap).unwrap();
        (at, id)
    }

    fn place(code: &[u8]) -> ExecMemory {
        let r = ExecMemory::reserve(code.len(), near()).unwrap();
        r.place(code).unwrap()
    }

    fn prot_of(addr: usize) -> String {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        for line in maps.lines() {
            let mut it = line.split_whitespace();
            let (s, e) = it.next().unwrap().split_once('-').unwrap();
            let (s, e) = (usize::from_str_radix(s, 16).unwrap(), usize::from_str_radix(e, 16).unwrap());
            if (s..e).contains(&addr) {
                return it.next().unwrap().to_string();
            }
        }
        "unmapped".into()
    }

    #[test]
    fn small_programs_share_pages_on_lines_of_their_own() {
        let a = place(&returning(1, 100));
        let b = place(&returning(2, 70));
        assert_eq!((run(&a), run(&b)), (1, 2));
        assert!(a.addr().is_multiple_of(LINE) && b.addr().is_multiple_of(LINE));
        // The arena's lock is the process's: other tests may place code in between, but
        // consecutive places usually follow each other in the same chunk.
        if b.addr() == a.addr() + 128 {
            assert_eq!(a.addr() / 4096, (b.addr() + 69) / 4096, "two small programs on one page");
        }
        // The executable view is never writable; the rest of a slice is int3.
        assert_eq!(prot_of(a.addr()).get(..3), Some("r-x"));
        // SAFETY: the slice's bytes past the code, inside its capacity (128), readable.
        assert_eq!(unsafe { *((a.addr() + 100) as *const u8) }, 0xcc);
    }

    #[test]
    fn a_closed_chunk_is_unmapped_with_its_last_program() {
        // An arena of the test's own (the process's is shared with the tests running beside).
        let mut arena = Arena::default();
        let (first, id) = put(&mut arena, &returning(7, 64));
        // SAFETY: the code is `mov eax, 7; ret` after nops, placed above.
        let f: extern "C" fn() -> u64 = unsafe { std::mem::transmute(first) };
        assert_eq!(f() & 0xffff_ffff, 7);
        assert_eq!(prot_of(first).get(..3), Some("r-x"));
        // Programs that fill the chunk: the one that does not fit opens the next.
        let big = returning(8, ARENA_MAX);
        let mut more = Vec::new();
        while more.len() < CHUNK / ARENA_MAX + 1 {
            more.push(put(&mut arena, &big));
        }
        let (last, last_id) = *more.last().unwrap();
        assert_ne!(last_id, id, "a new chunk opened");
        assert!(!(first..first + CHUNK).contains(&last));
        assert_eq!(arena.chunks.iter().find(|c| c.id == id).unwrap().rw, 0, "the full chunk is closed");
        for &(_, i) in &more[..more.len() - 1] {
            arena.give_back(i, true);
        }
        assert_eq!(prot_of(first).get(..3), Some("r-x"), "a live program's chunk stays mapped");
        arena.give_back(id, true);
        assert_eq!(prot_of(first), "unmapped", "a closed chunk is unmapped with its last program");
        // The open chunk stays, though empty, for the next programs.
        arena.give_back(last_id, true);
        assert_eq!(prot_of(last).get(..3), Some("r-x"));
        let k = arena.chunks.iter().position(|c| c.id == last_id).unwrap();
        assert!(arena.close_chunk(k));
        assert_eq!(prot_of(last), "unmapped");
    }

    #[test]
    fn a_chunk_takes_memory_only_for_the_pages_its_places_reach() {
        let mut arena = Arena::default();
        let (at, id) = put(&mut arena, &returning(3, 100));
        let resident = |addr: usize| {
            let mut v = [0u8; 1];
            // SAFETY: mincore of one page of the chunk's mapping, into a vector we own.
            let rc = unsafe { libc::mincore(addr as *mut libc::c_void, 1, v.as_mut_ptr()) };
            assert_eq!(rc, 0);
            v[0] & 1 != 0
        };
        assert!(resident(at));
        // SAFETY: the rest of the code's page, inside the chunk, readable.
        assert!((at + 100..at + 4096 - (at % 4096)).all(|p| unsafe { *(p as *const u8) } == 0xcc));
        assert!(!resident(at + CHUNK - 4096), "the chunk's last page was never filled");
        arena.give_back(id, true);
        let k = arena.chunks.iter().position(|c| c.id == id).unwrap();
        assert!(arena.close_chunk(k));
    }

    #[test]
    fn a_place_dropped_unwritten_does_not_keep_a_full_chunk_open() {
        let mut arena = Arena::default();
        let (first, id) = put(&mut arena, &returning(5, 64));
        // A place handed out, then a program that does not fit: the chunk is full but its
        // alias stays while the place is pending.
        let (_, _, pending_id) = arena.take(ARENA_MAX, near()).unwrap();
        assert_eq!(pending_id, id);
        let mut more = Vec::new();
        while arena.chunks.iter().any(|c| c.id == id && !c.full) {
            more.push(put(&mut arena, &returning(6, ARENA_MAX)).1);
        }
        assert_ne!(arena.chunks.iter().find(|c| c.id == id).unwrap().rw, 0, "kept for the pending place");
        // Dropped without its code (a failed compile): the alias goes.
        arena.give_back(id, false);
        assert_eq!(arena.chunks.iter().find(|c| c.id == id).unwrap().rw, 0);
        assert_eq!(prot_of(first).get(..3), Some("r-x"), "the first program still lives there");
        for i in more.into_iter().chain([id]) {
            arena.give_back(i, true);
        }
        assert_eq!(prot_of(first), "unmapped");
    }

    #[test]
    fn large_programs_get_a_mapping_of_their_own() {
        let m = place(&returning(9, ARENA_MAX + 1));
        assert_eq!(run(&m), 9);
        assert!(m.chunk.is_none());
        assert_eq!(prot_of(m.addr()).get(..3), Some("r-x"));
    }
}
