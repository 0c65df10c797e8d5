//! Byte copies into and out of shared memory, key hashing and comparison, the kernel's jhash.
//!
//! Keys and values in map files start 8-byte aligned and are padded with zeros to a multiple
//! of 8 bytes, so shared memory is always read and written as whole aligned 64-bit words with
//! relaxed atomic loads and stores: a reader racing a writer (in another thread or process)
//! sees each word either old or new, never a data race in the language's sense. The other side
//! of a copy (a caller's buffer, a program's stack) is ordinary memory read or written
//! unaligned. Ordering between a value and the link that publishes it comes from the
//! acquire/release operations on links.

use std::ptr;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering::Relaxed};

/// `n` rounded up to a multiple of 8.
#[inline(always)]
pub(crate) const fn round8(n: usize) -> usize {
    (n + 7) & !7
}

/// `n` rounded up to a multiple of `a` (a power of two).
#[inline(always)]
pub(crate) const fn round_up(n: u64, a: u64) -> u64 {
    (n + a - 1) & !(a - 1)
}

/// The 32-bit word of shared memory at `p`.
///
/// # Safety
/// `p` is 4-byte aligned and inside a live mapping.
#[inline(always)]
pub(crate) unsafe fn a32<'a>(p: *mut u8) -> &'a AtomicU32 {
    debug_assert!(!p.is_null() && (p as usize).is_multiple_of(4), "a32: {p:p} is null or not 4-byte aligned");
    // SAFETY: the caller guarantees alignment and that the mapping outlives the use; atomics
    // may alias memory other processes access atomically.
    unsafe { AtomicU32::from_ptr(p.cast()) }
}

/// The 64-bit word of shared memory at `p`.
///
/// # Safety
/// `p` is 8-byte aligned and inside a live mapping.
#[inline(always)]
pub(crate) unsafe fn a64<'a>(p: *mut u8) -> &'a AtomicU64 {
    debug_assert!(!p.is_null() && (p as usize).is_multiple_of(8), "a64: {p:p} is null or not 8-byte aligned");
    // SAFETY: as for `a32`.
    unsafe { AtomicU64::from_ptr(p.cast()) }
}

/// The byte of shared memory at `p`.
///
/// # Safety
/// `p` is inside a live mapping.
#[inline(always)]
pub(crate) unsafe fn a8<'a>(p: *mut u8) -> &'a AtomicU8 {
    debug_assert!(!p.is_null());
    // SAFETY: as for `a32`; bytes need no alignment.
    unsafe { AtomicU8::from_ptr(p) }
}

/// The `len` (< 8) bytes at `p` as a word padded with zero bytes (in memory order).
///
/// # Safety
/// `p` is readable for `len` bytes.
#[inline(always)]
pub(crate) unsafe fn read_tail(p: *const u8, len: usize) -> u64 {
    debug_assert!(len < 8 && (len == 0 || !p.is_null()), "read_tail: {len} bytes at {p:p}");
    #[cfg(target_endian = "little")]
    {
        // Byte k of the word is the k-th byte in memory: assemble from 4-, 2- and 1-byte
        // reads instead of a variable-length memcpy.
        let mut v = 0u64;
        let mut at = 0;
        // SAFETY: every read lies within the `len` readable bytes (4 + 2 + 1 >= len).
        unsafe {
            if len & 4 != 0 {
                v = p.cast::<u32>().read_unaligned() as u64;
                at = 4;
            }
            if len & 2 != 0 {
                v |= (p.add(at).cast::<u16>().read_unaligned() as u64) << (8 * at);
                at += 2;
            }
            if len & 1 != 0 {
                v |= (*p.add(at) as u64) << (8 * at);
            }
        }
        v
    }
    #[cfg(not(target_endian = "little"))]
    {
        let mut b = [0u8; 8];
        // SAFETY: `len < 8` bytes readable at `p` (caller), written into a local array.
        unsafe { ptr::copy_nonoverlapping(p, b.as_mut_ptr(), len) };
        u64::from_ne_bytes(b)
    }
}

/// The 8 bytes at `p` (any alignment).
///
/// # Safety
/// `p` is readable for 8 bytes.
#[inline(always)]
pub(crate) unsafe fn read_word(p: *const u8) -> u64 {
    debug_assert!(!p.is_null());
    // SAFETY: readable for 8 bytes (caller); unaligned read.
    unsafe { p.cast::<u64>().read_unaligned() }
}

/// Copies `len` bytes of shared memory at `src` into `dst`.
///
/// # Safety
/// `src` is 8-byte aligned and inside a mapping for `round8(len)` bytes; `dst` is writable for
/// `len` bytes and does not overlap the words read.
#[inline]
pub(crate) unsafe fn copy_out(src: *mut u8, dst: *mut u8, len: usize) {
    debug_assert!(
        len == 0 || ((src as usize).is_multiple_of(8) && !dst.is_null()),
        "copy_out: {len} bytes from {src:p} to {dst:p}"
    );
    let mut i = 0;
    while i + 8 <= len {
        // SAFETY: `src + i` is aligned and in bounds (i + 8 <= len); `dst + i` writable.
        unsafe {
            let w = a64(src.add(i)).load(Relaxed);
            dst.add(i).cast::<u64>().write_unaligned(w);
        }
        i += 8;
    }
    if i < len {
        // SAFETY: the last word is inside `round8(len)`; `len - i` bytes writable at `dst + i`.
        unsafe {
            let w = a64(src.add(i)).load(Relaxed).to_ne_bytes();
            ptr::copy_nonoverlapping(w.as_ptr(), dst.add(i), len - i);
        }
    }
}

/// Copies `len` bytes from `src` into shared memory at `dst`, zeroing the padding up to
/// `round8(len)`.
///
/// # Safety
/// `dst` is 8-byte aligned and inside a mapping for `round8(len)` bytes; `src` is readable for
/// `len` bytes.
#[inline]
pub(crate) unsafe fn copy_in(dst: *mut u8, src: *const u8, len: usize) {
    debug_assert!(
        len == 0 || ((dst as usize).is_multiple_of(8) && !src.is_null()),
        "copy_in: {len} bytes from {src:p} to {dst:p}"
    );
    let mut i = 0;
    while i + 8 <= len {
        // SAFETY: bounds as documented; unaligned read of the source.
        unsafe { a64(dst.add(i)).store(read_word(src.add(i)), Relaxed) };
        i += 8;
    }
    if i < len {
        // SAFETY: the last word is inside `round8(len)`; `len - i` bytes readable at `src + i`.
        unsafe { a64(dst.add(i)).store(read_tail(src.add(i), len - i), Relaxed) };
    }
}

/// Zeroes `round8(len)` bytes of shared memory at `dst`.
///
/// # Safety
/// `dst` is 8-byte aligned and inside a mapping for `round8(len)` bytes.
#[inline]
pub(crate) unsafe fn zero(dst: *mut u8, len: usize) {
    debug_assert!(len == 0 || (dst as usize).is_multiple_of(8), "zero: {len} bytes at {dst:p}");
    let mut i = 0;
    while i < len {
        // SAFETY: `i < round8(len)`, aligned.
        unsafe { a64(dst.add(i)).store(0, Relaxed) };
        i += 8;
    }
}

/// Whether the `len` bytes of shared memory at `shared` (zero-padded to `round8(len)`) equal
/// the `len` bytes at `other`.
///
/// # Safety
/// As for [`copy_out`] (`other` readable for `len` bytes).
#[inline(always)]
pub(crate) unsafe fn eq(shared: *mut u8, other: *const u8, len: usize) -> bool {
    debug_assert!(
        len == 0 || ((shared as usize).is_multiple_of(8) && !other.is_null()),
        "eq: {len} bytes at {shared:p} and {other:p}"
    );
    let mut i = 0;
    while i + 8 <= len {
        // SAFETY: bounds as documented.
        if unsafe { a64(shared.add(i)).load(Relaxed) != read_word(other.add(i)) } {
            return false;
        }
        i += 8;
    }
    if i < len {
        // SAFETY: bounds as documented; padding in shared memory is zero, like read_tail's.
        return unsafe { a64(shared.add(i)).load(Relaxed) == read_tail(other.add(i), len - i) };
    }
    true
}

/// 64×64→128-bit multiply, folded: the low and high halves xored (one `mul` instruction).
#[inline(always)]
fn fold_mul(a: u64, b: u64) -> u64 {
    let r = (a as u128).wrapping_mul(b as u128);
    (r as u64) ^ ((r >> 64) as u64)
}

/// The hash of a hash map's key: a seeded chain of folded multiplies over the key's 8-byte
/// words (the last one zero-padded), one more to finish. Every output bit depends on every
/// input bit, so the low bits can pick the bucket and all 32 pre-filter key comparisons.
///
/// # Safety
/// `key` is readable for `len` bytes.
#[inline(always)]
pub(crate) unsafe fn hash_key(key: *const u8, len: usize, seed: u64) -> u32 {
    debug_assert!(len == 0 || !key.is_null());
    const K1: u64 = 0x243f_6a88_85a3_08d3;
    const K2: u64 = 0x1319_8a2e_0370_7344;
    const K3: u64 = 0xa409_3822_299f_31d0;
    let mut h = seed ^ (len as u64).wrapping_mul(K3);
    let mut i = 0;
    while i + 8 <= len {
        // SAFETY: i + 8 <= len bytes readable.
        let w = unsafe { read_word(key.add(i)) };
        h = fold_mul(h ^ w, K1);
        i += 8;
    }
    if i < len {
        // SAFETY: len - i < 8 bytes readable.
        let w = unsafe { read_tail(key.add(i), len - i) };
        h = fold_mul(h ^ w, K1);
    }
    fold_mul(h, K2) as u32
}

// The kernel's jhash (Bob Jenkins' lookup3, include/linux/jhash.h), used where the kernel's
// exact bucket choice is observable: stack trace ids and bloom filter bits.

const JHASH_INITVAL: u32 = 0xdead_beef;

#[inline(always)]
fn jmix(a: &mut u32, b: &mut u32, c: &mut u32) {
    *a = a.wrapping_sub(*c);
    *a ^= c.rotate_left(4);
    *c = c.wrapping_add(*b);
    *b = b.wrapping_sub(*a);
    *b ^= a.rotate_left(6);
    *a = a.wrapping_add(*c);
    *c = c.wrapping_sub(*b);
    *c ^= b.rotate_left(8);
    *b = b.wrapping_add(*a);
    *a = a.wrapping_sub(*c);
    *a ^= c.rotate_left(16);
    *c = c.wrapping_add(*b);
    *b = b.wrapping_sub(*a);
    *b ^= a.rotate_left(19);
    *a = a.wrapping_add(*c);
    *c = c.wrapping_sub(*b);
    *c ^= b.rotate_left(4);
    *b = b.wrapping_add(*a);
}

#[inline(always)]
fn jfinal(a: &mut u32, b: &mut u32, c: &mut u32) {
    *c ^= *b;
    *c = c.wrapping_sub(b.rotate_left(14));
    *a ^= *c;
    *a = a.wrapping_sub(c.rotate_left(11));
    *b ^= *a;
    *b = b.wrapping_sub(a.rotate_left(25));
    *c ^= *b;
    *c = c.wrapping_sub(b.rotate_left(16));
    *a ^= *c;
    *a = a.wrapping_sub(c.rotate_left(4));
    *b ^= *a;
    *b = b.wrapping_sub(a.rotate_left(14));
    *c ^= *b;
    *c = c.wrapping_sub(b.rotate_left(24));
}

/// `jhash2(k, n, initval)` over `n` native-endian 32-bit words at `k`.
///
/// # Safety
/// `k` is readable for `4 * n` bytes.
pub(crate) unsafe fn jhash2(k: *const u8, n: usize, initval: u32) -> u32 {
    debug_assert!(n == 0 || !k.is_null());
    // SAFETY: word `i < n` lies inside the 4n readable bytes.
    let w = |i: usize| unsafe { k.add(4 * i).cast::<u32>().read_unaligned() };
    let mut a = JHASH_INITVAL.wrapping_add((n as u32) << 2).wrapping_add(initval);
    let (mut b, mut c) = (a, a);
    let mut i = 0;
    let mut len = n;
    while len > 3 {
        a = a.wrapping_add(w(i));
        b = b.wrapping_add(w(i + 1));
        c = c.wrapping_add(w(i + 2));
        jmix(&mut a, &mut b, &mut c);
        len -= 3;
        i += 3;
    }
    if len == 0 {
        return c;
    }
    if len == 3 {
        c = c.wrapping_add(w(i + 2));
    }
    if len >= 2 {
        b = b.wrapping_add(w(i + 1));
    }
    a = a.wrapping_add(w(i));
    jfinal(&mut a, &mut b, &mut c);
    c
}

/// `jhash(key, len, initval)` over `len` bytes at `k`.
///
/// # Safety
/// `k` is readable for `len` bytes.
pub(crate) unsafe fn jhash(k: *const u8, len: usize, initval: u32) -> u32 {
    debug_assert!(len == 0 || !k.is_null());
    // SAFETY: byte `i < len` is readable.
    let byte = |i: usize| unsafe { *k.add(i) } as u32;
    let word = |i: usize| byte(i) | byte(i + 1) << 8 | byte(i + 2) << 16 | byte(i + 3) << 24;
    let mut a = JHASH_INITVAL.wrapping_add(len as u32).wrapping_add(initval);
    let (mut b, mut c) = (a, a);
    let mut off = 0;
    let mut rest = len;
    while rest > 12 {
        a = a.wrapping_add(word(off));
        b = b.wrapping_add(word(off + 4));
        c = c.wrapping_add(word(off + 8));
        jmix(&mut a, &mut b, &mut c);
        rest -= 12;
        off += 12;
    }
    if rest == 0 {
        return c;
    }
    // The last 1..=12 bytes, little-endian into a, b, c as the kernel's switch adds them.
    for j in 0..rest {
        let v = byte(off + j) << (8 * (j % 4));
        match j / 4 {
            0 => a = a.wrapping_add(v),
            1 => b = b.wrapping_add(v),
            _ => c = c.wrapping_add(v),
        }
    }
    jfinal(&mut a, &mut b, &mut c);
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jhash_word_and_byte_agree_on_le_words() {
        // jhash over 4n bytes and jhash2 over n words agree (same length term, same blocks).
        let data: Vec<u8> = (0..24u8).collect();
        // SAFETY: data has 24 bytes.
        unsafe {
            assert_ne!(jhash2(data.as_ptr(), 6, 0), 0);
            assert_eq!(jhash2(data.as_ptr(), 6, 9), jhash(data.as_ptr(), 24, 9));
            assert_eq!(jhash2(data.as_ptr(), 5, 1), jhash(data.as_ptr(), 20, 1));
            assert_eq!(jhash2(data.as_ptr(), 0, 7), JHASH_INITVAL.wrapping_add(7));
        }
    }

    #[test]
    fn copies() {
        let mut shared = [0u64; 3];
        let p = shared.as_mut_ptr().cast::<u8>();
        let src: Vec<u8> = (1..=13).collect();
        let mut out = [0u8; 13];
        // SAFETY: `shared` has 24 aligned bytes; buffers are 13 bytes.
        unsafe {
            copy_in(p, src.as_ptr(), 13);
            assert!(eq(p, src.as_ptr(), 13));
            copy_out(p, out.as_mut_ptr(), 13);
            zero(p, 13);
            assert!(!eq(p, src.as_ptr(), 13));
        }
        assert_eq!(&out[..], &src[..]);
        assert_eq!(shared, [0, 0, 0]);
    }
}
