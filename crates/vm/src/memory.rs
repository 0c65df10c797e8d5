//! What memory a program may touch, as the interpreter checks it.
//!
//! Every load and store of the interpreter is checked, in this order, against: the stack of
//! the run, the regions handed to the run (the context, a packet, a test buffer), and the
//! program's [`MemoryPolicy`] (map values and other memory the runtime vouches for).

/// A range of memory a run may read, and write if `writable`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    pub start: u64,
    pub len: u64,
    pub writable: bool,
}

impl Region {
    pub fn new(start: u64, len: u64, writable: bool) -> Self {
        Region { start, len, writable }
    }
    /// A region covering a mutable byte slice.
    pub fn of_mut(buf: &mut [u8]) -> Self {
        Region { start: buf.as_mut_ptr() as u64, len: buf.len() as u64, writable: true }
    }
    /// A read-only region covering a byte slice.
    pub fn of(buf: &[u8]) -> Self {
        Region { start: buf.as_ptr() as u64, len: buf.len() as u64, writable: false }
    }
    /// Whether `[addr, addr+len)` lies inside the region (and writing is allowed if `write`).
    #[inline(always)]
    pub fn contains(&self, addr: u64, len: u64, write: bool) -> bool {
        addr.wrapping_sub(self.start) <= self.len.wrapping_sub(len) && len <= self.len && (!write || self.writable)
    }
}

/// Memory beyond the stack and the run's regions that a program may touch: implemented by the
/// runtime over its maps. Called only for accesses outside the stack and the run's regions.
pub trait MemoryPolicy: Send + Sync {
    /// Whether `[addr, addr+len)` may be read (or written, if `write`).
    fn allows(&self, addr: u64, len: u64, write: bool) -> bool;
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn contains_edges() {
        let r = Region::new(100, 10, false);
        assert!(r.contains(100, 10, false));
        assert!(r.contains(109, 1, false));
        assert!(!r.contains(109, 2, false));
        assert!(!r.contains(99, 1, false));
        assert!(!r.contains(100, 11, false));
        assert!(!r.contains(100, 1, true));
        assert!(!r.contains(u64::MAX, 2, false));
    }
}
