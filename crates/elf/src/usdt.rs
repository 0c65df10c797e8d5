//! USDT probes in ELF files (`<sys/sdt.h>`, SystemTap's `.note.stapsdt` notes): reading the
//! notes and parsing their argument strings (`-4@%edi 8@-16(%rbp) 8@$5`) as libbpf's `usdt.c`
//! records them. Locating a probe in a running process is the hook engine's
//! (`userbpf_hook::usdt`).
//!
//! * A note's pc is adjusted for prelinking like libbpf: when the file has a `.stapsdt.base`
//!   section and the note records a base, `pc += base_section_addr - note_base`.
//! * The semaphore (0: none) is a `u16` in `.probes`, at virtual address `sema`.
//! * Argument locations: constants (`N@$VAL`), registers (`N@%REG`), and memory addressed by a
//!   register plus a displacement (`N@DISP(%REG)`, `N@(%REG)`). Sizes are 1, 2, 4 or 8 bytes,
//!   negative for signed values. Register offsets are offsets into the kernel's x86-64
//!   `struct pt_regs`. Like libbpf 1.1, index-scaled operands (`-4@-20(%rbp,%rax,4)`) and
//!   symbolic displacements (`8@counter(%rip)`) are refused.

use std::path::Path;

/// How an argument is found, as libbpf's `enum __bpf_usdt_arg_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgKind {
    /// The value is `val_off`.
    Const = 0,
    /// The value is the register at `reg_off` in `struct pt_regs`.
    Reg = 1,
    /// The value is in memory at (register at `reg_off`) + `val_off`.
    RegDeref = 2,
}

/// One argument of a probe, as libbpf's `struct __bpf_usdt_arg_spec` records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArgSpec {
    pub kind: ArgKind,
    /// The constant, or the displacement for [`ArgKind::RegDeref`].
    pub val_off: u64,
    /// Offset of the register in `struct pt_regs` (0 for constants).
    pub reg_off: i16,
    pub signed: bool,
    /// `64 - 8 * size`: bits to clear (or sign-extend) from the 8 bytes read.
    pub bitshift: u8,
}

/// One `.note.stapsdt` note.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    pub provider: String,
    pub name: String,
    /// The probe's address in the file's virtual addresses, adjusted for prelinking.
    pub pc: u64,
    /// The note's own pc field, as written.
    pub raw_pc: u64,
    /// The note's base field.
    pub base: u64,
    /// The semaphore's virtual address (0: none).
    pub sema: u64,
    /// The argument string, e.g. `-4@%edi 8@-16(%rbp)`.
    pub args: String,
}

/// The most arguments libbpf's BPF side reads (`BPF_USDT_MAX_ARG_CNT`).
pub const MAX_ARGS: usize = 12;

/// Offset of register `name` (without `%`) inside `struct pt_regs`, after libbpf's
/// `calc_pt_regs_off` for x86-64 (sub-registers name their full register).
pub fn pt_regs_offset(name: &str) -> Option<i16> {
    const R: [(&[&str], usize); 17] = [
        (&["rip", "eip"], 16),
        (&["rax", "eax", "ax", "al"], 10),
        (&["rbx", "ebx", "bx", "bl"], 5),
        (&["rcx", "ecx", "cx", "cl"], 11),
        (&["rdx", "edx", "dx", "dl"], 12),
        (&["rsi", "esi", "si", "sil"], 13),
        (&["rdi", "edi", "di", "dil"], 14),
        (&["rbp", "ebp", "bp", "bpl"], 4),
        (&["rsp", "esp", "sp", "spl"], 19),
        (&["r8", "r8d", "r8w", "r8b"], 9),
        (&["r9", "r9d", "r9w", "r9b"], 8),
        (&["r10", "r10d", "r10w", "r10b"], 7),
        (&["r11", "r11d", "r11w", "r11b"], 6),
        (&["r12", "r12d", "r12w", "r12b"], 3),
        (&["r13", "r13d", "r13w", "r13b"], 2),
        (&["r14", "r14d", "r14w", "r14b"], 1),
        (&["r15", "r15d", "r15w", "r15b"], 0),
    ];
    R.iter().find(|(names, _)| names.contains(&name)).map(|(_, idx)| (idx * 8) as i16)
}

fn parse_int(s: &str) -> Option<i64> {
    let (neg, s) = match s.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    let v = if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        u64::from_str_radix(h, 16).ok()? as i64
    } else {
        s.parse::<u64>().ok()? as i64
    };
    Some(if neg { v.wrapping_neg() } else { v })
}

fn reg(s: &str, arg: &str) -> Result<i16, String> {
    let name = s.strip_prefix('%').ok_or_else(|| format!("argument `{arg}`: expected a register, got `{s}`"))?;
    pt_regs_offset(name).ok_or_else(|| format!("argument `{arg}`: unsupported register `%{name}`"))
}

/// Parses one argument (`SIZE@LOCATION`).
pub fn parse_arg(arg: &str) -> Result<ArgSpec, String> {
    let (size, loc) = arg.split_once('@').ok_or_else(|| format!("argument `{arg}`: no `SIZE@` prefix"))?;
    let size = parse_int(size).ok_or_else(|| format!("argument `{arg}`: bad size `{size}`"))?;
    let bytes = size.unsigned_abs();
    if !matches!(bytes, 1 | 2 | 4 | 8) {
        return Err(format!("argument `{arg}`: unsupported size {size}"));
    }
    let signed = size < 0;
    let bitshift = (64 - 8 * bytes) as u8;
    let (kind, val_off, reg_off) = if let Some(c) = loc.strip_prefix('$') {
        let v = parse_int(c).ok_or_else(|| format!("argument `{arg}`: unsupported constant `{c}`"))?;
        (ArgKind::Const, v as u64, 0)
    } else if loc.starts_with('%') {
        (ArgKind::Reg, 0, reg(loc, arg)?)
    } else if let Some((disp, rest)) = loc.split_once('(') {
        let inner = rest.strip_suffix(')').ok_or_else(|| format!("argument `{arg}`: unbalanced parenthesis"))?;
        if inner.contains(',') {
            return Err(format!("argument `{arg}`: index-scaled memory operands are not supported"));
        }
        let off = if disp.is_empty() {
            0
        } else {
            parse_int(disp)
                .ok_or_else(|| format!("argument `{arg}`: symbolic displacement `{disp}` is not supported"))?
        };
        (ArgKind::RegDeref, off as u64, reg(inner, arg)?)
    } else {
        return Err(format!("argument `{arg}`: unrecognised location `{loc}`"));
    };
    Ok(ArgSpec { kind, val_off, reg_off, signed, bitshift })
}

/// Parses a note's argument string (space separated; empty: no arguments).
pub fn parse_args(args: &str) -> Result<Vec<ArgSpec>, String> {
    let specs: Vec<ArgSpec> = args.split_ascii_whitespace().map(parse_arg).collect::<Result<_, _>>()?;
    if specs.len() > MAX_ARGS {
        return Err(format!("{} arguments, more than the {MAX_ARGS} supported", specs.len()));
    }
    Ok(specs)
}

fn u32_at(d: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(d.get(at..at + 4)?.try_into().ok()?))
}
fn u64_at(d: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(d.get(at..at + 8)?.try_into().ok()?))
}

/// The USDT notes of a 64-bit little-endian ELF file.
pub fn read_notes(path: &Path) -> Result<Vec<Note>, String> {
    use object::{Object, ObjectSection};
    let data = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let file = object::File::parse(&*data).map_err(|e| format!("{}: {e}", path.display()))?;
    if !file.is_64() || !file.is_little_endian() {
        return Err(format!("{}: only 64-bit little-endian ELF files are supported", path.display()));
    }
    let base_addr = file.section_by_name(".stapsdt.base").map(|s| s.address()).unwrap_or(0);
    let Some(sec) = file.section_by_name(".note.stapsdt") else {
        return Ok(Vec::new());
    };
    let d = sec.data().map_err(|e| format!("{}: .note.stapsdt: {e}", path.display()))?;
    let bad = || format!("{}: malformed .note.stapsdt", path.display());
    let align4 = |n: usize| (n + 3) & !3;
    let mut notes = Vec::new();
    let mut at = 0;
    while at + 12 <= d.len() {
        let namesz = u32_at(d, at).ok_or_else(bad)? as usize;
        let descsz = u32_at(d, at + 4).ok_or_else(bad)? as usize;
        let ntype = u32_at(d, at + 8).ok_or_else(bad)?;
        let name_at = at + 12;
        let desc_at = name_at + align4(namesz);
        let next = desc_at + align4(descsz);
        if next > d.len() || desc_at + descsz > d.len() {
            return Err(bad());
        }
        let owner = &d[name_at..name_at + namesz];
        at = next;
        if ntype != 3 || owner != b"stapsdt\0" {
            continue;
        }
        let desc = &d[desc_at..desc_at + descsz];
        let (Some(raw_pc), Some(base), Some(sema)) = (u64_at(desc, 0), u64_at(desc, 8), u64_at(desc, 16)) else {
            return Err(bad());
        };
        let mut strs = desc.get(24..).ok_or_else(bad)?.split(|b| *b == 0);
        let mut next_str = || strs.next().map(|s| String::from_utf8_lossy(s).into_owned()).ok_or_else(bad);
        let provider = next_str()?;
        let name = next_str()?;
        let args = next_str().unwrap_or_default();
        let mut pc = raw_pc;
        if base_addr != 0 && base != 0 {
            pc = pc.wrapping_add(base_addr).wrapping_sub(base);
        }
        notes.push(Note { provider, name, pc, raw_pc, base, sema, args });
    }
    Ok(notes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_parse_as_libbpf_records_them() {
        let a = parse_args("-4@%edi 8@-16(%rbp) 8@%rax -1@$-9 2@(%r12) 4@$0x10").unwrap();
        assert_eq!(a[0], ArgSpec { kind: ArgKind::Reg, val_off: 0, reg_off: 14 * 8, signed: true, bitshift: 32 });
        assert_eq!(
            a[1],
            ArgSpec { kind: ArgKind::RegDeref, val_off: (-16i64) as u64, reg_off: 4 * 8, signed: false, bitshift: 0 }
        );
        assert_eq!(a[2], ArgSpec { kind: ArgKind::Reg, val_off: 0, reg_off: 80, signed: false, bitshift: 0 });
        assert_eq!(
            a[3],
            ArgSpec { kind: ArgKind::Const, val_off: (-9i64) as u64, reg_off: 0, signed: true, bitshift: 56 }
        );
        assert_eq!(a[4], ArgSpec { kind: ArgKind::RegDeref, val_off: 0, reg_off: 24, signed: false, bitshift: 48 });
        assert_eq!(a[5].val_off, 16);
        assert!(parse_args("").unwrap().is_empty());
    }

    #[test]
    fn unsupported_arguments_are_refused_with_the_reason() {
        assert!(parse_arg("-4@-20(%rbp,%rax,4)").unwrap_err().contains("index-scaled"));
        assert!(parse_arg("8@counter(%rip)").unwrap_err().contains("symbolic"));
        assert!(parse_arg("3@%eax").unwrap_err().contains("size"));
        assert!(parse_arg("8@%xmm0").unwrap_err().contains("register"));
        assert!(parse_arg("%eax").unwrap_err().contains("SIZE@"));
    }
}
