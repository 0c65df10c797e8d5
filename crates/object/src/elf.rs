//! A minimal, bounds-checked reader for the little-endian ELF64 relocatable files clang emits
//! for BPF: section headers, the symbol table and `SHT_REL` relocations. Every read is checked;
//! errors are plain strings the caller wraps with the file name.

pub const EM_BPF: u16 = 247;
pub const ET_REL: u16 = 1;

pub const SHT_NULL: u32 = 0;
pub const SHT_PROGBITS: u32 = 1;
pub const SHT_SYMTAB: u32 = 2;
pub const SHT_STRTAB: u32 = 3;
pub const SHT_NOBITS: u32 = 8;
pub const SHT_REL: u32 = 9;
pub const SHT_LLVM_ADDRSIG: u32 = 0x6fff_4c03;

pub const SHF_WRITE: u64 = 0x1;
pub const SHF_ALLOC: u64 = 0x2;
pub const SHF_EXECINSTR: u64 = 0x4;

pub const SHN_UNDEF: u16 = 0;
pub const SHN_LORESERVE: u16 = 0xff00;
pub const SHN_ABS: u16 = 0xfff1;
pub const SHN_COMMON: u16 = 0xfff2;
pub const SHN_XINDEX: u16 = 0xffff;

pub const STB_LOCAL: u8 = 0;
pub const STB_GLOBAL: u8 = 1;
pub const STB_WEAK: u8 = 2;

pub const STT_NOTYPE: u8 = 0;
pub const STT_OBJECT: u8 = 1;
pub const STT_FUNC: u8 = 2;
pub const STT_SECTION: u8 = 3;
pub const STT_FILE: u8 = 4;

pub const STV_DEFAULT: u8 = 0;
pub const STV_INTERNAL: u8 = 1;
pub const STV_HIDDEN: u8 = 2;

// BPF relocation types.
pub const R_BPF_NONE: u32 = 0;
pub const R_BPF_64_64: u32 = 1;
pub const R_BPF_64_ABS64: u32 = 2;
pub const R_BPF_64_ABS32: u32 = 3;
pub const R_BPF_64_NODYLD32: u32 = 4;
pub const R_BPF_64_32: u32 = 10;

/// A section header with its name resolved.
#[derive(Debug, Clone)]
pub struct Section<'a> {
    pub index: usize,
    pub name: String,
    pub sh_type: u32,
    pub flags: u64,
    pub size: u64,
    pub link: u32,
    pub info: u32,
    pub entsize: u64,
    /// File contents (empty for `SHT_NOBITS`).
    pub data: &'a [u8],
}

impl Section<'_> {
    pub fn is_exec(&self) -> bool {
        self.sh_type == SHT_PROGBITS && self.flags & SHF_EXECINSTR != 0
    }
}

/// A symbol table entry with its name resolved.
#[derive(Debug, Clone)]
pub struct Symbol {
    pub index: usize,
    pub name: String,
    pub value: u64,
    pub size: u64,
    pub bind: u8,
    pub typ: u8,
    pub visibility: u8,
    pub shndx: u16,
}

/// A `SHT_REL` entry.
#[derive(Debug, Clone, Copy)]
pub struct Rel {
    pub offset: u64,
    pub sym: u32,
    pub typ: u32,
}

/// A parsed ELF file.
#[derive(Debug)]
pub struct Elf<'a> {
    pub machine: u16,
    pub sections: Vec<Section<'a>>,
    pub symbols: Vec<Symbol>,
}

fn u16_at(d: &[u8], off: usize) -> Option<u16> {
    let b = d.get(off..off.checked_add(2)?)?;
    Some(u16::from_le_bytes([b[0], b[1]]))
}
fn u32_at(d: &[u8], off: usize) -> Option<u32> {
    let b = d.get(off..off.checked_add(4)?)?;
    Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}
fn u64_at(d: &[u8], off: usize) -> Option<u64> {
    let b = d.get(off..off.checked_add(8)?)?;
    let mut a = [0u8; 8];
    a.copy_from_slice(b);
    Some(u64::from_le_bytes(a))
}

/// NUL-terminated string at `off` in a string table.
fn cstr(table: &[u8], off: usize) -> Option<String> {
    let rest = table.get(off..)?;
    let end = rest.iter().position(|&b| b == 0)?;
    Some(String::from_utf8_lossy(&rest[..end]).into_owned())
}

/// Why an ELF file was refused before its contents were looked at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderError {
    NotElf,
    Not64,
    BigEndian,
    NotRelocatable(u16),
    WrongMachine(u16),
    Other(String),
}

impl<'a> Elf<'a> {
    pub fn parse(data: &'a [u8]) -> Result<Elf<'a>, HeaderError> {
        let other = |m: &str| HeaderError::Other(m.to_string());
        if data.len() < 4 || &data[..4] != b"\x7fELF" {
            return Err(HeaderError::NotElf);
        }
        if data.len() < 64 {
            return Err(other("truncated ELF header"));
        }
        if data[4] != 2 {
            return Err(HeaderError::Not64);
        }
        match data[5] {
            1 => {}
            2 => return Err(HeaderError::BigEndian),
            e => return Err(HeaderError::Other(format!("unknown ELF data encoding {e}"))),
        }
        let e_type = u16_at(data, 16).ok_or_else(|| other("truncated ELF header"))?;
        let machine = u16_at(data, 18).ok_or_else(|| other("truncated ELF header"))?;
        if machine != EM_BPF {
            return Err(HeaderError::WrongMachine(machine));
        }
        if e_type != ET_REL {
            return Err(HeaderError::NotRelocatable(e_type));
        }
        let shoff = u64_at(data, 40).ok_or_else(|| other("truncated ELF header"))?;
        let shentsize = u16_at(data, 58).ok_or_else(|| other("truncated ELF header"))? as usize;
        let mut shnum = u16_at(data, 60).ok_or_else(|| other("truncated ELF header"))? as usize;
        let mut shstrndx = u16_at(data, 62).ok_or_else(|| other("truncated ELF header"))? as usize;
        if shoff == 0 {
            return Err(other("no section headers"));
        }
        if shentsize != 64 {
            return Err(HeaderError::Other(format!("section header size {shentsize}, expected 64")));
        }
        let shoff = usize::try_from(shoff).map_err(|_| other("section header offset out of range"))?;
        let raw_hdr = |i: usize| -> Result<&'a [u8], HeaderError> {
            let start = i
                .checked_mul(64)
                .and_then(|o| o.checked_add(shoff))
                .ok_or_else(|| other("section header offset overflows"))?;
            start
                .checked_add(64)
                .and_then(|end| data.get(start..end))
                .ok_or_else(|| HeaderError::Other(format!("section header {i} lies beyond the end of the file")))
        };
        // Extended numbering: counts too large for the header live in section 0.
        if shnum == 0 {
            let h0 = raw_hdr(0)?;
            shnum = u64_at(h0, 32).unwrap_or(0) as usize;
        }
        if shstrndx == SHN_XINDEX as usize {
            let h0 = raw_hdr(0)?;
            shstrndx = u32_at(h0, 40).unwrap_or(0) as usize;
        }
        if shnum == 0 || shnum > data.len() / 64 {
            return Err(HeaderError::Other(format!("implausible section count {shnum}")));
        }
        struct RawSh {
            name: u32,
            sh_type: u32,
            flags: u64,
            offset: u64,
            size: u64,
            link: u32,
            info: u32,
            entsize: u64,
        }
        let mut raws = Vec::with_capacity(shnum);
        for i in 0..shnum {
            let h = raw_hdr(i)?;
            let g32 = |o| u32_at(h, o).unwrap_or(0);
            let g64 = |o| u64_at(h, o).unwrap_or(0);
            raws.push(RawSh {
                name: g32(0),
                sh_type: g32(4),
                flags: g64(8),
                offset: g64(24),
                size: g64(32),
                link: g32(40),
                info: g32(44),
                entsize: g64(56),
            });
        }
        let sec_data = |i: usize, r: &RawSh| -> Result<&'a [u8], HeaderError> {
            if r.sh_type == SHT_NOBITS || r.sh_type == SHT_NULL {
                return Ok(&[]);
            }
            let start = usize::try_from(r.offset).ok();
            let len = usize::try_from(r.size).ok();
            start
                .zip(len)
                .and_then(|(s, l)| data.get(s..s.checked_add(l)?))
                .ok_or_else(|| HeaderError::Other(format!("section {i} data lies beyond the end of the file")))
        };
        let shstr = match raws.get(shstrndx) {
            Some(r) if r.sh_type == SHT_STRTAB => sec_data(shstrndx, r)?,
            _ => return Err(HeaderError::Other(format!("bad section name table index {shstrndx}"))),
        };
        let mut sections = Vec::with_capacity(shnum);
        for (i, r) in raws.iter().enumerate() {
            let name = if i == 0 {
                String::new()
            } else {
                cstr(shstr, r.name as usize)
                    .ok_or_else(|| HeaderError::Other(format!("section {i} has a bad name offset {}", r.name)))?
            };
            sections.push(Section {
                index: i,
                name,
                sh_type: r.sh_type,
                flags: r.flags,
                size: r.size,
                link: r.link,
                info: r.info,
                entsize: r.entsize,
                data: sec_data(i, r)?,
            });
        }
        let mut symtabs = sections.iter().filter(|s| s.sh_type == SHT_SYMTAB);
        let symtab = symtabs.next().ok_or_else(|| other("no symbol table (stripped object?)"))?;
        if symtabs.next().is_some() {
            return Err(other("more than one symbol table"));
        }
        if symtab.entsize != 24 || symtab.data.len() % 24 != 0 {
            return Err(HeaderError::Other(format!(
                "section {}: symbol table entry size {} / size {} is not a multiple of 24",
                symtab.name,
                symtab.entsize,
                symtab.data.len()
            )));
        }
        let strtab = match sections.get(symtab.link as usize) {
            Some(s) if s.sh_type == SHT_STRTAB => s.data,
            _ => return Err(HeaderError::Other(format!("symbol table links to bad string table {}", symtab.link))),
        };
        let mut symbols = Vec::with_capacity(symtab.data.len() / 24);
        for (i, e) in symtab.data.chunks_exact(24).enumerate() {
            let name_off = u32_at(e, 0).unwrap_or(0) as usize;
            let info = e[4];
            let other_b = e[5];
            let shndx = u16_at(e, 6).unwrap_or(0);
            let name = cstr(strtab, name_off)
                .ok_or_else(|| HeaderError::Other(format!("symbol {i} has a bad name offset {name_off}")))?;
            symbols.push(Symbol {
                index: i,
                name,
                value: u64_at(e, 8).unwrap_or(0),
                size: u64_at(e, 16).unwrap_or(0),
                bind: info >> 4,
                typ: info & 0xf,
                visibility: other_b & 0x3,
                shndx,
            });
        }
        Ok(Elf { machine, sections, symbols })
    }

    /// Relocation entries of a `SHT_REL` section.
    pub fn rels(sec: &Section<'_>) -> Result<Vec<Rel>, String> {
        if sec.entsize != 16 || !sec.data.len().is_multiple_of(16) {
            return Err(format!(
                "relocation entry size {} / section size {} is not a multiple of 16",
                sec.entsize,
                sec.data.len()
            ));
        }
        Ok(sec
            .data
            .chunks_exact(16)
            .map(|e| {
                let info = u64_at(e, 8).unwrap_or(0);
                Rel { offset: u64_at(e, 0).unwrap_or(0), sym: (info >> 32) as u32, typ: info as u32 }
            })
            .collect())
    }

    pub fn section(&self, idx: usize) -> Option<&Section<'a>> {
        self.sections.get(idx)
    }

    pub fn section_by_name(&self, name: &str) -> Option<&Section<'a>> {
        self.sections.iter().find(|s| s.name == name)
    }

    /// The name to show for a symbol: its own, or its section's for section symbols.
    pub fn symbol_display_name(&self, sym: &Symbol) -> String {
        if sym.typ == STT_SECTION && sym.name.is_empty() {
            self.section(sym.shndx as usize).map(|s| s.name.clone()).unwrap_or_default()
        } else {
            sym.name.clone()
        }
    }
}

/// The name of an ELF machine number, for error messages.
pub fn machine_name(m: u16) -> &'static str {
    match m {
        0 => "none",
        3 => "x86",
        8 => "MIPS",
        20 => "PowerPC",
        21 => "PowerPC64",
        22 => "S/390",
        40 => "ARM",
        62 => "x86-64",
        183 => "AArch64",
        243 => "RISC-V",
        247 => "BPF",
        258 => "LoongArch",
        _ => "unknown",
    }
}
