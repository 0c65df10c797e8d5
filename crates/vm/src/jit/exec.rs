//! Executable memory, W^X: code is copied into an anonymous read-write mapping, which is then
//! switched to read+execute. It is never writable and executable at once, and never written
//! again after that. The mapping can be made before the code ([`ExecMemory::reserve`]), for
//! code compiled for its address.

use std::ptr::NonNull;

use crate::VmError;

/// An immutable mapping of native code.
pub(crate) struct ExecMemory {
    ptr: NonNull<u8>,
    /// Bytes of code.
    len: usize,
    /// Bytes mapped (`len` rounded up to whole pages).
    map_len: usize,
}

// SAFETY: the mapping is owned by this value alone, read-only (read+execute) for its whole
// life after `new` returns, and unmapped only in `drop`; sharing or sending a pointer to
// immutable memory between threads is sound.
unsafe impl Send for ExecMemory {}
// SAFETY: as above: no method writes through the pointer, so concurrent shared use is sound.
unsafe impl Sync for ExecMemory {}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions; it only reads a system constant.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 { p as usize } else { 4096 }
}

/// An anonymous read-write mapping of `len` bytes, at `hint` if that range is free.
fn map_rw(hint: *mut libc::c_void, len: usize) -> Result<*mut libc::c_void, VmError> {
    // SAFETY: an anonymous private mapping without MAP_FIXED touches no existing memory (the
    // address is a hint the kernel follows only where nothing is mapped); the arguments are
    // valid (non-zero length, no fd).
    let p = unsafe {
        libc::mmap(hint, len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
    };
    if p == libc::MAP_FAILED { Err(os_error("mmap of the code failed")) } else { Ok(p) }
}

fn os_error(what: &str) -> VmError {
    VmError::Jit(format!("{what}: {}", std::io::Error::last_os_error()))
}

/// A mapping made for code that is not written yet: its address is known, so code that
/// depends on where it lies (relative calls out of it) can be compiled for it, then placed
/// with [`place`](Self::place).
pub(crate) struct Reserved(ExecMemory);

impl Reserved {
    /// Where the code will start.
    pub fn addr(&self) -> usize {
        self.0.addr()
    }

    /// Bytes of code it can take.
    pub fn capacity(&self) -> usize {
        self.0.map_len
    }

    /// Copies `code` (at most [`capacity`](Self::capacity) bytes) in, fills the rest of the
    /// last page with `int3` and makes the mapping executable.
    pub fn place(self, code: &[u8]) -> Result<ExecMemory, VmError> {
        let mut mem = self.0;
        if code.is_empty() || code.len() > mem.map_len {
            return Err(VmError::Jit(format!("{} bytes of code for a mapping of {}", code.len(), mem.map_len)));
        }
        mem.len = code.len();
        let ptr = mem.ptr;
        // SAFETY: the mapping is `map_len >= code.len()` bytes, readable and writable (not
        // yet protected: `reserve` made it so and nothing changed it), and freshly made, so
        // it overlaps neither `code` nor any reference.
        unsafe {
            std::ptr::copy_nonoverlapping(code.as_ptr(), ptr.as_ptr(), code.len());
            std::ptr::write_bytes(ptr.as_ptr().add(code.len()), 0xcc, mem.map_len - code.len());
        }
        // SAFETY: `ptr`/`map_len` are exactly the mapping `reserve` made; from here on it is
        // never written again.
        let rc = unsafe { libc::mprotect(ptr.as_ptr().cast(), mem.map_len, libc::PROT_READ | libc::PROT_EXEC) };
        if rc != 0 {
            // `mem` is dropped here, which unmaps it.
            return Err(os_error("mprotect of the code to read+execute failed"));
        }
        Ok(mem)
    }
}

impl ExecMemory {
    /// A read-write mapping for `len` bytes of code (whole pages), which
    /// [`Reserved::place`] fills and makes executable, within 1 GiB of `near` (the runtime's
    /// code) when the kernel can place it there, so that calls from it to the runtime can be
    /// `call rel32`s (see compile.rs, "Calls"). Where the kernel maps by default (below the
    /// shared libraries, the agent's among them) is used when it is that close: it shares
    /// the page-table pages of what lies around it. Else (the runtime in an executable, far
    /// from the libraries) it is asked for just below `near`, then further down while those
    /// ranges are taken, and taken wherever the kernel puts it if none of them is free.
    pub fn reserve(len: usize, near: usize) -> Result<Reserved, VmError> {
        /// Ranges asked for below `near` before taking the kernel's place, and how far apart.
        const HINT_TRIES: usize = 32;
        const HINT_STEP: usize = 1 << 20;
        if len == 0 {
            return Err(VmError::Jit("no code to map".into()));
        }
        let page = page_size();
        let map_len = len
            .checked_add(page - 1)
            .map(|l| l / page * page)
            .ok_or_else(|| VmError::Jit("code too large to map".into()))?;
        let close = |p: usize| (p as i64).wrapping_sub(near as i64).unsigned_abs() < 1 << 30;
        let mut p = map_rw(std::ptr::null_mut(), map_len)?;
        if !close(p as usize) {
            // The range just below is the first asked for; when something is mapped there (the
            // programs compiled before, other threads' among them), the kernel answers a hint
            // with its default place, and the next range down is asked for, a few times.
            let mut hint = (near & !(page - 1)).saturating_sub(map_len + (64 << 20));
            for _ in 0..HINT_TRIES {
                if let Ok(q) = map_rw(hint as *mut libc::c_void, map_len) {
                    if close(q as usize) {
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
        let Some(ptr) = NonNull::new(p.cast::<u8>()) else {
            return Err(VmError::Jit("mmap returned a null mapping".into()));
        };
        // Unmapped by its drop, whether or not code is placed in it.
        Ok(Reserved(ExecMemory { ptr, len: 0, map_len }))
    }

    /// Address of the first byte of code.
    pub fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    /// The code, as mapped.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping is readable, at least `len` bytes long, lives as long as `self`
        // and is never written after `new`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for ExecMemory {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`map_len` are the mapping this value owns; no reference into it
        // outlives `self` (slices borrow `self`), and JitProgram runs never outlive it.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.map_len);
        }
    }
}
