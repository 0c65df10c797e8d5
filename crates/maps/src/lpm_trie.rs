//! LPM_TRIE: longest-prefix match over keys `{ u32 prefixlen; u8 data[key_size - 4] }`, the
//! kernel's binary trie (lpm_trie.c) with the same node rules: real nodes, intermediate
//! ("IM") nodes that always have two children, updates that replace a node, deletes that mark
//! a two-child node intermediate or splice it out, and get_next_key in the kernel's
//! post-order (more specific prefixes first).
//!
//! File layout (`ds8 = round_up(key_size - 4, 8)`, `vs8 = round_up(value_size, 8)`,
//! `n_nodes = 2 * max_entries + 2`: max_entries real nodes, fewer intermediate ones, one
//! spare for a replacement). Node links are `index + 1`, 0 meaning none, so a zero-filled
//! file is an empty trie and the node area stays sparse until used (the kernel does not
//! preallocate tries either):
//!
//! ```text
//! 0       MapHeader
//! 128     lock: u32 (0 or holder thread id), root: u32, n_entries: u32,
//!         free_head: u32, free_tail: u32 (FIFO of freed nodes), fresh: u32 (never-used nodes
//!         start at this index)
//! 4096    nodes[n_nodes], each
//!           +0 child[2]: u32 × 2, +8 prefixlen: u32, +12 flags: u32 (1 = intermediate),
//!           +16 flink: u32, +20 pad, +24 data (ds8 bytes), +24+ds8 value (vs8 bytes)
//! end     rounded up to a page
//! ```
//!
//! Concurrency: lookups are lock-free (acquire loads of links, at most max_prefixlen + 2
//! steps). Updates, deletes and get_next_key take the trie's [`SpinLock`] (bounded, then
//! `EBUSY`). A node is published with one release store after it is fully written; a
//! replaced or removed node goes to the tail of a FIFO so it is reused as late as possible
//! (readers racing a delete stay memory-safe regardless: nodes are never unmapped and every
//! index is bounds-checked).

use std::sync::atomic::{AtomicU32, Ordering::*};

use crate::map::*;
use crate::mem::{a8, a32, copy_in, copy_out, read_tail, read_word, round_up, round8, zero};
use crate::shm::PAGE_SIZE;
use crate::sync::{SpinLock, Wait};
use crate::types::*;

const H_LOCK: usize = EXT_OFF;
const H_ROOT: usize = EXT_OFF + 4;
const H_COUNT: usize = EXT_OFF + 8;
const H_FREE_HEAD: usize = EXT_OFF + 12;
const H_FREE_TAIL: usize = EXT_OFF + 16;
const H_FRESH: usize = EXT_OFF + 20;

const N_CHILD: usize = 0;
const N_PLEN: usize = 8;
const N_FLAGS: usize = 12;
const N_FLINK: usize = 16;
const N_DATA: usize = 24;

const FLAG_IM: u32 = 1;

const LPM_DATA_SIZE_MAX: u32 = 256;
const LPM_KEY_SIZE_MIN: u32 = 4 + 1;
const LPM_KEY_SIZE_MAX: u32 = 4 + LPM_DATA_SIZE_MAX;
/// sizeof(struct lpm_trie_node) in the kernel (x86-64).
const KERNEL_NODE: u64 = 40;
const LPM_CREATE_FLAG_MASK: u32 = BPF_F_NO_PREALLOC | BPF_F_NUMA_NODE | ACCESS_MASK;

pub struct LpmTrie {
    base: Base,
    ds: usize,
    vs: usize,
    max_plen: u32,
    max: u32,
    n_nodes: u32,
    node_size: usize,
    val_off: usize,
    nodes: *mut u8,
}

// SAFETY: the raw pointer points into `base.shm` (Send + Sync), alive as long as the struct;
// shared state is accessed atomically, writers hold the trie lock.
unsafe impl Send for LpmTrie {}
// SAFETY: as above.
unsafe impl Sync for LpmTrie {}

/// Where a link lives: the root word or a child word.
type Slot<'a> = &'a AtomicU32;

fn geometry(spec: &MapSpec) -> Option<(u32, usize, u64)> {
    let n_nodes = spec.max_entries.checked_mul(2)?.checked_add(2)?;
    let ds8 = round_up(spec.key_size.checked_sub(4)? as u64, 8);
    let node_size = N_DATA as u64 + ds8 + round_up(spec.value_size as u64, 8);
    let size = round_up(DATA_OFF as u64 + node_size.checked_mul(n_nodes as u64)?, PAGE_SIZE as u64);
    Some((n_nodes, node_size as usize, size))
}

impl LpmTrie {
    pub(crate) fn check(spec: &MapSpec) -> Result<(), MapError> {
        let f = spec.map_flags;
        if spec.max_entries == 0
            || f & BPF_F_NO_PREALLOC == 0
            || f & !LPM_CREATE_FLAG_MASK != 0
            || !access_ok(f)
            || spec.key_size < LPM_KEY_SIZE_MIN
            || spec.key_size > LPM_KEY_SIZE_MAX
            || spec.value_size < 1
            || spec.value_size as u64 > KMALLOC_MAX_SIZE - LPM_DATA_SIZE_MAX as u64 - KERNEL_NODE
        {
            return Err(einval("invalid LPM trie attributes"));
        }
        Ok(())
    }

    pub(crate) fn file_size(spec: &MapSpec) -> Option<u64> {
        geometry(spec).map(|g| g.2)
    }

    fn from_base(base: Base) -> LpmTrie {
        let (n_nodes, node_size, _) = geometry(&base.spec).unwrap_or((0, N_DATA, 0));
        let ds = (base.spec.key_size as usize).saturating_sub(4);
        // SAFETY: DATA_OFF is inside the file.
        let nodes = unsafe { base.at(DATA_OFF) };
        LpmTrie {
            ds,
            vs: base.spec.value_size as usize,
            max_plen: 8 * ds as u32,
            max: base.spec.max_entries,
            n_nodes,
            node_size,
            val_off: N_DATA + round8(ds),
            nodes,
            base,
        }
    }

    /// A zero-filled file is an empty trie.
    pub(crate) fn create(base: Base) -> LpmTrie {
        LpmTrie::from_base(base)
    }
    pub(crate) fn open(base: Base) -> LpmTrie {
        LpmTrie::from_base(base)
    }
    pub(crate) fn base(&self) -> &Base {
        &self.base
    }

    fn hdr(&self, off: usize) -> &AtomicU32 {
        // SAFETY: aligned fields of the type header in the first page.
        unsafe { a32(self.base.at(off)) }
    }
    /// Decodes a link: the node index, if the link names a node in range.
    #[inline(always)]
    fn dec(&self, link: u32) -> Option<u32> {
        let i = link.wrapping_sub(1);
        (link != 0 && i < self.n_nodes).then_some(i)
    }
    /// # Safety
    /// `i < n_nodes`.
    #[inline(always)]
    unsafe fn node(&self, i: u32) -> *mut u8 {
        // SAFETY: inside the node array (caller's bound).
        unsafe { self.nodes.add(i as usize * self.node_size) }
    }
    #[inline(always)]
    fn field(&self, i: u32, off: usize) -> &AtomicU32 {
        // SAFETY: callers pass i < n_nodes (decoded links); aligned node field.
        unsafe { a32(self.node(i).add(off)) }
    }
    #[inline(always)]
    fn child(&self, i: u32, bit: u32) -> Slot<'_> {
        self.field(i, N_CHILD + 4 * (bit & 1) as usize)
    }
    #[inline(always)]
    fn plen(&self, i: u32) -> u32 {
        self.field(i, N_PLEN).load(Relaxed).min(self.max_plen)
    }
    #[inline(always)]
    fn is_im(&self, i: u32) -> bool {
        self.field(i, N_FLAGS).load(Relaxed) & FLAG_IM != 0
    }

    /// Bit `index` (< max_plen) of a node's data.
    fn node_bit(&self, i: u32, index: u32) -> u32 {
        // SAFETY: i < n_nodes; index / 8 < ds inside the node's data.
        let b = unsafe { a8(self.node(i).add(N_DATA + (index / 8) as usize)) }.load(Relaxed);
        ((b >> (7 - index % 8)) & 1) as u32
    }

    /// Bit `index` (< max_plen) of a key's data.
    ///
    /// # Safety
    /// `key` readable for key_size bytes.
    #[inline(always)]
    unsafe fn key_bit(key: *const u8, index: u32) -> u32 {
        // SAFETY: 4 + index / 8 < key_size.
        let b = unsafe { *key.add(4 + (index / 8) as usize) };
        ((b >> (7 - index % 8)) & 1) as u32
    }

    /// # Safety
    /// `key` readable for 4 bytes.
    #[inline(always)]
    unsafe fn key_plen(key: *const u8) -> u32 {
        // SAFETY: 4 readable bytes.
        unsafe { key.cast::<u32>().read_unaligned() }
    }

    /// The kernel's longest_prefix_match: leading bits where node `i`'s data and the key's
    /// agree, at most min(node prefixlen, key prefixlen).
    ///
    /// # Safety
    /// `key` readable for key_size bytes.
    unsafe fn match_len(&self, i: u32, key: *const u8) -> u32 {
        // SAFETY: key readable (caller).
        let limit = self.plen(i).min(unsafe { Self::key_plen(key) });
        let mut matched = 0u32;
        let mut off = 0;
        while off < self.ds && matched < limit {
            // SAFETY: node data is ds8 bytes, aligned; key data is ds bytes at key + 4.
            let (nw, kw) = unsafe {
                let nw = crate::mem::a64(self.node(i).add(N_DATA + off)).load(Relaxed);
                let kp = key.add(4 + off);
                let kw = if off + 8 <= self.ds { read_word(kp) } else { read_tail(kp, self.ds - off) };
                (nw, kw)
            };
            let diff = u64::from_be_bytes((nw ^ kw).to_ne_bytes());
            if diff != 0 {
                matched += diff.leading_zeros();
                break;
            }
            matched += 64;
            off += 8;
        }
        matched.min(limit)
    }

    /// Lock-free longest-prefix-match: the node whose value answers `key`.
    ///
    /// # Safety
    /// `key` readable for key_size bytes.
    unsafe fn find_lpm(&self, key: *const u8) -> Option<u32> {
        // SAFETY: key readable (caller).
        if unsafe { Self::key_plen(key) } > self.max_plen {
            return None;
        }
        let mut found = None;
        let mut link = self.hdr(H_ROOT).load(Acquire);
        for _ in 0..self.max_plen + 2 {
            let Some(n) = self.dec(link) else { break };
            // SAFETY: key readable (caller).
            let m = unsafe { self.match_len(n, key) };
            if m == self.max_plen {
                found = Some(n);
                break;
            }
            let plen = self.plen(n);
            if m < plen {
                break;
            }
            if !self.is_im(n) {
                found = Some(n);
            }
            // m >= plen and m < max_plen, so plen < max_plen: a valid bit index.
            // SAFETY: key readable (caller).
            link = self.child(n, unsafe { Self::key_bit(key, plen) }).load(Acquire);
        }
        found
    }

    /// # Safety
    /// `key` readable for key_size bytes.
    #[inline(never)]
    pub(crate) unsafe fn lookup(&self, key: *const u8) -> *mut u8 {
        // SAFETY: key readable (caller).
        match unsafe { self.find_lpm(key) } {
            // SAFETY: n < n_nodes.
            Some(n) => unsafe { self.node(n).add(self.val_off) },
            None => std::ptr::null_mut(),
        }
    }

    pub(crate) fn lookup_elem(&self, key: &[u8], out: &mut [u8]) -> Result<(), MapError> {
        // SAFETY: key holds key_size bytes, out value_size bytes (checked by Map).
        unsafe {
            let n = self.find_lpm(key.as_ptr()).ok_or(ENOENT)?;
            copy_out(self.node(n).add(self.val_off), out.as_mut_ptr(), self.vs);
        }
        Ok(())
    }

    // ---- node allocation (under the lock) ----

    fn alloc(&self) -> Option<u32> {
        let head = self.hdr(H_FREE_HEAD);
        if let Some(n) = self.dec(head.load(Relaxed)) {
            let next = self.field(n, N_FLINK).load(Relaxed);
            head.store(if self.dec(next).is_some() { next } else { 0 }, Relaxed);
            if self.dec(next).is_none() {
                self.hdr(H_FREE_TAIL).store(0, Relaxed);
            }
            return Some(n);
        }
        let fresh = self.hdr(H_FRESH);
        let f = fresh.load(Relaxed);
        if f < self.n_nodes {
            fresh.store(f + 1, Relaxed);
            return Some(f);
        }
        None
    }

    fn free(&self, n: u32) {
        self.field(n, N_FLINK).store(0, Relaxed);
        let tail = self.hdr(H_FREE_TAIL);
        match self.dec(tail.load(Relaxed)) {
            Some(t) => self.field(t, N_FLINK).store(n + 1, Relaxed),
            None => self.hdr(H_FREE_HEAD).store(n + 1, Relaxed),
        }
        tail.store(n + 1, Relaxed);
    }

    /// Fills node `n` (owned, unpublished) as a real node for `key` with `value`.
    ///
    /// # Safety
    /// `n < n_nodes`; `key` readable for key_size bytes, `value` for value_size bytes.
    unsafe fn fill(&self, n: u32, key: *const u8, value: *const u8) {
        // SAFETY: bounds from the caller.
        unsafe {
            let p = self.node(n);
            copy_in(p.add(N_DATA), key.add(4), self.ds);
            copy_in(p.add(self.val_off), value, self.vs);
        }
        // SAFETY: key readable for key_size >= 4 bytes (caller).
        let plen = unsafe { Self::key_plen(key) };
        self.field(n, N_PLEN).store(plen, Relaxed);
        self.field(n, N_FLAGS).store(0, Relaxed);
        self.child(n, 0).store(0, Relaxed);
        self.child(n, 1).store(0, Relaxed);
    }

    fn add_entry(&self, flags: u64) -> Result<(), MapError> {
        if flags == BPF_EXIST {
            return Err(ENOENT);
        }
        let c = self.hdr(H_COUNT);
        if c.load(Relaxed) >= self.max {
            return Err(MapError::new(libc::ENOSPC, "LPM trie is full"));
        }
        c.fetch_add(1, Relaxed);
        Ok(())
    }
    fn sub_entry(&self) {
        let _ = self.hdr(H_COUNT).fetch_update(Relaxed, Relaxed, |c| c.checked_sub(1));
    }

    /// # Safety
    /// `key` readable for key_size bytes, `value` for value_size bytes.
    pub(crate) unsafe fn update(
        &self,
        key: *const u8,
        value: *const u8,
        flags: u64,
        wait: Wait,
    ) -> Result<(), MapError> {
        if flags > BPF_EXIST {
            return Err(EBAD_FLAGS);
        }
        // SAFETY: key readable (caller).
        let kplen = unsafe { Self::key_plen(key) };
        if kplen > self.max_plen {
            return Err(einval("prefixlen beyond the key's data"));
        }
        let _g = SpinLock::new(self.hdr(H_LOCK)).lock(wait)?;
        let nomem = MapError::new(libc::ENOMEM, "no free LPM trie node");
        let mut slot: Slot<'_> = self.hdr(H_ROOT);
        let mut node = None;
        let mut matchlen = 0;
        for _ in 0..self.max_plen + 2 {
            node = self.dec(slot.load(Relaxed));
            let Some(n) = node else { break };
            // SAFETY: key readable (caller).
            matchlen = unsafe { self.match_len(n, key) };
            let plen = self.plen(n);
            if plen != matchlen || plen == kplen || plen >= self.max_plen {
                break;
            }
            // SAFETY: plen < kplen <= max_plen.
            slot = self.child(n, unsafe { Self::key_bit(key, plen) });
            node = None;
        }
        let Some(n) = node else {
            self.add_entry(flags)?;
            let Some(new) = self.alloc() else {
                self.sub_entry();
                return Err(nomem);
            };
            // SAFETY: new is ours; key/value readable (caller).
            unsafe { self.fill(new, key, value) };
            slot.store(new + 1, Release);
            return Ok(());
        };
        let plen = self.plen(n);
        if plen == matchlen {
            // plen == kplen: the same prefix. Replace the node.
            let counted = if self.is_im(n) {
                self.add_entry(flags)?;
                true
            } else {
                if flags == BPF_NOEXIST {
                    return Err(EEXIST);
                }
                false
            };
            let Some(new) = self.alloc() else {
                if counted {
                    self.sub_entry();
                }
                return Err(nomem);
            };
            // SAFETY: new is ours; key/value readable (caller).
            unsafe { self.fill(new, key, value) };
            self.child(new, 0).store(self.child(n, 0).load(Relaxed), Relaxed);
            self.child(new, 1).store(self.child(n, 1).load(Relaxed), Relaxed);
            slot.store(new + 1, Release);
            self.free(n);
            return Ok(());
        }
        self.add_entry(flags)?;
        let Some(new) = self.alloc() else {
            self.sub_entry();
            return Err(nomem);
        };
        // SAFETY: new is ours; key/value readable (caller).
        unsafe { self.fill(new, key, value) };
        if matchlen == kplen {
            // The new prefix contains the node's: insert it above the node.
            let bit = self.node_bit(n, matchlen);
            self.child(new, bit).store(n + 1, Relaxed);
            slot.store(new + 1, Release);
            return Ok(());
        }
        let Some(im) = self.alloc() else {
            self.free(new);
            self.sub_entry();
            return Err(nomem);
        };
        // SAFETY: im < n_nodes and ours; node n's data is ds8 bytes (copied word-wise).
        unsafe {
            let dst = self.node(im).add(N_DATA);
            let src = self.node(n).add(N_DATA);
            let mut off = 0;
            while off < self.ds {
                crate::mem::a64(dst.add(off)).store(crate::mem::a64(src.add(off)).load(Relaxed), Relaxed);
                off += 8;
            }
            zero(self.node(im).add(self.val_off), self.vs);
        }
        self.field(im, N_PLEN).store(matchlen, Relaxed);
        self.field(im, N_FLAGS).store(FLAG_IM, Relaxed);
        // SAFETY: matchlen < kplen <= max_plen; key readable.
        let (first, second) = if unsafe { Self::key_bit(key, matchlen) } == 1 { (n, new) } else { (new, n) };
        self.child(im, 0).store(first + 1, Relaxed);
        self.child(im, 1).store(second + 1, Relaxed);
        slot.store(im + 1, Release);
        Ok(())
    }

    /// # Safety
    /// `key` readable for key_size bytes.
    pub(crate) unsafe fn delete(&self, key: *const u8, wait: Wait) -> Result<(), MapError> {
        // SAFETY: key readable (caller).
        let kplen = unsafe { Self::key_plen(key) };
        if kplen > self.max_plen {
            return Err(einval("prefixlen beyond the key's data"));
        }
        let _g = SpinLock::new(self.hdr(H_LOCK)).lock(wait)?;
        let mut trim: Slot<'_> = self.hdr(H_ROOT);
        let mut trim2 = trim;
        let mut parent = None;
        let mut node = None;
        let mut matchlen = 0;
        for _ in 0..self.max_plen + 2 {
            node = self.dec(trim.load(Relaxed));
            let Some(n) = node else { break };
            // SAFETY: key readable (caller).
            matchlen = unsafe { self.match_len(n, key) };
            let plen = self.plen(n);
            if plen != matchlen || plen == kplen || plen >= self.max_plen {
                break;
            }
            parent = Some(n);
            trim2 = trim;
            // SAFETY: plen < kplen <= max_plen.
            trim = self.child(n, unsafe { Self::key_bit(key, plen) });
            node = None;
        }
        let Some(n) = node else { return Err(ENOENT) };
        let plen = self.plen(n);
        if plen != kplen || plen != matchlen || self.is_im(n) {
            return Err(ENOENT);
        }
        self.sub_entry();
        let c0 = self.child(n, 0).load(Relaxed);
        let c1 = self.child(n, 1).load(Relaxed);
        if self.dec(c0).is_some() && self.dec(c1).is_some() {
            self.field(n, N_FLAGS).fetch_or(FLAG_IM, Release);
            return Ok(());
        }
        if let Some(p) = parent
            && self.is_im(p)
            && self.dec(c0).is_none()
            && self.dec(c1).is_none()
        {
            let sibling = if self.child(p, 0).load(Relaxed) == n + 1 {
                self.child(p, 1).load(Relaxed)
            } else {
                self.child(p, 0).load(Relaxed)
            };
            trim2.store(sibling, Release);
            self.free(p);
            self.free(n);
            return Ok(());
        }
        let replacement = if self.dec(c0).is_some() {
            c0
        } else if self.dec(c1).is_some() {
            c1
        } else {
            0
        };
        trim.store(replacement, Release);
        self.free(n);
        Ok(())
    }

    pub(crate) fn update_elem(&self, key: &[u8], value: &[u8], flags: u64) -> Result<(), MapError> {
        // SAFETY: key holds key_size bytes, value value_size bytes (checked by Map).
        unsafe { self.update(key.as_ptr(), value.as_ptr(), flags, Wait::Sys) }
    }

    pub(crate) fn delete_elem(&self, key: &[u8]) -> Result<(), MapError> {
        // SAFETY: key holds key_size bytes (checked by Map).
        unsafe { self.delete(key.as_ptr(), Wait::Sys) }
    }

    /// Copies node `n`'s key (prefixlen, data) into `out`.
    fn copy_key(&self, n: u32, out: &mut [u8]) -> Result<(), MapError> {
        out[..4].copy_from_slice(&self.plen(n).to_ne_bytes());
        // SAFETY: n < n_nodes; out holds key_size = 4 + ds bytes.
        unsafe { copy_out(self.node(n).add(N_DATA), out.as_mut_ptr().add(4), self.ds) };
        Ok(())
    }

    /// The leftmost real node under `root` (the first in post-order... of the kernel's
    /// find_leftmost), copied into `out`.
    fn leftmost(&self, root: u32, out: &mut [u8]) -> Result<(), MapError> {
        let mut next = None;
        let mut link = root + 1;
        for _ in 0..self.max_plen + 2 {
            let Some(n) = self.dec(link) else { break };
            if self.is_im(n) {
                link = self.child(n, 0).load(Relaxed);
            } else {
                next = Some(n);
                link = self.child(n, 0).load(Relaxed);
                if self.dec(link).is_none() {
                    link = self.child(n, 1).load(Relaxed);
                }
            }
        }
        match next {
            Some(n) => self.copy_key(n, out),
            None => Err(ENOENT),
        }
    }

    pub(crate) fn get_next_key(&self, key: Option<&[u8]>, out: &mut [u8]) -> Result<(), MapError> {
        let _g = SpinLock::new(self.hdr(H_LOCK)).lock(Wait::Sys)?;
        let Some(root) = self.dec(self.hdr(H_ROOT).load(Relaxed)) else { return Err(ENOENT) };
        let key = match key {
            // SAFETY: k holds key_size >= 4 bytes.
            Some(k) if unsafe { Self::key_plen(k.as_ptr()) } <= self.max_plen => k,
            _ => return self.leftmost(root, out),
        };
        let kp = key.as_ptr();
        // SAFETY: kp readable for key_size bytes.
        let kplen = unsafe { Self::key_plen(kp) };
        let mut stack: Vec<u32> = Vec::with_capacity(self.max_plen as usize + 2);
        let mut link = root + 1;
        let mut found = None;
        let mut matchlen = 0;
        for _ in 0..self.max_plen + 2 {
            let Some(n) = self.dec(link) else {
                found = None;
                break;
            };
            stack.push(n);
            found = Some(n);
            // SAFETY: kp readable.
            matchlen = unsafe { self.match_len(n, kp) };
            let plen = self.plen(n);
            if plen != matchlen || plen == kplen || plen >= self.max_plen {
                break;
            }
            // SAFETY: plen < kplen <= max_plen.
            link = self.child(n, unsafe { Self::key_bit(kp, plen) }).load(Relaxed);
            found = None;
        }
        let Some(n) = found else { return self.leftmost(root, out) };
        if self.plen(n) != matchlen || self.is_im(n) {
            return self.leftmost(root, out);
        }
        let mut node = n;
        let mut sp = stack.len() - 1;
        while sp > 0 {
            let parent = stack[sp - 1];
            if self.child(parent, 0).load(Relaxed) == node + 1
                && let Some(right) = self.dec(self.child(parent, 1).load(Relaxed))
            {
                return self.leftmost(right, out);
            }
            if !self.is_im(parent) {
                return self.copy_key(parent, out);
            }
            node = parent;
            sp -= 1;
        }
        Err(ENOENT)
    }

    /// Entries (real nodes).
    pub fn len(&self) -> u32 {
        self.hdr(H_COUNT).load(Relaxed)
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    #[inline]
    pub(crate) fn contains(&self, addr: u64, len: u64) -> bool {
        if len > self.vs as u64 {
            return false;
        }
        let off = addr.wrapping_sub(self.nodes as u64);
        if off >= self.n_nodes as u64 * self.node_size as u64 {
            return false;
        }
        let within = off % self.node_size as u64;
        within >= self.val_off as u64 && within - self.val_off as u64 + len <= self.vs as u64
    }
}
