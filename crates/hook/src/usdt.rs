//! USDT probes (`<sys/sdt.h>`, SystemTap's `.note.stapsdt` notes) in this process: locating
//! a probe and its semaphore as libbpf's `usdt.c` does. Reading the notes and parsing their
//! arguments is `userbpf_elf::usdt`'s, re-exported here.
//!
//! * A note's pc is adjusted for prelinking like libbpf: when the file has a `.stapsdt.base`
//!   section and the note records a base, `pc += base_section_addr - note_base`. The address
//!   in this process is then `load bias + pc` (bias as `dl_iterate_phdr` reports it).
//! * The semaphore (0: none) is a `u16` in `.probes`; its address is `bias + sema` (libbpf
//!   does not adjust it for prelinking either). Users increment it while attached.
//! * Argument locations: constants (`N@$VAL`), registers (`N@%REG`), and memory addressed by a
//!   register plus a displacement (`N@DISP(%REG)`, `N@(%REG)`). Sizes are 1, 2, 4 or 8 bytes,
//!   negative for signed values. Register offsets are offsets into the kernel's x86-64
//!   `struct pt_regs` ([`crate::PtRegs`]). Like libbpf 1.1, index-scaled operands
//!   (`-4@-20(%rbp,%rax,4)`) and symbolic displacements (`8@counter(%rip)`) are refused.

use std::path::Path;

pub use userbpf_elf::usdt::{ArgKind, ArgSpec, MAX_ARGS, Note, parse_arg, parse_args, pt_regs_offset, read_notes};

/// A probe located in this process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Located {
    pub note: Note,
    /// The probe's address.
    pub addr: usize,
    /// Where to hook it: the first of a run of notes at consecutive addresses (each note is
    /// a one-byte `nop`, and compilers often place several probes back to back: hooking each
    /// would overlap the 5-byte patches). The registers at the anchor are the registers at
    /// the probe, except `ip`.
    pub anchor: usize,
    /// Bytes from the anchor that a hook there displaces (whole instructions, at least 5),
    /// read from the file; `None` if they could not be decoded.
    pub span: Option<usize>,
    /// The semaphore's address (0: none).
    pub sema_addr: usize,
    pub object: std::path::PathBuf,
}

fn same_file(obj: &Path, want: &str) -> bool {
    let w = Path::new(want);
    if obj == w || (w.components().count() == 1 && obj.file_name() == w.file_name()) {
        return true;
    }
    match (std::fs::canonicalize(obj), std::fs::canonicalize(w)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// Finds probe `provider:name` in `path` (empty: the executable) as loaded in this process.
/// Returns every site (a probe may be expanded at several places).
pub fn locate(path: &str, provider: &str, name: &str) -> Result<Vec<Located>, String> {
    let objs = crate::symbols::loaded_objects();
    let obj = if path.is_empty() { objs.first() } else { objs.iter().find(|o| same_file(&o.path, path)) };
    let obj = obj.ok_or_else(|| format!("`{path}` is not loaded in this process"))?;
    let notes = read_notes(&obj.path)?;
    let pcs: std::collections::HashSet<u64> = notes.iter().map(|n| n.pc).collect();
    let data = std::fs::read(&obj.path).map_err(|e| format!("{}: {e}", obj.path.display()))?;
    let found: Vec<Located> = notes
        .iter()
        .filter(|n| n.provider == provider && n.name == name)
        .cloned()
        .map(|n| {
            let mut anchor = n.pc;
            while anchor > 0 && pcs.contains(&(anchor - 1)) {
                anchor -= 1;
            }
            (n, anchor)
        })
        .map(|(n, anchor)| Located {
            addr: obj.bias.wrapping_add(n.pc as usize),
            anchor: obj.bias.wrapping_add(anchor as usize),
            span: patch_span(&data, anchor),
            sema_addr: if n.sema == 0 { 0 } else { obj.bias.wrapping_add(n.sema as usize) },
            object: obj.path.clone(),
            note: n,
        })
        .collect();
    if found.is_empty() {
        return Err(format!("no USDT probe `{provider}:{name}` in {}", obj.path.display()));
    }
    Ok(found)
}

/// Bytes of whole instructions, at least 5, from file virtual address `vaddr`.
fn patch_span(elf: &[u8], vaddr: u64) -> Option<usize> {
    use object::{Object, ObjectSection};
    let file = object::File::parse(elf).ok()?;
    let sec = file.sections().find(|s| vaddr >= s.address() && vaddr < s.address() + s.size())?;
    let code = sec.data().ok()?.get((vaddr - sec.address()) as usize..)?;
    let code = &code[..code.len().min(32)];
    let mut dec = iced_x86::Decoder::with_ip(64, code, vaddr, iced_x86::DecoderOptions::NONE);
    let mut len = 0;
    while len < 5 {
        if !dec.can_decode() {
            return None;
        }
        let i = dec.decode();
        if i.is_invalid() {
            return None;
        }
        len += i.len();
    }
    Some(len)
}

/// Where file offset `off` of the file `(dev, ino)` is mapped writable and private, from
/// `maps` (the text of a `/proc/PID/maps`), with the `u16` semaphore inside the mapping: the
/// only mappings where the kernel updates a uprobe's reference counter (`valid_ref_ctr_vma`).
pub fn semaphore_address(maps: &str, dev: u64, ino: u64, off: u64) -> Option<u64> {
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (Some(range), Some(perms), Some(offset), Some(devs), Some(inode)) =
            (f.next(), f.next(), f.next(), f.next(), f.next())
        else {
            continue;
        };
        if inode.parse::<u64>().ok() != Some(ino) || !perms.starts_with("rw") || perms.as_bytes().get(3) != Some(&b'p')
        {
            continue;
        }
        let Some((maj, min)) = devs.split_once(':') else { continue };
        let (Ok(maj), Ok(min)) = (u32::from_str_radix(maj, 16), u32::from_str_radix(min, 16)) else { continue };
        if libc::makedev(maj, min) != dev {
            continue;
        }
        let Some((start, end)) = range.split_once('-') else { continue };
        let (Ok(start), Ok(end), Ok(offset)) =
            (u64::from_str_radix(start, 16), u64::from_str_radix(end, 16), u64::from_str_radix(offset, 16))
        else {
            continue;
        };
        if off >= offset && off + 2 <= offset + (end - start) {
            return Some(start + off - offset);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_offsets_match_pt_regs() {
        let r = crate::PtRegs::default();
        let base = &r as *const _ as usize;
        assert_eq!(pt_regs_offset("rdi").unwrap() as usize, std::ptr::addr_of!(r.di) as usize - base);
        assert_eq!(pt_regs_offset("r8d").unwrap() as usize, std::ptr::addr_of!(r.r8) as usize - base);
        assert_eq!(pt_regs_offset("rsp").unwrap() as usize, std::ptr::addr_of!(r.sp) as usize - base);
        assert_eq!(pt_regs_offset("rip").unwrap() as usize, std::ptr::addr_of!(r.ip) as usize - base);
        assert_eq!(pt_regs_offset("r15").unwrap(), 0);
    }
}
