//! Function symbols of ELF files on disk (`.symtab` and `.dynsym`, read with the `object`
//! crate): their names, virtual addresses and sizes, and whether they are GNU indirect
//! functions (ifuncs, such as libc's `strlen`, whose symbol is the resolver); the bytes after
//! a function that no symbol claims (alignment padding); file offsets as virtual addresses.

use std::path::Path;

use object::{Object, ObjectSection, ObjectSymbol, SymbolKind};

/// A defined function symbol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FunctionSymbol {
    pub name: String,
    /// Virtual address in the file (add the load bias for an address in a process).
    pub value: usize,
    /// Size in bytes (0 when the symbol records none).
    pub size: usize,
    /// `STT_GNU_IFUNC`: the symbol is the resolver, not the implementation.
    pub ifunc: bool,
}

/// `STT_GNU_IFUNC`.
const STT_GNU_IFUNC: u8 = 10;

/// Every defined function symbol of the ELF file at `path`, `.symtab` first, then `.dynsym`
/// (a name may appear in both). Errors name the file.
pub fn function_symbols(path: &Path) -> Result<Vec<FunctionSymbol>, String> {
    read(path, true)
}

/// The exported function symbols (`.dynsym` only) of the ELF file at `path`.
pub fn exported_function_symbols(path: &Path) -> Result<Vec<FunctionSymbol>, String> {
    read(path, false)
}

fn read(path: &Path, with_symtab: bool) -> Result<Vec<FunctionSymbol>, String> {
    let data = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let file = object::File::parse(&*data).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut out = Vec::new();
    let symtab = if with_symtab { Some(file.symbols()) } else { None };
    for sym in symtab.into_iter().flatten().chain(file.dynamic_symbols()) {
        if sym.kind() != SymbolKind::Text || sym.is_undefined() || sym.address() == 0 {
            continue;
        }
        let Ok(name) = sym.name() else { continue };
        let ifunc = matches!(sym.flags(), object::SymbolFlags::Elf { st_info, .. } if st_info & 0xf == STT_GNU_IFUNC);
        out.push(FunctionSymbol {
            name: name.to_string(),
            value: sym.address() as usize,
            size: sym.size() as usize,
            ifunc,
        });
    }
    Ok(out)
}

/// How many bytes after virtual address `vaddr` of the ELF image `data` no symbol claims: the
/// distance to the next symbol (of any kind but sections and files) or to the end of the
/// section holding `vaddr`, whichever comes first. `None` when a symbol covers the bytes
/// just after `vaddr`, when no section holds it, or when `data` is not an ELF file.
pub fn unclaimed_after(data: &[u8], vaddr: u64) -> Option<u64> {
    let file = object::File::parse(data).ok()?;
    let sec_end = file
        .sections()
        .find(|s| s.address() < vaddr && vaddr <= s.address() + s.size())
        .map(|s| s.address() + s.size())?;
    let mut next = sec_end;
    for sym in file.symbols().chain(file.dynamic_symbols()) {
        if sym.is_undefined() || matches!(sym.kind(), SymbolKind::Section | SymbolKind::File) {
            continue;
        }
        let (a, sz) = (sym.address(), sym.size());
        if a < vaddr && a + sz > vaddr {
            return None;
        }
        if a >= vaddr && a < next {
            next = a;
        }
    }
    Some(next - vaddr)
}

/// Whether symbol name `sym` names function `want`: equal, or `want` with a version
/// (`memcpy@GLIBC_2.2.5`, `memcpy@@GLIBC_2.14`).
pub fn name_matches(sym: &str, want: &str) -> bool {
    sym == want || sym.split('@').next() == Some(want)
}

/// Whether the ELF file at `path` has a function symbol `name` (`.symtab` or `.dynsym`).
pub fn has_function(path: &Path, name: &str) -> Result<bool, String> {
    Ok(function_symbols(path)?.iter().any(|s| name_matches(&s.name, name)))
}

/// The virtual address at which file offset `off` of the ELF file at `path` is loaded (the
/// kernel's uprobes name their target by file offset), if a `PT_LOAD` segment maps it.
pub fn offset_to_vaddr(path: &Path, off: u64) -> Option<u64> {
    use object::read::elf::{FileHeader, ProgramHeader};
    let data = std::fs::read(path).ok()?;
    let hdr = object::elf::FileHeader64::<object::Endianness>::parse(&*data).ok()?;
    let endian = hdr.endian().ok()?;
    for ph in hdr.program_headers(endian, &*data).ok()? {
        if ph.p_type(endian) != object::elf::PT_LOAD {
            continue;
        }
        let (fo, fsz, va) = (ph.p_offset(endian), ph.p_filesz(endian), ph.p_vaddr(endian));
        if off >= fo && off < fo + fsz {
            return Some(va + (off - fo));
        }
    }
    None
}

/// The function containing file offset `off` of the ELF file at `path`: its name and the
/// offset's distance from its start. The offset becomes an address through the segment
/// holding it; `.symtab` is searched first, then `.dynsym`, a sized symbol covering the
/// address preferred to an unsized one starting at it. `None` when no function covers it.
pub fn function_at_file_offset(path: &Path, off: u64) -> Result<Option<(String, u64)>, String> {
    use object::ObjectSegment;
    let data = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let file = object::File::parse(&*data).map_err(|e| format!("{}: {e}", path.display()))?;
    let Some(va) = file.segments().find_map(|seg| {
        let (start, size) = seg.file_range();
        (off >= start && off - start < size).then(|| off - start + seg.address())
    }) else {
        return Ok(None);
    };
    for table in [file.symbols(), file.dynamic_symbols()] {
        let mut best: Option<(String, u64, u64)> = None;
        for sym in table {
            if sym.kind() != SymbolKind::Text || sym.is_undefined() || sym.address() == 0 {
                continue;
            }
            let (value, size) = (sym.address(), sym.size());
            let inside = if size > 0 { va >= value && va - value < size } else { va == value };
            if !inside || best.as_ref().is_some_and(|b| b.2 > 0 || size == 0) {
                continue;
            }
            let Ok(name) = sym.name() else { continue };
            let name = name.split('@').next().unwrap_or_default();
            if !name.is_empty() {
                best = Some((name.to_string(), va - value, size));
            }
        }
        if let Some((name, delta, _)) = best {
            return Ok(Some((name, delta)));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versioned_names_match_their_function() {
        assert!(name_matches("memcpy@@GLIBC_2.14", "memcpy"));
        assert!(name_matches("memcpy", "memcpy"));
        assert!(!name_matches("memcpy_chk", "memcpy"));
    }

    #[test]
    fn this_test_binary_has_its_functions_and_refuses_garbage() {
        let exe = std::env::current_exe().unwrap();
        assert!(has_function(&exe, "main").unwrap());
        assert!(!has_function(&exe, "no_such_function_in_this_binary").unwrap());
        let err = has_function(Path::new("/proc/self/status"), "main").unwrap_err();
        assert!(err.starts_with("/proc/self/status: "), "{err}");
    }
}
