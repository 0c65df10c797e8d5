//! The object loading pipeline: ELF sections -> BTF -> externs -> maps -> CO-RE -> relocations
//! -> linked programs.

use crate::btf::ext::{BtfExt, FuncInfo, LineInfo};
use crate::btf::{BTF_VAR_GLOBAL_EXTERN, BTF_VAR_STATIC, Btf, Kind, TypeKind};
use crate::core_relo::{CoreResolver, format_spec, parse_spec, patch_insn};
use crate::elf::{self, Elf, HeaderError, Section, Symbol};
use crate::error::CoreFailure;
use crate::externs::{self, ExternKind, Externs};
use crate::link::{Function, Linker, Reloc};
use crate::maps::{self, InitSlot, MapDef, MapKind};
use crate::section;
use crate::{ErrorKind, Object, ParseOptions, ProgramSpec, object_name};
use std::collections::HashMap;
use userbpf_isa::{BPF_PSEUDO_CALL, Insn, OP_CALL};

fn header_error(e: HeaderError) -> ErrorKind {
    match e {
        HeaderError::NotElf => ErrorKind::NotElf,
        HeaderError::Not64 => ErrorKind::Not64Bit,
        HeaderError::BigEndian => ErrorKind::BigEndian,
        HeaderError::NotRelocatable(t) => ErrorKind::NotRelocatable(t),
        HeaderError::WrongMachine(m) => ErrorKind::WrongMachine { machine: m, name: elf::machine_name(m) },
        HeaderError::Other(m) => ErrorKind::BadElf(m),
    }
}

fn sec_err(section: &str, msg: impl Into<String>) -> ErrorKind {
    ErrorKind::Section { section: section.to_string(), msg: msg.into() }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DataKind {
    Data,
    Rodata,
    Bss,
}

fn data_kind(sec: &Section<'_>) -> Option<DataKind> {
    let n = sec.name.as_str();
    let is = |base: &str| n == base || n.strip_prefix(base).is_some_and(|r| r.starts_with('.'));
    if sec.sh_type == elf::SHT_PROGBITS && sec.flags & elf::SHF_EXECINSTR == 0 {
        if is(".data") {
            return Some(DataKind::Data);
        }
        if is(".rodata") {
            return Some(DataKind::Rodata);
        }
    }
    if sec.sh_type == elf::SHT_NOBITS && is(".bss") {
        return Some(DataKind::Bss);
    }
    None
}

fn ignored(sec: &Section<'_>) -> bool {
    let n = sec.name.as_str();
    sec.sh_type == elf::SHT_NULL
        || sec.sh_type == elf::SHT_STRTAB
        || sec.sh_type == elf::SHT_LLVM_ADDRSIG
        || n.starts_with(".debug_")
        || n.starts_with(".rel.debug_")
        || n == ".rel.BTF"
        || n == ".rel.BTF.ext"
}

/// Fills DATASEC sizes and variable offsets from the ELF file, as libbpf's
/// `btf_fixup_datasec` does (clang leaves them zero), and sorts variables by offset.
fn fixup_datasecs(btf: &mut Btf, elf: &Elf<'_>) -> Result<(), ErrorKind> {
    let ids: Vec<u32> = btf.types().filter(|(_, t)| t.kind() == Kind::Datasec).map(|(id, _)| id).collect();
    for id in ids {
        let name = btf.name(id).to_string();
        if name == ".kconfig" || name == ".ksyms" {
            continue;
        }
        let bad = |msg: String| ErrorKind::Btf {
            section: ".BTF".into(),
            source: crate::btf::BtfError::BadType { id, msg: format!("DATASEC `{name}`: {msg}") },
        };
        let Some(TypeKind::Datasec(d)) = btf.type_by_id(id).map(|t| t.kind.clone()) else { continue };
        let mut d = d;
        let fix_offsets = d.size == 0;
        if fix_offsets {
            let sec = elf.section_by_name(&name).ok_or_else(|| bad("no ELF section of that name".into()))?;
            d.size = u32::try_from(sec.size).map_err(|_| bad("section too large".into()))?;
        }
        for v in d.vars.iter_mut() {
            let vt = btf.get(v.type_id).map_err(|e| bad(e.to_string()))?;
            let TypeKind::Var { linkage, .. } = vt.kind else {
                return Err(bad(format!("member [{}] is not a VAR", v.type_id)));
            };
            if linkage == BTF_VAR_STATIC || linkage == BTF_VAR_GLOBAL_EXTERN {
                continue;
            }
            let vname = btf.name_of(vt.name_off);
            let sym = elf
                .symbols
                .iter()
                .find(|s| {
                    s.typ == elf::STT_OBJECT
                        && (s.bind == elf::STB_GLOBAL || s.bind == elf::STB_WEAK)
                        && s.name == vname
                })
                .ok_or_else(|| bad(format!("no ELF symbol for variable `{vname}`")))?;
            if fix_offsets {
                v.offset = u32::try_from(sym.value).map_err(|_| bad(format!("variable `{vname}` offset too large")))?;
            }
        }
        d.vars.sort_by_key(|v| v.offset);
        if let Some(t) = btf.type_mut(id) {
            t.kind = TypeKind::Datasec(d);
        }
    }
    Ok(())
}

pub(crate) fn load(bytes: &[u8], file: &str, opts: &ParseOptions<'_>) -> Result<Object, ErrorKind> {
    let elf = Elf::parse(bytes).map_err(header_error)?;
    let obj_name = object_name(file);

    let mut license = String::new();
    let mut kern_version = None;
    let mut btf_sec: Option<&Section<'_>> = None;
    let mut ext_sec: Option<&Section<'_>> = None;
    let mut maps_sec: Option<usize> = None;
    let mut legacy_sec: Option<usize> = None;
    let mut data_secs: Vec<(usize, DataKind)> = Vec::new();
    let mut exec_secs: Vec<usize> = Vec::new();
    let mut rel_secs: Vec<usize> = Vec::new();
    for sec in &elf.sections {
        if sec.index == 0 || ignored(sec) {
            continue;
        }
        match sec.name.as_str() {
            "license" => {
                let end = sec.data.iter().position(|&b| b == 0).unwrap_or(sec.data.len());
                license = String::from_utf8_lossy(&sec.data[..end]).into_owned();
            }
            "version" => {
                let v: [u8; 4] =
                    sec.data.try_into().map_err(|_| sec_err("version", format!("size {} is not 4", sec.data.len())))?;
                kern_version = Some(u32::from_le_bytes(v));
            }
            ".struct_ops" | ".struct_ops.link" if sec.size > 0 => {
                // libbpf makes a BPF_MAP_TYPE_STRUCT_OPS map of each variable and registers
                // it with a kernel subsystem, which then calls its programs.
                let var = elf
                    .symbols
                    .iter()
                    .find(|s| s.shndx as usize == sec.index && s.typ == elf::STT_OBJECT)
                    .map_or_else(|| "?".to_string(), |s| s.name.clone());
                return Err(ErrorKind::Map {
                    section: sec.name.clone(),
                    map: var,
                    msg: "struct_ops maps hand programs to a kernel subsystem (TCP congestion control, sched_ext, ...) to call; only the kernel can run them, not a user-space runtime".into(),
                });
            }
            "maps" => legacy_sec = Some(sec.index),
            ".maps" => maps_sec = Some(sec.index),
            ".BTF" => btf_sec = Some(sec),
            ".BTF.ext" => ext_sec = Some(sec),
            _ if sec.sh_type == elf::SHT_SYMTAB => {}
            _ if sec.sh_type == elf::SHT_REL => rel_secs.push(sec.index),
            _ if sec.is_exec() => {
                if !sec.data.is_empty() {
                    if sec.data.len() % 8 != 0 {
                        return Err(sec_err(&sec.name, format!("code size {} is not a multiple of 8", sec.data.len())));
                    }
                    exec_secs.push(sec.index);
                }
            }
            _ => {
                if let Some(k) = data_kind(sec) {
                    data_secs.push((sec.index, k));
                }
            }
        }
    }

    // BTF and BTF.ext.
    let mut btf = match btf_sec {
        Some(s) => Some(Btf::parse(s.data).map_err(|e| ErrorKind::Btf { section: ".BTF".into(), source: e })?),
        None => None,
    };
    let btf_ext = match (ext_sec, &btf) {
        (Some(s), Some(_)) => {
            Some(BtfExt::parse(s.data).map_err(|e| ErrorKind::Btf { section: ".BTF.ext".into(), source: e })?)
        }
        _ => None,
    };
    if let Some(b) = btf.as_mut() {
        fixup_datasecs(b, &elf)?;
    }
    let externs = externs::collect(&elf.symbols, btf.as_mut(), opts)?;
    let btf = btf;

    // Functions.
    let text_idx = elf.section_by_name(".text").map(|s| s.index);
    let mut funcs: Vec<Function> = Vec::new();
    let mut entries: Vec<usize> = Vec::new();
    let mut sec_insns: HashMap<usize, Vec<Insn>> = HashMap::new();
    for &si in &exec_secs {
        let sec = &elf.sections[si];
        let insns = userbpf_isa::decode(sec.data).map_err(|e| sec_err(&sec.name, e.to_string()))?;
        let n = insns.len();
        sec_insns.insert(si, insns);
        let mut syms: Vec<&Symbol> =
            elf.symbols.iter().filter(|s| s.shndx as usize == si && s.typ == elf::STT_FUNC).collect();
        syms.sort_by_key(|s| s.value);
        for s in syms {
            let perr = |msg: String| ErrorKind::Program { section: sec.name.clone(), program: s.name.clone(), msg };
            if s.value % 8 != 0 || s.size % 8 != 0 || s.size == 0 {
                return Err(perr(format!("corrupted function: offset {}, size {}", s.value, s.size)));
            }
            let start = (s.value / 8) as usize;
            let len = (s.size / 8) as usize;
            if start.checked_add(len).is_none_or(|e| e > n) {
                return Err(perr(format!("function at offset {} ({} bytes) crosses the section end", s.value, s.size)));
            }
            if Some(si) != text_idx && s.bind == elf::STB_LOCAL {
                return Err(perr("program is static; programs outside .text must be global".into()));
            }
            if funcs.iter().any(|f| f.sec == si && f.start < start + len && start < f.start + f.len) {
                return Err(perr("function overlaps another function".into()));
            }
            if Some(si) != text_idx {
                entries.push(funcs.len());
            }
            funcs.push(Function { name: s.name.clone(), sec: si, sec_name: sec.name.clone(), start, len });
        }
    }
    // libbpf: a lone .text function is a program in its own right (SEC("") behaviour).
    if funcs.len() == 1 && entries.is_empty() {
        entries.push(0);
    }
    let func_at: HashMap<(usize, usize), usize> =
        funcs.iter().enumerate().map(|(i, f)| ((f.sec, f.start), i)).collect();
    let func_containing =
        |sec: usize, insn: usize| funcs.iter().position(|f| f.sec == sec && insn >= f.start && insn < f.start + f.len);

    // Maps.
    let mut maps_out: Vec<MapDef> = Vec::new();
    let mut map_by_sym: HashMap<(usize, u64), usize> = HashMap::new();
    let mut map_by_data_sec: HashMap<usize, usize> = HashMap::new();
    if let Some(li) = legacy_sec {
        parse_legacy_maps(&elf, li, btf.as_ref(), &mut maps_out, &mut map_by_sym)?;
    }
    let mut btf_placements = Vec::new();
    if let Some(mi) = maps_sec {
        let sec = &elf.sections[mi];
        let Some(b) = btf.as_ref() else {
            return Err(ErrorKind::MissingBtf { section: ".maps".into(), what: "BTF-defined maps".into() });
        };
        let placements = maps::parse_btf_maps(b, sec.size).map_err(|(map, msg)| ErrorKind::Map {
            section: ".maps".into(),
            map,
            msg,
        })?;
        for p in placements {
            map_by_sym.insert((mi, p.offset), maps_out.len());
            btf_placements.push((maps_out.len(), p.offset, p.size, p.values_offset));
            maps_out.push(p.def);
        }
    }
    for &(si, kind) in &data_secs {
        let sec = &elf.sections[si];
        if sec.size == 0 {
            continue;
        }
        let size = u32::try_from(sec.size).map_err(|_| sec_err(&sec.name, "section too large"))?;
        let readonly = kind == DataKind::Rodata;
        let ds = btf.as_ref().and_then(|b| b.find_by_name_kind(&sec.name, Kind::Datasec));
        let mut flags = if readonly { maps::BPF_F_RDONLY_PROG } else { 0 };
        if let (Some(b), Some(id)) = (btf.as_ref(), ds)
            && maps::datasec_has_global_var(b, id)
        {
            flags |= maps::BPF_F_MMAPABLE;
        }
        if size > opts.limits.max_value_size {
            return Err(ErrorKind::Map {
                section: sec.name.clone(),
                map: maps::internal_map_name(&obj_name, &sec.name),
                msg: format!("value size {size} exceeds the limit of {} bytes", opts.limits.max_value_size),
            });
        }
        let initial = match kind {
            DataKind::Bss => vec![0u8; size as usize],
            _ => sec.data.to_vec(),
        };
        map_by_data_sec.insert(si, maps_out.len());
        maps_out.push(MapDef {
            name: maps::internal_map_name(&obj_name, &sec.name),
            map_type: maps::BPF_MAP_TYPE_ARRAY,
            key_size: 4,
            value_size: size,
            max_entries: 1,
            map_flags: flags,
            map_extra: 0,
            pinning: 0,
            numa_node: 0,
            inner: None,
            key_type_id: None,
            value_type_id: ds,
            kind: MapKind::Data { section: sec.name.clone(), readonly },
            initial: Some(initial),
            init_slots: Vec::new(),
        });
    }
    let kconfig_map = kconfig_map_def(&externs, &obj_name).map(|def| {
        maps_out.push(def);
        maps_out.len() - 1
    });
    for m in &maps_out {
        let section = match &m.kind {
            MapKind::Btf => ".maps".to_string(),
            MapKind::Legacy => "maps".to_string(),
            MapKind::Data { section, .. } => section.clone(),
        };
        maps::check_def(m, &opts.limits).map_err(|msg| ErrorKind::Map { section, map: m.name.clone(), msg })?;
    }

    // CO-RE relocations, applied to section code before programs are assembled.
    if let (Some(b), Some(ext)) = (btf.as_ref(), btf_ext.as_ref()) {
        apply_core(b, ext, &elf, &mut sec_insns, &func_containing, opts)?;
    }

    // Instruction relocations.
    let mut relocs: HashMap<(usize, usize), Reloc> = HashMap::new();
    let mut maps_rel: Option<usize> = None;
    for &ri in &rel_secs {
        let rs = &elf.sections[ri];
        let target = rs.info as usize;
        let Some(ts) = elf.section(target) else {
            return Err(sec_err(&rs.name, format!("applies to missing section {target}")));
        };
        if ts.name == ".maps" {
            maps_rel = Some(ri);
            continue;
        }
        if !exec_secs.contains(&target) {
            continue;
        }
        let rels = Elf::rels(rs).map_err(|m| sec_err(&rs.name, m))?;
        let ninsn = sec_insns.get(&target).map_or(0, |v| v.len());
        for r in rels {
            if r.typ == elf::R_BPF_NONE {
                continue;
            }
            if r.offset % 8 != 0 || r.offset / 8 >= ninsn as u64 {
                return Err(sec_err(
                    &ts.name,
                    format!("relocation offset {:#x} is not an instruction of the section", r.offset),
                ));
            }
            let idx = (r.offset / 8) as usize;
            // Relocations outside any function belong to code dropped by the linker.
            if func_containing(target, idx).is_none() {
                continue;
            }
            let insn = sec_insns[&target][idx];
            let reloc = classify_reloc(&elf, ts, idx, insn, r, &externs, &map_by_sym, &map_by_data_sec, kconfig_map)?;
            relocs.insert((target, idx), reloc);
        }
    }

    // func_info / line_info per section, as instruction indices.
    let mut ext_info: HashMap<usize, (Vec<FuncInfo>, Vec<LineInfo>)> = HashMap::new();
    if let (Some(b), Some(ext)) = (btf.as_ref(), btf_ext.as_ref()) {
        for s in &ext.func_info {
            if let Some(sec) = elf.section_by_name(b.name_of(s.sec_name_off)) {
                let e = ext_info.entry(sec.index).or_default();
                e.0.extend(s.records.iter().map(|r| FuncInfo { insn_off: r.insn_off / 8, ..*r }));
            }
        }
        for s in &ext.line_info {
            if let Some(sec) = elf.section_by_name(b.name_of(s.sec_name_off)) {
                let e = ext_info.entry(sec.index).or_default();
                e.1.extend(s.records.iter().map(|r| LineInfo { insn_off: r.insn_off / 8, ..*r }));
            }
        }
    }

    // Programs.
    let linker =
        Linker { funcs: &funcs, func_at: &func_at, sec_insns: &sec_insns, relocs: &relocs, ext_info: &ext_info };
    let mut programs = Vec::with_capacity(entries.len());
    for &ei in &entries {
        let f = &funcs[ei];
        let (autoload, sec_name) = match f.sec_name.strip_prefix('?') {
            Some(rest) => (false, rest.to_string()),
            None => (true, f.sec_name.clone()),
        };
        let class = section::classify(&sec_name).map_err(|msg| ErrorKind::Program {
            section: f.sec_name.clone(),
            program: f.name.clone(),
            msg: format!("invalid section name: {msg}"),
        })?;
        let linked = linker.link(ei)?;
        programs.push(ProgramSpec {
            name: f.name.clone(),
            section: sec_name,
            kind: class.kind,
            sleepable: class.sleepable,
            autoload,
            insns: linked.insns,
            functions: linked.functions,
            func_info: linked.func_info,
            line_info: linked.line_info,
        });
    }

    // `.values = { ... }` initial slots of prog arrays and maps of maps.
    if let Some(ri) = maps_rel {
        fill_init_slots(&elf, ri, &btf_placements, &mut maps_out, &programs, &funcs, &entries)?;
    }

    Ok(Object { name: obj_name, file: file.to_string(), license, kern_version, programs, maps: maps_out, btf })
}

fn kconfig_map_def(externs: &Externs, obj_name: &str) -> Option<MapDef> {
    let data = externs.kconfig_data.as_ref()?;
    Some(MapDef {
        name: maps::internal_map_name(obj_name, ".kconfig"),
        map_type: maps::BPF_MAP_TYPE_ARRAY,
        key_size: 4,
        value_size: data.len() as u32,
        max_entries: 1,
        map_flags: maps::BPF_F_RDONLY_PROG | maps::BPF_F_MMAPABLE,
        map_extra: 0,
        pinning: 0,
        numa_node: 0,
        inner: None,
        key_type_id: None,
        value_type_id: externs.kconfig_datasec,
        kind: MapKind::Data { section: ".kconfig".into(), readonly: true },
        initial: Some(data.clone()),
        init_slots: Vec::new(),
    })
}

fn parse_legacy_maps(
    elf: &Elf<'_>,
    si: usize,
    btf: Option<&Btf>,
    out: &mut Vec<MapDef>,
    by_sym: &mut HashMap<(usize, u64), usize>,
) -> Result<(), ErrorKind> {
    let sec = &elf.sections[si];
    let mut syms: Vec<&Symbol> =
        elf.symbols.iter().filter(|s| s.shndx as usize == si && s.typ != elf::STT_SECTION).collect();
    syms.sort_by_key(|s| s.value);
    let size = sec.data.len();
    if syms.is_empty() || size == 0 || !size.is_multiple_of(syms.len()) {
        return Err(sec_err(
            "maps",
            format!("unable to determine legacy map definition size ({size} bytes, {} maps)", syms.len()),
        ));
    }
    let def_sz = size / syms.len();
    const DEF_SIZE: usize = 20; // struct bpf_map_def: five u32
    for s in syms {
        let merr = |msg: String| ErrorKind::Map { section: "maps".into(), map: s.name.clone(), msg };
        if s.bind == elf::STB_LOCAL {
            return Err(merr("static maps are not supported".into()));
        }
        let start = usize::try_from(s.value).ok().filter(|&v| v.checked_add(def_sz).is_some_and(|e| e <= size));
        let Some(start) = start else { return Err(merr("definition lies beyond the section end".into())) };
        let raw = &sec.data[start..start + def_sz];
        if def_sz > DEF_SIZE && raw[DEF_SIZE..].iter().any(|&b| b != 0) {
            return Err(merr("definition has unrecognized, non-zero fields".into()));
        }
        let mut f = [0u32; 5];
        for (i, v) in f.iter_mut().enumerate() {
            *v = raw.get(i * 4..i * 4 + 4).map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        }
        let (key_type_id, value_type_id) = btf.map(|b| maps::legacy_kv_types(b, &s.name)).unwrap_or((None, None));
        let mut max_entries = f[3];
        if matches!(f[0], maps::BPF_MAP_TYPE_RINGBUF | maps::BPF_MAP_TYPE_USER_RINGBUF) {
            max_entries = maps::adjust_ringbuf_size(max_entries);
        }
        by_sym.insert((si, s.value), out.len());
        out.push(MapDef {
            name: s.name.clone(),
            map_type: f[0],
            key_size: f[1],
            value_size: f[2],
            max_entries,
            map_flags: f[4],
            map_extra: 0,
            pinning: 0,
            numa_node: 0,
            inner: None,
            key_type_id,
            value_type_id,
            kind: MapKind::Legacy,
            initial: None,
            init_slots: Vec::new(),
        });
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn classify_reloc(
    elf: &Elf<'_>,
    sec: &Section<'_>,
    idx: usize,
    insn: Insn,
    r: elf::Rel,
    externs: &Externs,
    map_by_sym: &HashMap<(usize, u64), usize>,
    map_by_data_sec: &HashMap<usize, usize>,
    kconfig_map: Option<usize>,
) -> Result<Reloc, ErrorKind> {
    let Some(sym) = elf.symbols.get(r.sym as usize) else {
        return Err(ErrorKind::Relocation {
            section: sec.name.clone(),
            insn: idx,
            symbol: format!("#{}", r.sym),
            msg: "which does not exist".into(),
        });
    };
    let sym_name = elf.symbol_display_name(sym);
    let rerr =
        |msg: String| ErrorKind::Relocation { section: sec.name.clone(), insn: idx, symbol: sym_name.clone(), msg };
    let is_call = insn.op == OP_CALL;
    if !is_call && !insn.is_lddw() {
        return Err(rerr(format!("but the instruction (opcode {:#04x}) is neither a call nor a 64-bit load", insn.op)));
    }
    if r.typ != elf::R_BPF_64_64 && r.typ != elf::R_BPF_64_32 {
        return Err(rerr(format!("with unsupported relocation type {}", r.typ)));
    }
    if sym.shndx == elf::SHN_UNDEF {
        if externs::is_extern_symbol(sym)
            && let Some(ext) = externs.by_name.get(&sym.name)
        {
            return match (&ext.kind, is_call) {
                (ExternKind::Kcfg { offset }, false) => match kconfig_map {
                    Some(map) => Ok(Reloc::Kconfig { map, off: *offset }),
                    None => Err(rerr("a kconfig extern, but there is no .kconfig map".into())),
                },
                (ExternKind::Kcfg { .. }, true) => Err(rerr("a kconfig extern, which cannot be called".into())),
                (ExternKind::WeakKsym, true) => Ok(Reloc::WeakKfuncCall),
                (ExternKind::WeakKsym, false) => Ok(Reloc::WeakKsym),
            };
        }
        return Err(rerr("which is not defined".into()));
    }
    if sym.shndx >= elf::SHN_LORESERVE {
        return Err(rerr(format!(
            "which is in special section {:#x} (an uninitialized global variable compiled with -fcommon?)",
            sym.shndx
        )));
    }
    let target =
        elf.section(sym.shndx as usize).ok_or_else(|| rerr(format!("whose section {} does not exist", sym.shndx)))?;
    if is_call {
        if insn.src != BPF_PSEUDO_CALL {
            return Err(rerr("but the call is not a BPF-to-BPF call".into()));
        }
        if !target.is_exec() {
            return Err(rerr(format!("which is in section {}, not a function", target.name)));
        }
        if sym.value % 8 != 0 {
            return Err(rerr(format!("at misaligned offset {}", sym.value)));
        }
        return Ok(Reloc::Call { sec: target.index, insn: (sym.value / 8) as i64 + insn.imm as i64 + 1 });
    }
    if target.is_exec() {
        let off = (sym.value as i64).checked_add(insn.imm as i64).unwrap_or(-1);
        if off % 8 != 0 || off < 0 {
            return Err(rerr(format!("at misaligned function offset {off}")));
        }
        return Ok(Reloc::FuncAddr { sec: target.index, insn: off / 8 });
    }
    if target.name == ".maps" || target.name == "maps" {
        let off = (sym.value as i64).wrapping_add(insn.imm as i64) as u64;
        return match map_by_sym.get(&(target.index, off)) {
            Some(&m) => Ok(Reloc::Map(m)),
            None => Err(rerr(format!("which is not a map definition in section {}", target.name))),
        };
    }
    if let Some(&m) = map_by_data_sec.get(&target.index) {
        let end = (sym.value as i64).checked_add(insn.imm as i64).unwrap_or(-1);
        if end < 0 || end as u64 > target.size {
            return Err(rerr(format!("at offset {end}, outside section {}", target.name)));
        }
        return Ok(Reloc::Data { map: m, off: sym.value });
    }
    Err(rerr(format!("which is in section {}, neither a map nor a global data section", target.name)))
}

fn apply_core(
    btf: &Btf,
    ext: &BtfExt,
    elf: &Elf<'_>,
    sec_insns: &mut HashMap<usize, Vec<Insn>>,
    func_containing: &dyn Fn(usize, usize) -> Option<usize>,
    opts: &ParseOptions<'_>,
) -> Result<(), ErrorKind> {
    if ext.core_relos.is_empty() {
        return Ok(());
    }
    let mut resolver = CoreResolver::new(btf, opts.target_btf);
    for group in &ext.core_relos {
        let sec_name = btf.name_of(group.sec_name_off);
        let Some(sec) = elf.section_by_name(sec_name).filter(|s| s.is_exec()) else {
            return Err(ErrorKind::Btf {
                section: ".BTF.ext".into(),
                source: crate::btf::BtfError::BadExt(format!(
                    "CO-RE relocations for `{sec_name}`, which is not a code section"
                )),
            });
        };
        for (i, relo) in group.records.iter().enumerate() {
            let insn = (relo.insn_off / 8) as usize;
            let access = btf.str_at(relo.access_str_off).unwrap_or("?").to_string();
            let cerr = |msg: String| {
                ErrorKind::Core(Box::new(CoreFailure {
                    section: sec.name.clone(),
                    index: i,
                    insn,
                    kind: relo.kind.name(),
                    type_name: btf.type_name(relo.type_id),
                    access: access.clone(),
                    msg,
                }))
            };
            if btf.type_by_id(relo.type_id).is_none() {
                return Err(cerr(format!("local type [{}] does not exist", relo.type_id)));
            }
            let insns = sec_insns.get_mut(&sec.index).ok_or_else(|| cerr("section has no code".into()))?;
            if relo.insn_off % 8 != 0 || insn >= insns.len() {
                return Err(cerr("instruction offset is not an instruction of the section".into()));
            }
            if func_containing(sec.index, insn).is_none() {
                continue;
            }
            let res = resolver.resolve(relo).map_err(|m| {
                let spec = parse_spec(btf, relo).map(|s| format!(" [{}]", format_spec(&s))).unwrap_or_default();
                cerr(format!("{m}{spec}"))
            })?;
            patch_insn(insns, insn, &res).map_err(cerr)?;
        }
    }
    Ok(())
}

fn fill_init_slots(
    elf: &Elf<'_>,
    ri: usize,
    placements: &[(usize, u64, u64, Option<u64>)],
    maps_out: &mut [MapDef],
    programs: &[ProgramSpec],
    funcs: &[Function],
    entries: &[usize],
) -> Result<(), ErrorKind> {
    let rs = &elf.sections[ri];
    let rels = Elf::rels(rs).map_err(|m| sec_err(&rs.name, m))?;
    for (n, r) in rels.iter().enumerate() {
        let sym = elf.symbols.get(r.sym as usize);
        let name = sym.map(|s| s.name.clone()).unwrap_or_else(|| format!("#{}", r.sym));
        let rerr = |msg: String| ErrorKind::Section {
            section: rs.name.clone(),
            msg: format!("relocation #{n} against `{name}`: {msg}"),
        };
        let sym = sym.ok_or_else(|| rerr("symbol does not exist".into()))?;
        let Some(&(mi, off, size, values_off)) =
            placements.iter().find(|(_, off, size, _)| *off <= r.offset && r.offset.saturating_add(8) <= off + size)
        else {
            return Err(rerr(format!("no map definition at offset {}", r.offset)));
        };
        let outer = maps_out[mi].clone();
        let merr = |msg: String| ErrorKind::Map { section: ".maps".into(), map: outer.name.clone(), msg };
        let is_mim = matches!(outer.map_type, maps::BPF_MAP_TYPE_ARRAY_OF_MAPS | maps::BPF_MAP_TYPE_HASH_OF_MAPS);
        let slot = if is_mim {
            if elf.section(sym.shndx as usize).map(|s| s.name.as_str()) != Some(".maps") {
                return Err(merr(format!("`.values` entry `{name}` isn't a BTF-defined map")));
            }
            if outer.map_type == maps::BPF_MAP_TYPE_HASH_OF_MAPS && outer.key_size != 4 {
                return Err(merr("hash-of-maps with `.values` should have key size 4".into()));
            }
            let t = maps_out
                .iter()
                .position(|m| m.name == sym.name && m.kind == MapKind::Btf)
                .ok_or_else(|| merr(format!("`.values` entry `{name}` isn't a valid map reference")))?;
            InitSlot::Map(t)
        } else if outer.map_type == maps::BPF_MAP_TYPE_PROG_ARRAY {
            let p = entries
                .iter()
                .position(|&ei| {
                    let f = &funcs[ei];
                    f.name == sym.name && f.sec == sym.shndx as usize && (f.start as u64) * 8 == sym.value
                })
                .filter(|&p| programs.get(p).is_some())
                .ok_or_else(|| merr(format!("`.values` entry `{name}` isn't an entry-point program")))?;
            InitSlot::Program(p)
        } else {
            return Err(merr("`.values` initializers need a prog array or a map of maps".into()));
        };
        let Some(values_bits) = values_off else {
            return Err(merr("relocation outside the `values` member".into()));
        };
        let rel_in_def = r.offset - off;
        let vstart = values_bits / 8;
        if rel_in_def < vstart || (rel_in_def - vstart) % 8 != 0 {
            return Err(merr(format!("relocation at offset {} is not a `values` slot", r.offset)));
        }
        let idx = ((rel_in_def - vstart) / 8) as usize;
        let _ = size;
        if idx as u64 >= outer.max_entries as u64 {
            return Err(merr(format!("`.values` slot {idx} is beyond max_entries {}", outer.max_entries)));
        }
        let m = &mut maps_out[mi];
        if m.init_slots.len() <= idx {
            m.init_slots.resize(idx + 1, None);
        }
        m.init_slots[idx] = Some(slot);
    }
    Ok(())
}
