//! `trace_printk`, `trace_vprintk` and `snprintf`, with the kernel's format rules
//! (`bpf_bprintf_prepare`) and output (`bstr_printf`), and the trace sink that stands for
//! the kernel's trace buffer.
//!
//! # Formats
//!
//! As in the kernel, a format is checked and its arguments captured first, then printed:
//! - characters must be printable ASCII, white space or bytes from 0x80 (UTF-8 text; ASCII
//!   control characters are refused); `%%` prints `%`;
//! - a conversion is `%`, flags among `0 + - space`, an optional width (no precision, no
//!   `*`, no `#`), then one of `d i u x X` (with `l` or `ll`), `c`, `s`, `p`, `pK`, `px`,
//!   `ps`, `pS`, `pB`, `pi4`, `pI4`, `pi6`, `pI6`, `pks`, `pus`; `%s` and `%pks`/`%pus` must
//!   be followed by the end, white space or punctuation;
//! - there must be no more conversions than arguments (3 for `trace_printk`, at most 12
//!   for the others); a bad format is `-EINVAL`;
//! - strings and pre-formatted pointers share the kernel's 512-byte argument buffer: a
//!   string is cut to what is left of it, and conversions that find it full give `-ENOSPC`.
//!
//! Output follows `bstr_printf`: widths pad with spaces (zeros with `0`, not when
//! left-aligned), `+` and space give signed numbers a sign, `int` conversions take the low
//! 32 bits of the argument, `%p`/`%pK`/`%px` print 16 zero-padded hex digits (unless a width
//! is given), characters after `%p` that are letters or digits are skipped.
//!
//! Differences from the kernel, for user space: `%p` and `%pK` print the pointer itself,
//! not a hash of it (the addresses are the process's own); `%ps`, `%pS` and `%pB` print
//! `0x` and the address (what the kernel prints for an address without a symbol);
//! `%pks`, `%pi4`... read the program's memory as user memory (a program's stack and maps
//! are user memory here). Every read goes through the guard: a bad string pointer prints
//! as an empty string, a bad IP address as zeros, as in the kernel. Formats are read into
//! a stack buffer of [`FMT_MAX`] bytes: a longer one is `-E2BIG`.
//!
//! # The trace sink
//!
//! The kernel appends `trace_printk` lines to its trace buffer, read from `trace_pipe`. Here
//! the runtime installs a process-wide sink with [`set_trace_sink`]: a ring buffer map
//! (shared by the processes of a session), where each record is one line as `trace_pipe`
//! shows it, newline included:
//!
//! ```text
//!            <comm>-<tid>     [<cpu>] ..... <secs>.<usecs>: bpf_trace_printk: <msg>
//! ```
//!
//! (`%16s-%-7d [%03d] ` then the flags, then ` %5lu.%06lu: `, as trace_print_context.) The
//! time is CLOCK_MONOTONIC; the flags field is `.....` (no IRQ or preemption state in user
//! space); a message ending in a newline does not get a second one. Without a sink, or when
//! the ring is full, the line is counted in [`trace_lines_dropped`] and the helper still
//! returns what the kernel returns (the formatted length). Nothing is allocated: lines are
//! built in stack buffers.

use std::sync::Arc;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use userbpf_maps::{Map, MapError};
use userbpf_vm::{HelperRegistry, guard};

use super::{EFAULT, EINVAL, TASK_SIZE_MAX, helper, neg, read_from, write_to};
use crate::context;

/// Most arguments of `trace_vprintk` and `snprintf` (the kernel's MAX_BPRINTF_VARARGS).
pub const MAX_BPRINTF_VARARGS: usize = 12;
/// The kernel's buffer for strings and numbers captured from arguments.
pub const MAX_BPRINTF_BIN_ARGS: usize = 512;
/// The kernel's output buffer of `trace_printk` (messages are cut to 1023 bytes).
pub const MAX_BPRINTF_BUF: usize = 1024;
/// Longest format read (NUL included).
pub const FMT_MAX: usize = 2048;
/// The kernel's limit on a field width (FIELD_WIDTH_MAX).
const FIELD_WIDTH_MAX: i64 = (1 << 23) - 1;

// ---- the kernel's ctype, for ASCII ----

#[inline]
fn is_space(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}
#[inline]
fn is_print(c: u8) -> bool {
    (0x20..0x7f).contains(&c)
}
#[inline]
fn is_punct(c: u8) -> bool {
    c.is_ascii_punctuation()
}

// ---- output ----

/// Where formatted bytes go: stores what fits, counts everything.
pub(crate) trait Out {
    fn put(&mut self, b: &[u8]);
    fn pad(&mut self, c: u8, n: usize);
}

/// Output into a buffer of ours: keeps the first `buf.len()` bytes.
pub(crate) struct BufOut<'a> {
    buf: &'a mut [u8],
    /// Bytes produced (stored or not).
    len: usize,
}

impl<'a> BufOut<'a> {
    pub(crate) fn new(buf: &'a mut [u8]) -> BufOut<'a> {
        BufOut { buf, len: 0 }
    }
    /// Bytes produced so far (may exceed what was stored).
    pub(crate) fn len(&self) -> usize {
        self.len
    }
    /// Bytes stored.
    pub(crate) fn stored(&self) -> usize {
        self.len.min(self.buf.len())
    }
}

impl Out for BufOut<'_> {
    fn put(&mut self, b: &[u8]) {
        if let Some(room) = self.buf.get_mut(self.len..) {
            let n = room.len().min(b.len());
            room[..n].copy_from_slice(&b[..n]);
        }
        self.len = self.len.saturating_add(b.len());
    }
    fn pad(&mut self, c: u8, n: usize) {
        if let Some(room) = self.buf.get_mut(self.len..) {
            let k = room.len().min(n);
            room[..k].fill(c);
        }
        self.len = self.len.saturating_add(n);
    }
}

/// Output into program memory (`snprintf`'s buffer): keeps the first `limit` bytes, written
/// with guarded copies from a stack chunk.
struct GuestOut {
    dst: u64,
    limit: usize,
    chunk: [u8; 256],
    clen: usize,
    flushed: usize,
    total: usize,
    fault: bool,
}

impl GuestOut {
    fn new(dst: u64, limit: usize) -> GuestOut {
        GuestOut { dst, limit, chunk: [0; 256], clen: 0, flushed: 0, total: 0, fault: false }
    }
    fn flush(&mut self) {
        if self.clen > 0 {
            if !write_to(self.dst.wrapping_add(self.flushed as u64), &self.chunk[..self.clen]) {
                self.fault = true;
            }
            self.flushed += self.clen;
            self.clen = 0;
        }
    }
    fn push(&mut self, mut b: &[u8]) {
        while !b.is_empty() {
            let n = (self.chunk.len() - self.clen).min(b.len());
            self.chunk[self.clen..self.clen + n].copy_from_slice(&b[..n]);
            self.clen += n;
            b = &b[n..];
            if self.clen == self.chunk.len() {
                self.flush();
            }
        }
    }
    /// How many of `n` more bytes fit under the limit.
    fn accept(&self, n: usize) -> usize {
        self.limit.saturating_sub(self.total).min(n)
    }
}

impl Out for GuestOut {
    fn put(&mut self, b: &[u8]) {
        let k = self.accept(b.len());
        self.push(&b[..k]);
        self.total = self.total.saturating_add(b.len());
    }
    fn pad(&mut self, c: u8, n: usize) {
        let mut k = self.accept(n);
        let fill = [c; 64];
        while k > 0 {
            let m = k.min(fill.len());
            self.push(&fill[..m]);
            k -= m;
        }
        self.total = self.total.saturating_add(n);
    }
}

// ---- vsprintf's number() and string() ----

const LEFT: u8 = 1;
const PLUS: u8 = 2;
const SPACE: u8 = 4;
const ZEROPAD: u8 = 8;
const SPECIAL: u8 = 16;

#[derive(Clone, Copy)]
struct Spec {
    flags: u8,
    /// -1: none.
    width: i64,
}

fn number<O: Out>(out: &mut O, mut num: u64, base: u64, signed: bool, upper: bool, spec: Spec) {
    let mut flags = spec.flags;
    if flags & LEFT != 0 {
        flags &= !ZEROPAD;
    }
    let mut fw = spec.width;
    let mut sign = 0u8;
    if signed {
        if (num as i64) < 0 {
            sign = b'-';
            num = (num as i64).wrapping_neg() as u64;
            fw -= 1;
        } else if flags & PLUS != 0 {
            sign = b'+';
            fw -= 1;
        } else if flags & SPACE != 0 {
            sign = b' ';
            fw -= 1;
        }
    }
    let digits: &[u8; 16] = if upper { b"0123456789ABCDEF" } else { b"0123456789abcdef" };
    let mut tmp = [0u8; 24];
    let mut i = tmp.len();
    loop {
        i -= 1;
        tmp[i] = digits[(num % base) as usize];
        num /= base;
        if num == 0 {
            break;
        }
    }
    let nd = (tmp.len() - i) as i64;
    fw -= nd;
    if flags & (ZEROPAD | LEFT) == 0 && fw > 0 {
        out.pad(b' ', fw as usize);
        fw = 0;
    }
    if sign != 0 {
        out.put(&[sign]);
    }
    if flags & LEFT == 0 && fw > 0 {
        out.pad(if flags & ZEROPAD != 0 { b'0' } else { b' ' }, fw as usize);
        fw = 0;
    }
    out.put(&tmp[i..]);
    if fw > 0 {
        out.pad(b' ', fw as usize);
    }
}

fn string<O: Out>(out: &mut O, s: &[u8], spec: Spec) {
    let pad = if spec.width > s.len() as i64 { (spec.width - s.len() as i64) as usize } else { 0 };
    if spec.flags & LEFT == 0 {
        out.pad(b' ', pad);
    }
    out.put(s);
    if spec.flags & LEFT != 0 {
        out.pad(b' ', pad);
    }
}

/// `pointer_string`: hex, 16 zero-padded digits unless a width is given.
fn pointer_string<O: Out>(out: &mut O, p: u64, mut spec: Spec) {
    if spec.width == -1 {
        spec.width = 16;
        spec.flags |= ZEROPAD;
    }
    number(out, p, 16, false, false, spec);
}

/// `0x` and the address in hex, into `buf`; the used part.
fn hex0x(v: u64, buf: &mut [u8; 18]) -> &[u8] {
    let mut o = BufOut::new(buf);
    o.put(b"0x");
    number(&mut o, v, 16, false, false, Spec { flags: 0, width: -1 });
    let n = o.stored();
    &buf[..n]
}

/// `%pI4` / `%pi4` / `%pI6` / `%pi6` of `ip`, into `buf`.
fn format_ip<'a>(kind: u8, ip: &[u8], buf: &'a mut [u8; 40]) -> &'a [u8] {
    let mut o = BufOut::new(buf);
    if ip.len() == 4 {
        for (k, &b) in ip.iter().enumerate() {
            if k > 0 {
                o.put(b".");
            }
            let spec = if kind == b'i' { Spec { flags: ZEROPAD, width: 3 } } else { Spec { flags: 0, width: -1 } };
            number(&mut o, b as u64, 10, false, false, spec);
        }
    } else {
        for (k, &b) in ip.iter().enumerate() {
            if kind == b'I' && k > 0 && k % 2 == 0 {
                o.put(b":");
            }
            number(&mut o, b as u64, 16, false, false, Spec { flags: ZEROPAD, width: 2 });
        }
    }
    let n = o.stored();
    &buf[..n]
}

// ---- bpf_bprintf_prepare ----

#[derive(Clone, Copy)]
enum Arg {
    /// A number or a pointer printed by `pointer()`.
    Num(u64),
    /// A string in the argument buffer: offset, length (without the NUL).
    Str(u16, u16),
    Char(u8),
}

/// Arguments captured by [`prepare`].
pub(crate) struct Args {
    vals: [Arg; MAX_BPRINTF_VARARGS],
    strs: [u8; MAX_BPRINTF_BIN_ARGS],
}

impl Args {
    pub(crate) fn new() -> Args {
        Args { vals: [Arg::Num(0); MAX_BPRINTF_VARARGS], strs: [0; MAX_BPRINTF_BIN_ARGS] }
    }
    fn set(&mut self, k: usize, a: Arg) {
        if let Some(v) = self.vals.get_mut(k) {
            *v = a;
        }
    }
    fn str(&self, off: u16, len: u16) -> &[u8] {
        let off = off as usize;
        self.strs.get(off..off + len as usize).unwrap_or(&[])
    }
    /// Stores `s` at `*pos` as the kernel's snprintf into the remaining buffer would (cut to
    /// fit with its NUL), advancing `*pos` by its full length + 1 (capped at the end).
    fn store_preformatted(&mut self, pos: &mut usize, s: &[u8]) -> Arg {
        let room = MAX_BPRINTF_BIN_ARGS - *pos;
        let w = s.len().min(room.saturating_sub(1));
        if let Some(dst) = self.strs.get_mut(*pos..*pos + w) {
            dst.copy_from_slice(&s[..w]);
        }
        if let Some(nul) = self.strs.get_mut(*pos + w) {
            *nul = 0;
        }
        let a = Arg::Str(*pos as u16, w as u16);
        *pos = (*pos + s.len() + 1).min(MAX_BPRINTF_BIN_ARGS);
        a
    }
}

/// Copies the string at program address `p` into `buf` as `bpf_trace_copy_string` does:
/// bytes written including the NUL, at least 1 (an empty string if `p` cannot be read).
fn copy_string(p: u64, buf: &mut [u8]) -> usize {
    if buf.is_empty() {
        return 0;
    }
    if p < TASK_SIZE_MAX {
        // SAFETY: `buf` is ours and non-empty; the guard tolerates any source.
        let r = unsafe { guard::copy_str(buf.as_mut_ptr(), p as *const u8, buf.len() as u64) };
        if r > 0 {
            return r as usize;
        }
    }
    buf[0] = 0;
    1
}

/// Checks `fmt` (without its NUL) and captures the arguments its conversions use, as
/// `bpf_bprintf_prepare`. Errors are positive errnos.
pub(crate) fn prepare(fmt: &[u8], raw: &[u64], a: &mut Args) -> Result<(), i32> {
    const BIN: usize = MAX_BPRINTF_BIN_ARGS;
    let at = |i: usize| fmt.get(i).copied().unwrap_or(0);
    let n = fmt.len();
    let mut i = 0usize;
    let mut num_spec = 0usize;
    let mut pos = 0usize;
    // Reserves room for a number of `size` bytes (4-aligned), as the kernel does.
    let num_slot = |pos: &mut usize, size: usize| -> Result<(), i32> {
        *pos = (*pos + 3) & !3;
        if BIN.saturating_sub(*pos) < size {
            return Err(libc::ENOSPC);
        }
        *pos += size;
        Ok(())
    };
    while i < n {
        let c = at(i);
        // ASCII control characters are refused; bytes from 0x80 (UTF-8 text) pass, as the
        // kernel (6.18) lets them.
        if c.is_ascii() && !(is_print(c) || is_space(c)) {
            return Err(libc::EINVAL);
        }
        if c != b'%' {
            i += 1;
            continue;
        }
        if at(i + 1) == b'%' {
            i += 2;
            continue;
        }
        let Some(&arg) = raw.get(num_spec) else { return Err(libc::EINVAL) };
        i += 1;
        while matches!(at(i), b'0' | b'+' | b'-' | b' ') {
            i += 1;
        }
        if (b'1'..=b'9').contains(&at(i)) {
            i += 1;
            while at(i).is_ascii_digit() {
                i += 1;
            }
        }
        let conv = at(i);
        if conv == b'p' {
            let c1 = at(i + 1);
            if (c1 == b'k' || c1 == b'u') && at(i + 2) == b's' {
                // %pks, %pus: a string, below (user and "kernel" strings are both process
                // memory here).
                i += 2;
            } else if c1 == 0 || is_space(c1) || is_punct(c1) || matches!(c1, b'K' | b'x' | b's' | b'S') {
                // A pointer printed as a number (or a symbol).
                num_slot(&mut pos, 8)?;
                a.set(num_spec, Arg::Num(arg));
                num_spec += 1;
                i += 2;
                continue;
            } else if c1 == b'B' {
                let mut tmp = [0u8; 18];
                let s = hex0x(arg, &mut tmp);
                let v = a.store_preformatted(&mut pos, s);
                a.set(num_spec, v);
                num_spec += 1;
                i += 2;
                continue;
            } else {
                if !((c1 == b'i' || c1 == b'I') && (at(i + 2) == b'4' || at(i + 2) == b'6')) {
                    return Err(libc::EINVAL);
                }
                i += 2;
                let ip_len = if at(i) == b'4' { 4 } else { 16 };
                if BIN - pos < ip_len {
                    return Err(libc::ENOSPC);
                }
                let mut ip = [0u8; 16];
                if !read_from(&mut ip[..ip_len], arg) {
                    ip = [0; 16];
                }
                let mut tmp = [0u8; 40];
                let s = format_ip(c1, &ip[..ip_len], &mut tmp);
                let v = a.store_preformatted(&mut pos, s);
                a.set(num_spec, v);
                num_spec += 1;
                i += 1;
                continue;
            }
        } else if conv == b'c' {
            if pos >= BIN {
                return Err(libc::ENOSPC);
            }
            a.set(num_spec, Arg::Char(arg as u8));
            pos += 1;
            num_spec += 1;
            i += 1;
            continue;
        } else if conv != b's' {
            let mut size = 4;
            if at(i) == b'l' {
                size = 8;
                i += 1;
            }
            if at(i) == b'l' {
                size = 8;
                i += 1;
            }
            if !matches!(at(i), b'i' | b'd' | b'u' | b'x' | b'X') {
                return Err(libc::EINVAL);
            }
            num_slot(&mut pos, size)?;
            a.set(num_spec, Arg::Num(arg));
            num_spec += 1;
            i += 1;
            continue;
        }
        // %s, %pks, %pus: `i` is at the `s`.
        let c1 = at(i + 1);
        if c1 != 0 && !is_space(c1) && !is_punct(c1) {
            return Err(libc::EINVAL);
        }
        if pos >= BIN {
            return Err(libc::ENOSPC);
        }
        let len = copy_string(arg, &mut a.strs[pos..]);
        a.set(num_spec, Arg::Str(pos as u16, len.saturating_sub(1) as u16));
        pos += len;
        num_spec += 1;
        i += 1;
    }
    Ok(())
}

// ---- bstr_printf ----

/// Prints `fmt` (checked by [`prepare`]) with the captured arguments, as `bstr_printf`.
pub(crate) fn format<O: Out>(fmt: &[u8], a: &Args, out: &mut O) {
    let at = |i: usize| fmt.get(i).copied().unwrap_or(0);
    let n = fmt.len();
    let mut i = 0usize;
    let mut k = 0usize;
    let mut next = || {
        let v = a.vals.get(k).copied().unwrap_or(Arg::Num(0));
        k += 1;
        v
    };
    while i < n {
        let start = i;
        while i < n && at(i) != b'%' {
            i += 1;
        }
        if i > start {
            out.put(&fmt[start..i]);
        }
        if i >= n {
            break;
        }
        i += 1;
        let mut flags = 0u8;
        loop {
            match at(i) {
                b'-' => flags |= LEFT,
                b'+' => flags |= PLUS,
                b' ' => flags |= SPACE,
                b'#' => flags |= SPECIAL,
                b'0' => flags |= ZEROPAD,
                _ => break,
            }
            i += 1;
        }
        let mut width = -1i64;
        if at(i).is_ascii_digit() {
            width = 0;
            while at(i).is_ascii_digit() {
                width = (width * 10 + (at(i) - b'0') as i64).min(FIELD_WIDTH_MAX);
                i += 1;
            }
        }
        let spec = Spec { flags, width };
        let mut long = false;
        while at(i) == b'l' {
            long = true;
            i += 1;
        }
        let conv = at(i);
        i += 1;
        match conv {
            b'%' => out.put(b"%"),
            b'c' => {
                let c = match next() {
                    Arg::Char(c) => c,
                    Arg::Num(v) => v as u8,
                    Arg::Str(..) => 0,
                };
                let pad = if width > 1 { (width - 1) as usize } else { 0 };
                if flags & LEFT == 0 {
                    out.pad(b' ', pad);
                }
                out.put(&[c]);
                if flags & LEFT != 0 {
                    out.pad(b' ', pad);
                }
            }
            b's' => match next() {
                Arg::Str(off, len) => string(out, a.str(off, len), spec),
                _ => string(out, b"", spec),
            },
            b'p' => {
                let c1 = at(i);
                let v = next();
                match (c1, v) {
                    (b'S' | b's', Arg::Num(p)) => {
                        let mut tmp = [0u8; 18];
                        string(out, hex0x(p, &mut tmp), spec);
                    }
                    (_, Arg::Num(p)) if matches!(c1, b'x' | b'K' | b'e') || !c1.is_ascii_alphanumeric() => {
                        pointer_string(out, p, spec)
                    }
                    (_, Arg::Str(off, len)) => out.put(a.str(off, len)),
                    _ => {}
                }
                while at(i).is_ascii_alphanumeric() {
                    i += 1;
                }
            }
            b'd' | b'i' | b'u' | b'x' | b'X' => {
                let raw = match next() {
                    Arg::Num(v) => v,
                    Arg::Char(c) => c as u64,
                    Arg::Str(..) => 0,
                };
                let signed = matches!(conv, b'd' | b'i');
                let v = match (long, signed) {
                    (true, _) => raw,
                    (false, true) => raw as u32 as i32 as i64 as u64,
                    (false, false) => raw as u32 as u64,
                };
                let base = if matches!(conv, b'x' | b'X') { 16 } else { 10 };
                number(out, v, base, signed, conv == b'X', spec);
            }
            // FORMAT_TYPE_INVALID (or the end): bstr_printf stops.
            _ => break,
        }
    }
}

// ---- reading formats and arguments from the program ----

/// A format of at most `size` bytes at `p` that must hold a NUL (trace_printk's): its bytes
/// before the NUL, in `buf`.
fn read_sized_fmt(p: u64, size: u64, buf: &mut [u8; FMT_MAX]) -> Result<usize, u64> {
    let n = size.min(FMT_MAX as u64) as usize;
    if !read_from(&mut buf[..n], p) {
        return Err(EFAULT);
    }
    match buf[..n].iter().position(|&b| b == 0) {
        Some(len) => Ok(len),
        None if size as usize <= FMT_MAX => Err(EINVAL),
        None => Err(neg(libc::E2BIG)),
    }
}

/// A NUL-terminated format at `p` (snprintf's): its length, the bytes in `buf`.
fn read_cstr_fmt(p: u64, buf: &mut [u8; FMT_MAX]) -> Result<usize, u64> {
    // SAFETY: `buf` is ours, FMT_MAX bytes; the guard tolerates any source.
    let r = unsafe { guard::copy_str(buf.as_mut_ptr(), p as *const u8, FMT_MAX as u64) };
    if r <= 0 {
        return Err(EFAULT);
    }
    let r = r as usize;
    if r == FMT_MAX {
        // Either exactly FMT_MAX - 1 characters, or longer.
        let mut last = [0u8; 1];
        if !read_from(&mut last, p.wrapping_add(FMT_MAX as u64 - 1)) || last[0] != 0 {
            return Err(neg(libc::E2BIG));
        }
    }
    Ok(r - 1)
}

/// The u64 arguments of `trace_vprintk`/`snprintf`: checks `data_len` as the kernel does.
fn read_args(data: u64, data_len: u64, buf: &mut [u64; MAX_BPRINTF_VARARGS]) -> Result<usize, u64> {
    let data_len = data_len as u32 as usize;
    if !data_len.is_multiple_of(8) || data_len > MAX_BPRINTF_VARARGS * 8 || (data_len != 0 && data == 0) {
        return Err(EINVAL);
    }
    let n = data_len / 8;
    let mut bytes = [0u8; MAX_BPRINTF_VARARGS * 8];
    if !read_from(&mut bytes[..data_len], data) {
        return Err(EFAULT);
    }
    for (k, v) in buf.iter_mut().take(n).enumerate() {
        let mut w = [0u8; 8];
        w.copy_from_slice(&bytes[8 * k..8 * k + 8]);
        *v = u64::from_ne_bytes(w);
    }
    Ok(n)
}

// ---- the trace sink ----

static SINK: AtomicPtr<Map> = AtomicPtr::new(std::ptr::null_mut());
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Installs the ring buffer map that receives `trace_printk` lines (or removes it with
/// `None`). `EINVAL` if the map is not a ring buffer. A replaced sink stays mapped (its
/// `Arc` is leaked): a helper on another thread may be writing to it.
pub fn set_trace_sink(map: Option<Arc<Map>>) -> Result<(), MapError> {
    let p = match map {
        Some(m) => {
            if !matches!(*m, Map::RingBuf(_)) {
                return Err(MapError::new(libc::EINVAL, "the trace sink must be a ring buffer map"));
            }
            Arc::into_raw(m) as *mut Map
        }
        None => std::ptr::null_mut(),
    };
    SINK.store(p, Ordering::Release);
    Ok(())
}

/// Whether a trace sink is installed.
pub fn has_trace_sink() -> bool {
    !SINK.load(Ordering::Acquire).is_null()
}

/// Lines `trace_printk` could not deliver (no sink, or the ring was full).
pub fn trace_lines_dropped() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

/// Room for the context prefix (comm, tid, cpu, flags, time, event name).
const LINE_PREFIX_MAX: usize = 128;

/// Builds the trace_pipe line for `msg` in a stack buffer and writes it to the sink.
fn emit_line(msg: &[u8]) {
    let p = SINK.load(Ordering::Acquire);
    // SAFETY: non-null sinks come from Arc::into_raw and are never released.
    let Some(Map::RingBuf(rb)) = (unsafe { p.as_ref() }) else {
        DROPPED.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let mut line = [0u8; LINE_PREFIX_MAX + MAX_BPRINTF_BUF + 1];
    let mut o = BufOut::new(&mut line);
    let comm = super::task::comm();
    let clen = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
    let name: &[u8] = if clen == 0 { b"<...>" } else { &comm[..clen] };
    string(&mut o, name, Spec { flags: 0, width: 16 });
    o.put(b"-");
    let tid = super::task::pid_tgid() as u32;
    number(&mut o, tid as u64, 10, false, false, Spec { flags: LEFT, width: 7 });
    o.put(b" [");
    number(&mut o, context::current_cpu() as u64, 10, false, false, Spec { flags: ZEROPAD, width: 3 });
    o.put(b"] ..... ");
    let us = super::time::clock_ns(libc::CLOCK_MONOTONIC) / 1000;
    number(&mut o, us / 1_000_000, 10, false, false, Spec { flags: 0, width: 5 });
    o.put(b".");
    number(&mut o, us % 1_000_000, 10, false, false, Spec { flags: ZEROPAD, width: 6 });
    o.put(b": bpf_trace_printk: ");
    let msg = msg.strip_suffix(b"\n").unwrap_or(msg);
    o.put(msg);
    o.put(b"\n");
    let len = o.stored();
    // SAFETY: `line[..len]` is our own initialised buffer.
    if unsafe { rb.output(line.as_ptr(), len as u64, 0) }.is_err() {
        DROPPED.fetch_add(1, Ordering::Relaxed);
    }
}

/// Formats into the kernel's 1024-byte buffer, sends the line, returns bstr_printf's value.
fn trace_common(fmt: &[u8], raw: &[u64]) -> u64 {
    let mut args = Args::new();
    if let Err(e) = prepare(fmt, raw, &mut args) {
        return neg(e);
    }
    let mut buf = [0u8; MAX_BPRINTF_BUF - 1];
    let mut o = BufOut::new(&mut buf);
    format(fmt, &args, &mut o);
    let total = o.len();
    let stored = o.stored();
    // The event records the message as a C string.
    let msg = &buf[..stored];
    let msg = msg.iter().position(|&b| b == 0).map_or(msg, |z| &msg[..z]);
    emit_line(msg);
    total as u64
}

/// `long bpf_trace_printk(fmt, fmt_size, arg1, arg2, arg3)`: the formatted length, or
/// `-EINVAL` for a bad format.
unsafe extern "C" fn trace_printk(fmt: u64, fmt_size: u64, a1: u64, a2: u64, a3: u64) -> u64 {
    let mut fbuf = [0u8; FMT_MAX];
    let len = match read_sized_fmt(fmt, fmt_size as u32 as u64, &mut fbuf) {
        Ok(l) => l,
        Err(e) => return e,
    };
    trace_common(&fbuf[..len], &[a1, a2, a3])
}

/// `long bpf_trace_vprintk(fmt, fmt_size, args, data_len)`.
unsafe extern "C" fn trace_vprintk(fmt: u64, fmt_size: u64, data: u64, data_len: u64, _: u64) -> u64 {
    let mut raw = [0u64; MAX_BPRINTF_VARARGS];
    let n = match read_args(data, data_len, &mut raw) {
        Ok(n) => n,
        Err(e) => return e,
    };
    let mut fbuf = [0u8; FMT_MAX];
    let len = match read_sized_fmt(fmt, fmt_size as u32 as u64, &mut fbuf) {
        Ok(l) => l,
        Err(e) => return e,
    };
    trace_common(&fbuf[..len], &raw[..n])
}

/// Whether `fmt` is a format `bpf_snprintf` takes with `nargs` arguments (what the kernel's
/// verifier checks of a constant format when loading): false where [`prepare`] refuses it as
/// `-EINVAL` (the arguments' values do not matter to that; zeros stand for them).
///
/// More arguments than the helper takes (12) do not make the format invalid: the kernel loads
/// such a program, and the call fails when run (`-EINVAL`, as here).
pub fn snprintf_format_is_valid(fmt: &[u8], nargs: usize) -> bool {
    let raw = [0u64; MAX_BPRINTF_VARARGS];
    prepare(fmt, &raw[..nargs.min(MAX_BPRINTF_VARARGS)], &mut Args::new()) != Err(libc::EINVAL)
}

/// `long bpf_snprintf(str, str_size, fmt, data, data_len)`: the length of the whole output
/// including the NUL (the output is cut to `str_size`, NUL-terminated if `str_size` > 0), or
/// `-EINVAL` / `-ENOSPC` / `-EFAULT` (bad memory; the kernel's verifier prevents it).
unsafe extern "C" fn snprintf(str: u64, str_size: u64, fmt: u64, data: u64, data_len: u64) -> u64 {
    let str_size = str_size as u32 as usize;
    let mut raw = [0u64; MAX_BPRINTF_VARARGS];
    let n = match read_args(data, data_len, &mut raw) {
        Ok(n) => n,
        Err(e) => return e,
    };
    let mut fbuf = [0u8; FMT_MAX];
    let len = match read_cstr_fmt(fmt, &mut fbuf) {
        Ok(l) => l,
        Err(e) => return e,
    };
    let mut args = Args::new();
    if let Err(e) = prepare(&fbuf[..len], &raw[..n], &mut args) {
        return neg(e);
    }
    let mut o = GuestOut::new(str, str_size.saturating_sub(1));
    format(&fbuf[..len], &args, &mut o);
    o.flush();
    if str_size > 0 {
        let end = o.total.min(str_size - 1);
        if !write_to(str.wrapping_add(end as u64), &[0]) {
            o.fault = true;
        }
    }
    if o.fault {
        return EFAULT;
    }
    (o.total as u64).saturating_add(1)
}

pub(crate) fn register(reg: &mut HelperRegistry) {
    reg.register(helper(6, "trace_printk", trace_printk));
    reg.register(helper(165, "snprintf", snprintf));
    reg.register(helper(177, "trace_vprintk", trace_vprintk));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fmt(f: &str, raw: &[u64]) -> Result<String, i32> {
        let mut a = Args::new();
        prepare(f.as_bytes(), raw, &mut a)?;
        let mut buf = [0u8; 4096];
        let mut o = BufOut::new(&mut buf);
        format(f.as_bytes(), &a, &mut o);
        let n = o.stored();
        Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
    }

    #[test]
    fn numbers() {
        let m1 = -1i64 as u64;
        assert_eq!(fmt("%d %i %u %x %X", &[m1, 42, m1, 255, 255]).unwrap(), "-1 42 4294967295 ff FF");
        assert_eq!(
            fmt("%ld %lu %llx %lld", &[m1, m1, m1, i64::MIN as u64]).unwrap(),
            "-1 18446744073709551615 ffffffffffffffff -9223372036854775808"
        );
        assert_eq!(
            fmt("[%5d|%-5d|%05d|%+d|% d|%-05d]", &[42, 42, 42, 42, 42, 42]).unwrap(),
            "[   42|42   |00042|+42| 42|42   ]"
        );
        assert_eq!(fmt("[%05d|%+5d|%+05d]", &[-42i64 as u64, 7, 7]).unwrap(), "[-0042|   +7|+0007]");
        assert_eq!(fmt("%+u %+x", &[3, 3]).unwrap(), "3 3");
        assert_eq!(fmt("%2d", &[100]).unwrap(), "100");
        assert_eq!(fmt("100%%", &[]).unwrap(), "100%");
    }

    #[test]
    fn chars_strings_pointers() {
        let s = b"hello\0";
        let p = s.as_ptr() as u64;
        assert_eq!(
            fmt("%c%c|%3c|%-3c|", &[b'o' as u64, b'k' as u64, b'x' as u64, b'y' as u64]).unwrap(),
            "ok|  x|y  |"
        );
        assert_eq!(fmt("%s|%8s|%-8s|", &[p, p, p]).unwrap(), "hello|   hello|hello   |");
        assert_eq!(fmt("[%s]", &[0]).unwrap(), "[]");
        assert_eq!(
            fmt("%p %px %pK", &[0x1234, 0xabc, 0]).unwrap(),
            "0000000000001234 0000000000000abc 0000000000000000"
        );
        assert_eq!(fmt("%8p|%-8px|", &[0x1234, 0x1234]).unwrap(), "    1234|1234    |");
        assert_eq!(fmt("%ps %pS %pB", &[0x10, 0x20, 0x30]).unwrap(), "0x10 0x20 0x30");
        assert_eq!(fmt("%pks,%pus.", &[p, p]).unwrap(), "hello,hello.");
        assert_eq!(fmt("%pxabc!", &[1]).unwrap(), "0000000000000001!");
        let v4 = [10u8, 0, 2, 15];
        let v6 = [0x20u8, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
        assert_eq!(fmt("%pI4 %pi4", &[v4.as_ptr() as u64, v4.as_ptr() as u64]).unwrap(), "10.0.2.15 010.000.002.015");
        assert_eq!(fmt("%pI6", &[v6.as_ptr() as u64]).unwrap(), "2001:0db8:0000:0000:0000:0000:0000:0001");
        assert_eq!(fmt("%pi6", &[v6.as_ptr() as u64]).unwrap(), "20010db8000000000000000000000001");
        assert_eq!(fmt("%pI4", &[8]).unwrap(), "0.0.0.0");
    }

    #[test]
    fn bad_formats() {
        let e = Err(libc::EINVAL);
        assert_eq!(fmt("%d", &[]), e);
        assert_eq!(fmt("%d %d", &[1]), e);
        assert_eq!(fmt("%o", &[1]), e);
        assert_eq!(fmt("%hd", &[1]), e);
        assert_eq!(fmt("%.3d", &[1]), e);
        assert_eq!(fmt("%#x", &[1]), e);
        assert_eq!(fmt("%*d", &[1]), e);
        assert_eq!(fmt("%sx", &[1]), e);
        assert_eq!(fmt("%pz", &[1]), e);
        assert_eq!(fmt("%pI5", &[1]), e);
        assert_eq!(fmt("%", &[1]), e);
        // UTF-8 passes (the kernel 6.18 lets bytes from 0x80 through), ASCII controls do not.
        assert_eq!(fmt("caf\u{e9}", &[]), Ok("caf\u{e9}".into()));
        assert_eq!(fmt("a\x01", &[]), e);
        assert_eq!(fmt("a\x7f", &[]), e);
        assert!(fmt("tab\tnl\n", &[]).is_ok());
    }

    #[test]
    fn argument_buffer_limit() {
        let long = [b'a'; 600];
        let mut s = long.to_vec();
        s.push(0);
        let p = s.as_ptr() as u64;
        // The first string takes the whole 512-byte buffer (511 chars + NUL).
        let out = fmt("%s", &[p]).unwrap();
        assert_eq!(out.len(), 511);
        assert_eq!(fmt("%s%s", &[p, p]), Err(libc::ENOSPC));
        assert_eq!(fmt("%s%d", &[p, 1]), Err(libc::ENOSPC));
        assert_eq!(fmt("%s%c", &[p, 1]), Err(libc::ENOSPC));
    }
}
