//! Strings: `strncmp`, `strtol`, `strtoul`, with the kernel's semantics. The program's
//! strings are read through the guard in small chunks (`-EFAULT` if they cannot be read,
//! which the kernel's verifier would have prevented).

use userbpf_vm::{HelperRegistry, guard};

use super::{EFAULT, EINVAL, helper, neg, read_from, write_to};

const CHUNK: usize = 64;

/// `long bpf_strncmp(s1, s1_sz, s2)`: the kernel's `strncmp(s1, s2, s1_sz)`, which returns
/// -1, 0 or 1.
unsafe extern "C" fn strncmp(s1: u64, s1_sz: u64, s2: u64, _: u64, _: u64) -> u64 {
    let n = s1_sz as u32 as usize;
    let mut off = 0usize;
    while off < n {
        let k = (n - off).min(CHUNK);
        let mut a = [0u8; CHUNK];
        if !read_from(&mut a[..k], s1.wrapping_add(off as u64)) {
            return EFAULT;
        }
        let mut b = [0u8; CHUNK + 1];
        // SAFETY: `b` holds k + 1 bytes; the guard tolerates any source.
        let r = unsafe { guard::copy_str(b.as_mut_ptr(), s2.wrapping_add(off as u64) as *const u8, k as u64 + 1) };
        if r <= 0 {
            return EFAULT;
        }
        for j in 0..k {
            let (c1, c2) = (a[j], b[j]);
            if c1 != c2 {
                return if c1 < c2 { (-1i64) as u64 } else { 1 };
            }
            if c1 == 0 {
                return 0;
            }
        }
        off += k;
    }
    0
}

/// The kernel's isspace (its ctype also counts 0xa0).
fn is_space(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r' | 0xa0)
}

/// Reads a program buffer byte by byte through a guarded window.
struct Window {
    base: u64,
    len: usize,
    start: usize,
    n: usize,
    buf: [u8; CHUNK],
}

impl Window {
    fn get(&mut self, i: usize) -> Result<u8, u64> {
        if i >= self.len {
            return Ok(0);
        }
        if i < self.start || i >= self.start + self.n {
            let n = (self.len - i).min(CHUNK);
            if !read_from(&mut self.buf[..n], self.base.wrapping_add(i as u64)) {
                return Err(EFAULT);
            }
            self.start = i;
            self.n = n;
        }
        Ok(self.buf[i - self.start])
    }
}

const BASE_MASK: u64 = 0x1f;

/// `__bpf_strtoull`: (value, negative, characters consumed) or the negative errno.
fn strtoull(buf: u64, buf_len: u64, flags: u64) -> Result<(u64, bool, u64), u64> {
    let mut base = (flags & BASE_MASK) as u32;
    if buf == 0 || buf_len == 0 {
        return Err(EINVAL);
    }
    if !matches!(base, 0 | 8 | 10 | 16) || flags & !BASE_MASK != 0 {
        return Err(EINVAL);
    }
    let len = usize::try_from(buf_len).unwrap_or(usize::MAX);
    let mut w = Window { base: buf, len, start: 0, n: 0, buf: [0; CHUNK] };
    let mut pos = 0usize;
    while pos < len && is_space(w.get(pos)?) {
        pos += 1;
    }
    let negative = pos < len && w.get(pos)? == b'-';
    if negative {
        pos += 1;
    }
    let mut consumed = pos as u64;
    if pos >= len {
        return Err(EINVAL);
    }
    // The kernel parses a NUL-terminated copy of at most 63 bytes.
    let mut s = [0u8; 64];
    let take = (len - pos).min(63);
    if !read_from(&mut s[..take], buf.wrapping_add(pos as u64)) {
        return Err(EFAULT);
    }
    let at = |i: usize| s.get(i).copied().unwrap_or(0);
    // _parse_integer_fixup_radix
    let mut i = 0usize;
    if base == 0 {
        base = if at(0) == b'0' {
            if at(1).eq_ignore_ascii_case(&b'x') && at(2).is_ascii_hexdigit() { 16 } else { 8 }
        } else {
            10
        };
    }
    if base == 16 && at(0) == b'0' && at(1).eq_ignore_ascii_case(&b'x') {
        i = 2;
    }
    // _parse_integer
    let start = i;
    let mut res = 0u64;
    let mut overflow = false;
    loop {
        let c = at(i);
        let lc = c.to_ascii_lowercase();
        let v = match c {
            b'0'..=b'9' => (c - b'0') as u32,
            _ if (b'a'..=b'f').contains(&lc) => (lc - b'a' + 10) as u32,
            _ => break,
        };
        if v >= base {
            break;
        }
        if res & (!0u64 << 60) != 0 && res > (u64::MAX - v as u64) / base as u64 {
            overflow = true;
        }
        res = res.wrapping_mul(base as u64).wrapping_add(v as u64);
        i += 1;
    }
    if overflow {
        return Err(neg(libc::ERANGE));
    }
    if i == start {
        return Err(EINVAL);
    }
    consumed += i as u64;
    Ok((res, negative, consumed))
}

/// `long bpf_strtol(buf, buf_len, flags, *res)`: characters consumed, with the value in
/// `*res` (0 on error).
unsafe extern "C" fn strtol(buf: u64, buf_len: u64, flags: u64, res: u64, _: u64) -> u64 {
    if !write_to(res, &0u64.to_ne_bytes()) {
        return EFAULT;
    }
    let (v, negative, consumed) = match strtoull(buf, buf_len, flags) {
        Ok(x) => x,
        Err(e) => return e,
    };
    let v = if negative {
        let n = v.wrapping_neg() as i64;
        if n > 0 {
            return neg(libc::ERANGE);
        }
        n
    } else {
        if (v as i64) < 0 {
            return neg(libc::ERANGE);
        }
        v as i64
    };
    if !write_to(res, &v.to_ne_bytes()) {
        return EFAULT;
    }
    consumed
}

/// `long bpf_strtoul(buf, buf_len, flags, *res)`: as strtol, unsigned; a `-` is `-EINVAL`.
unsafe extern "C" fn strtoul(buf: u64, buf_len: u64, flags: u64, res: u64, _: u64) -> u64 {
    if !write_to(res, &0u64.to_ne_bytes()) {
        return EFAULT;
    }
    let (v, negative, consumed) = match strtoull(buf, buf_len, flags) {
        Ok(x) => x,
        Err(e) => return e,
    };
    if negative {
        return EINVAL;
    }
    if !write_to(res, &v.to_ne_bytes()) {
        return EFAULT;
    }
    consumed
}

pub(crate) fn register(reg: &mut HelperRegistry) {
    reg.register(helper(105, "strtol", strtol));
    reg.register(helper(106, "strtoul", strtoul));
    reg.register(helper(182, "strncmp", strncmp));
}
