//! Map definitions: BTF-defined maps in `.maps`, legacy `struct bpf_map_def` in `maps`, global
//! data sections, and the sanity limits applied to all of them.

use crate::btf::{BTF_VAR_GLOBAL_ALLOCATED, BTF_VAR_STATIC, Btf, BtfError, TypeKind};

pub const BPF_MAP_TYPE_ARRAY: u32 = 2;
pub const BPF_MAP_TYPE_PROG_ARRAY: u32 = 3;
pub const BPF_MAP_TYPE_ARRAY_OF_MAPS: u32 = 12;
pub const BPF_MAP_TYPE_HASH_OF_MAPS: u32 = 13;
pub const BPF_MAP_TYPE_RINGBUF: u32 = 27;
pub const BPF_MAP_TYPE_USER_RINGBUF: u32 = 31;

/// `BPF_F_RDONLY_PROG`: programs may not write (`.rodata`, `.kconfig`).
pub const BPF_F_RDONLY_PROG: u32 = 1 << 7;
/// `BPF_F_MMAPABLE`: libbpf sets it on global data maps exposing a non-static variable.
pub const BPF_F_MMAPABLE: u32 = 1 << 10;

/// `LIBBPF_PIN_BY_NAME`.
pub const PIN_BY_NAME: u32 = 1;

/// The uapi name (as bpftool prints it) of a map type, `None` for numbers no kernel defines.
pub fn map_type_name(t: u32) -> Option<&'static str> {
    Some(match t {
        1 => "hash",
        2 => "array",
        3 => "prog_array",
        4 => "perf_event_array",
        5 => "percpu_hash",
        6 => "percpu_array",
        7 => "stack_trace",
        8 => "cgroup_array",
        9 => "lru_hash",
        10 => "lru_percpu_hash",
        11 => "lpm_trie",
        12 => "array_of_maps",
        13 => "hash_of_maps",
        14 => "devmap",
        15 => "sockmap",
        16 => "cpumap",
        17 => "xskmap",
        18 => "sockhash",
        19 => "cgroup_storage",
        20 => "reuseport_sockarray",
        21 => "percpu_cgroup_storage",
        22 => "queue",
        23 => "stack",
        24 => "sk_storage",
        25 => "devmap_hash",
        26 => "struct_ops",
        27 => "ringbuf",
        28 => "inode_storage",
        29 => "task_storage",
        30 => "bloom_filter",
        31 => "user_ringbuf",
        32 => "cgrp_storage",
        33 => "arena",
        _ => return None,
    })
}

/// Where a map definition came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MapKind {
    /// A BTF-defined map in `.maps`.
    Btf,
    /// A `struct bpf_map_def` in the legacy `maps` section.
    Legacy,
    /// A global data section (or the `.kconfig` externs): one array entry holding the section.
    Data { section: String, readonly: bool },
}

/// An initial element of a prog array or map-in-map (`.values = { [i] = &x }`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InitSlot {
    /// Index into [`Object::maps`](crate::Object::maps).
    Map(usize),
    /// Index into [`Object::programs`](crate::Object::programs).
    Program(usize),
}

/// One map the runtime must create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapDef {
    /// Variable name for BTF/legacy maps; libbpf's internal name for data maps
    /// (`<objname>.bss`, `.data.foo`, ...).
    pub name: String,
    /// Raw `enum bpf_map_type` number (see [`map_type_name`]).
    pub map_type: u32,
    pub key_size: u32,
    pub value_size: u32,
    /// Ring buffer sizes are rounded up to a power-of-two number of pages, as libbpf does.
    pub max_entries: u32,
    pub map_flags: u32,
    pub map_extra: u64,
    /// 0 = none, 1 = `LIBBPF_PIN_BY_NAME`.
    pub pinning: u32,
    pub numa_node: u32,
    /// The inner map template of a map-in-map (`__array(values, struct inner)`), named
    /// `<outer>.inner`.
    pub inner: Option<Box<MapDef>>,
    /// BTF type of keys (`__type(key, T)`; legacy maps: `____btf_map_<name>`'s `key`).
    pub key_type_id: Option<u32>,
    /// BTF type of values; for data maps the section's DATASEC.
    pub value_type_id: Option<u32>,
    pub kind: MapKind,
    /// Initial value of the single element of a data map (`.bss`: zeros).
    pub initial: Option<Vec<u8>>,
    /// Initial slots of a prog array or map-in-map, by key (`None` = not set).
    pub init_slots: Vec<Option<InitSlot>>,
}

impl MapDef {
    /// True for `.rodata`-like maps programs may not write.
    pub fn is_readonly(&self) -> bool {
        self.map_flags & BPF_F_RDONLY_PROG != 0
    }
}

/// Sanity limits: definitions beyond them are refused rather than handed to an allocator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest `max_entries` (element count) of any map but ring buffers. Default 2^24.
    pub max_entries: u32,
    /// Largest ring buffer size in bytes. Default 1 GiB.
    pub max_ringbuf_bytes: u32,
    /// Largest key size. Default 64 KiB.
    pub max_key_size: u32,
    /// Largest value size (also bounds global data sections). Default 64 MiB.
    pub max_value_size: u32,
    /// Largest `max_entries * (key_size + value_size)`. Default 4 GiB.
    pub max_total_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_entries: 1 << 24,
            max_ringbuf_bytes: 1 << 30,
            max_key_size: 1 << 16,
            max_value_size: 1 << 26,
            max_total_bytes: 1 << 32,
        }
    }
}

/// Page size assumed for rounding ring buffer sizes.
pub const PAGE_SIZE: u32 = 4096;

/// libbpf's `adjust_ringbuf_sz`: the smallest power-of-two multiple of the page size that
/// holds `sz` (0 stays 0 so that the error is visible; sizes that cannot be rounded are kept).
pub fn adjust_ringbuf_size(sz: u32) -> u32 {
    if sz == 0 {
        return 0;
    }
    let mut mul: u32 = 1;
    while mul <= u32::MAX / PAGE_SIZE / 2 {
        let s = mul * PAGE_SIZE;
        if s >= sz {
            return s;
        }
        mul <<= 1;
    }
    sz
}

/// Checks a definition against the limits and known map types; the error text names what is
/// wrong (the caller adds the map and section).
pub fn check_def(def: &MapDef, limits: &Limits) -> Result<(), String> {
    if map_type_name(def.map_type).is_none() {
        return Err(format!("unknown map type {}", def.map_type));
    }
    let is_ringbuf = matches!(def.map_type, BPF_MAP_TYPE_RINGBUF | BPF_MAP_TYPE_USER_RINGBUF);
    if is_ringbuf {
        if def.max_entries > limits.max_ringbuf_bytes {
            return Err(format!(
                "ring buffer size {} bytes exceeds the limit of {} bytes",
                def.max_entries, limits.max_ringbuf_bytes
            ));
        }
    } else if def.max_entries > limits.max_entries {
        return Err(format!("max_entries {} exceeds the limit of {}", def.max_entries, limits.max_entries));
    }
    if def.key_size > limits.max_key_size {
        return Err(format!("key size {} exceeds the limit of {} bytes", def.key_size, limits.max_key_size));
    }
    if def.value_size > limits.max_value_size {
        return Err(format!("value size {} exceeds the limit of {} bytes", def.value_size, limits.max_value_size));
    }
    if !is_ringbuf {
        let total = def.max_entries as u64 * (def.key_size as u64 + def.value_size as u64);
        if total > limits.max_total_bytes {
            return Err(format!(
                "max_entries {} * (key {} + value {}) = {total} bytes exceeds the limit of {} bytes",
                def.max_entries, def.key_size, def.value_size, limits.max_total_bytes
            ));
        }
    }
    if let Some(inner) = &def.inner {
        check_def(inner, limits).map_err(|e| format!("inner map: {e}"))?;
    }
    Ok(())
}

/// libbpf's `internal_map_name`: `<objname prefix><section>` fitting the kernel's 15 bytes
/// (at least 7 bytes kept for the section name); sections with a second dot (`.data.foo`,
/// `.rodata.str1.1`) keep no object prefix; characters other than alphanumerics, `_` and `.`
/// become `_`.
pub fn internal_map_name(obj_name: &str, section: &str) -> String {
    const OBJ_NAME_LEN: usize = 16;
    let sfx_len = section.len().clamp(7, OBJ_NAME_LEN - 1);
    let custom = section.get(1..).is_some_and(|rest| rest.contains('.'));
    let pfx_len = if custom { 0 } else { (OBJ_NAME_LEN - sfx_len - 1).min(obj_name.len()) };
    let name: String = obj_name
        .bytes()
        .take(pfx_len)
        .chain(section.bytes().take(sfx_len))
        .map(|b| if b.is_ascii_alphanumeric() || b == b'_' || b == b'.' { b as char } else { '_' })
        .collect();
    name
}

/// What a `.maps` struct definition says, before checks.
#[derive(Debug, Default)]
struct BtfMapFields {
    map_type: Option<u32>,
    key_size: Option<u32>,
    value_size: Option<u32>,
    max_entries: u32,
    map_flags: u32,
    map_extra: u64,
    pinning: u32,
    numa_node: u32,
    key_type_id: Option<u32>,
    value_type_id: Option<u32>,
    inner: Option<Box<MapDef>>,
    has_values: bool,
}

/// `__uint(name, N)` is `int (*name)[N]`: a pointer to an array of N elements.
fn field_int(btf: &Btf, type_id: u32, field: &str) -> Result<u32, String> {
    let pid = btf.skip_mods_and_typedefs(type_id).map_err(|e| e.to_string())?;
    let pt = btf.get(pid).map_err(|e| e.to_string())?;
    let TypeKind::Ptr(target) = pt.kind else {
        return Err(format!("attribute `{field}`: expected PTR, got {}", pt.kind()));
    };
    let at = btf.get(target).map_err(|e| e.to_string())?;
    match at.array() {
        Some(a) => Ok(a.nelems),
        None => Err(format!("attribute `{field}`: expected ARRAY, got {}", at.kind())),
    }
}

/// `__type(name, T)` is `typeof(T) *name`: returns T and its size.
fn field_type(btf: &Btf, type_id: u32, field: &str) -> Result<(u32, u32), String> {
    let t = btf.get(type_id).map_err(|e| e.to_string())?;
    let TypeKind::Ptr(target) = t.kind else {
        return Err(format!("{field} spec is not PTR: {}", t.kind()));
    };
    let size =
        btf.resolve_size(target).map_err(|e| format!("can't determine {field} size for type [{target}]: {e}"))?;
    Ok((target, size as u32))
}

fn set_size(slot: &mut Option<u32>, v: u32, what: &str) -> Result<(), String> {
    match *slot {
        Some(old) if old != 0 && old != v => Err(format!("conflicting {what} size {old} != {v}")),
        _ => {
            *slot = Some(v);
            Ok(())
        }
    }
}

/// Parses one BTF map definition struct (libbpf's `parse_btf_map_def`). `inner` is false for
/// the inner definition of a map-in-map (which may not nest or pin).
fn parse_btf_map_fields(btf: &Btf, map_name: &str, def_id: u32, outer: bool) -> Result<BtfMapFields, String> {
    let def = btf.get(def_id).map_err(|e| e.to_string())?;
    let members = def.composite().map(|c| c.members.clone()).unwrap_or_default();
    let mut f = BtfMapFields::default();
    let n = members.len();
    for (i, m) in members.iter().enumerate() {
        let name = btf.name_of(m.name_off);
        match name {
            "type" => f.map_type = Some(field_int(btf, m.type_id, name)?),
            "max_entries" => f.max_entries = field_int(btf, m.type_id, name)?,
            "map_flags" => f.map_flags = field_int(btf, m.type_id, name)?,
            "numa_node" => f.numa_node = field_int(btf, m.type_id, name)?,
            "map_extra" => f.map_extra = field_int(btf, m.type_id, name)? as u64,
            "key_size" => {
                let v = field_int(btf, m.type_id, name)?;
                set_size(&mut f.key_size, v, "key")?;
            }
            "value_size" => {
                let v = field_int(btf, m.type_id, name)?;
                set_size(&mut f.value_size, v, "value")?;
            }
            "key" => {
                let (tid, sz) = field_type(btf, m.type_id, "key")?;
                set_size(&mut f.key_size, sz, "key")?;
                f.key_type_id = Some(tid);
            }
            "value" => {
                let (tid, sz) = field_type(btf, m.type_id, "value")?;
                set_size(&mut f.value_size, sz, "value")?;
                f.value_type_id = Some(tid);
            }
            "pinning" => {
                if !outer {
                    return Err("inner map definition can't be pinned".into());
                }
                let v = field_int(btf, m.type_id, name)?;
                if v > PIN_BY_NAME {
                    return Err(format!("invalid pinning value {v}"));
                }
                f.pinning = v;
            }
            "values" => {
                let map_type = f.map_type.unwrap_or(0);
                let is_map_in_map = matches!(map_type, BPF_MAP_TYPE_ARRAY_OF_MAPS | BPF_MAP_TYPE_HASH_OF_MAPS);
                let is_prog_array = map_type == BPF_MAP_TYPE_PROG_ARRAY;
                let desc = if is_map_in_map { "map-in-map inner" } else { "prog-array value" };
                if !outer {
                    return Err("multi-level inner maps are not supported".into());
                }
                if i != n - 1 {
                    return Err("`values` member should be last".into());
                }
                if !is_map_in_map && !is_prog_array {
                    return Err(
                        "`values` needs a map-in-map or prog-array map type (declare `type` before `values`)".into()
                    );
                }
                set_size(&mut f.value_size, 4, "value")?;
                let at = btf.get(m.type_id).map_err(|e| e.to_string())?;
                let arr = match at.array() {
                    Some(a) if a.nelems == 0 => *a,
                    _ => return Err(format!("{desc} spec is not a zero-sized array")),
                };
                let pid = btf.skip_mods_and_typedefs(arr.elem_type).map_err(|e| e.to_string())?;
                let TypeKind::Ptr(target) = btf.get(pid).map_err(|e| e.to_string())?.kind else {
                    return Err(format!("{desc} def is not a pointer"));
                };
                let tid = btf.skip_mods_and_typedefs(target).map_err(|e| e.to_string())?;
                let tt = btf.get(tid).map_err(|e| e.to_string())?;
                if is_prog_array {
                    if !matches!(tt.kind, TypeKind::FuncProto(_)) {
                        return Err(format!("prog-array value def is of unexpected kind {}", tt.kind()));
                    }
                } else {
                    if !matches!(tt.kind, TypeKind::Struct(_)) {
                        return Err(format!("map-in-map inner def is of unexpected kind {}", tt.kind()));
                    }
                    let inner_name = format!("{map_name}.inner");
                    let fi =
                        parse_btf_map_fields(btf, &inner_name, tid, false).map_err(|e| format!("inner map: {e}"))?;
                    f.inner = Some(Box::new(fields_to_def(inner_name, fi, MapKind::Btf)?));
                }
                f.has_values = true;
            }
            other => return Err(format!("unknown field `{other}`")),
        }
    }
    if f.map_type.unwrap_or(0) == 0 {
        return Err("map type isn't specified".into());
    }
    Ok(f)
}

fn fields_to_def(name: String, f: BtfMapFields, kind: MapKind) -> Result<MapDef, String> {
    let map_type = f.map_type.unwrap_or(0);
    let mut max_entries = f.max_entries;
    if matches!(map_type, BPF_MAP_TYPE_RINGBUF | BPF_MAP_TYPE_USER_RINGBUF) {
        max_entries = adjust_ringbuf_size(max_entries);
    }
    Ok(MapDef {
        name,
        map_type,
        key_size: f.key_size.unwrap_or(0),
        value_size: f.value_size.unwrap_or(0),
        max_entries,
        map_flags: f.map_flags,
        map_extra: f.map_extra,
        pinning: f.pinning,
        numa_node: f.numa_node,
        inner: f.inner,
        key_type_id: f.key_type_id,
        value_type_id: f.value_type_id,
        kind,
        initial: None,
        init_slots: Vec::new(),
    })
}

/// A BTF-defined map with its place in the `.maps` section.
#[derive(Debug)]
pub(crate) struct BtfMapPlacement {
    pub def: MapDef,
    pub offset: u64,
    pub size: u64,
    /// Bit offset of the `values` member within the definition, when present.
    pub values_offset: Option<u64>,
}

/// Parses every BTF-defined map of the `.maps` DATASEC. Errors are `(map name, message)`.
pub(crate) fn parse_btf_maps(btf: &Btf, sec_size: u64) -> Result<Vec<BtfMapPlacement>, (String, String)> {
    let Some(ds_id) = btf.find_by_name_kind(".maps", crate::btf::Kind::Datasec) else {
        return Err((String::new(), "DATASEC `.maps` not found in BTF".into()));
    };
    let vars = match &btf.get(ds_id).map_err(|e| (String::new(), e.to_string()))?.kind {
        TypeKind::Datasec(d) => d.vars.clone(),
        _ => Vec::new(),
    };
    let mut out = Vec::with_capacity(vars.len());
    for (i, vi) in vars.iter().enumerate() {
        let var = btf.get(vi.type_id).map_err(|e| (format!("#{i}"), e.to_string()))?;
        let name = btf.name_of(var.name_off).to_string();
        let err = |m: String| (if name.is_empty() { format!("#{i}") } else { name.clone() }, m);
        if name.is_empty() {
            return Err(err("empty map name".into()));
        }
        let TypeKind::Var { type_id, linkage } = var.kind else {
            return Err(err(format!("unexpected var kind {}", var.kind())));
        };
        if vi.offset as u64 + vi.size as u64 > sec_size {
            return Err(err("BTF data is corrupted: definition lies beyond the .maps section".into()));
        }
        if linkage != BTF_VAR_GLOBAL_ALLOCATED {
            let l = if linkage == BTF_VAR_STATIC { "static" } else { "extern" };
            return Err(err(format!("unsupported map linkage {l}")));
        }
        let def_id = btf.skip_mods_and_typedefs(type_id).map_err(|e: BtfError| err(e.to_string()))?;
        let dt = btf.get(def_id).map_err(|e| err(e.to_string()))?;
        let Some(c) = dt.composite().filter(|_| matches!(dt.kind, TypeKind::Struct(_))) else {
            return Err(err(format!("unexpected def kind {}", dt.kind())));
        };
        if c.size > vi.size {
            return Err(err("invalid def size".into()));
        }
        let values_offset =
            c.members.last().filter(|m| btf.name_of(m.name_off) == "values").map(|m| m.bit_offset as u64);
        let fields = parse_btf_map_fields(btf, &name, def_id, true).map_err(err)?;
        let def = fields_to_def(name.clone(), fields, MapKind::Btf).map_err(err)?;
        out.push(BtfMapPlacement { def, offset: vi.offset as u64, size: vi.size as u64, values_offset });
    }
    Ok(out)
}

/// Key and value types of a legacy map from `BPF_ANNOTATE_KV_PAIR`'s `struct ____btf_map_<name>`.
pub(crate) fn legacy_kv_types(btf: &Btf, map_name: &str) -> (Option<u32>, Option<u32>) {
    let container = format!("____btf_map_{map_name}");
    let Some(id) = btf.find_by_name_kind(&container, crate::btf::Kind::Struct) else {
        return (None, None);
    };
    let mut key = None;
    let mut value = None;
    for m in btf.members(id) {
        match btf.name_of(m.name_off) {
            "key" => key = Some(m.type_id),
            "value" => value = Some(m.type_id),
            _ => {}
        }
    }
    (key, value)
}

/// Whether a data section's DATASEC exposes a non-static variable (libbpf's
/// `map_is_mmapable`).
pub(crate) fn datasec_has_global_var(btf: &Btf, ds_id: u32) -> bool {
    match btf.type_by_id(ds_id).map(|t| &t.kind) {
        Some(TypeKind::Datasec(d)) => d.vars.iter().any(|v| {
            matches!(btf.type_by_id(v.type_id).map(|t| &t.kind), Some(TypeKind::Var { linkage, .. }) if *linkage != BTF_VAR_STATIC)
        }),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_names_follow_libbpf() {
        assert_eq!(internal_map_name("my_object_name", ".rodata"), "my_objec.rodata");
        assert_eq!(internal_map_name("my_object_name", ".bss"), "my_objec.bss");
        assert_eq!(internal_map_name("my_object_name", ".kconfig"), "my_obje.kconfig");
        assert_eq!(internal_map_name("globals", ".data"), "globals.data");
        assert_eq!(internal_map_name("globals", ".data.foo"), ".data.foo");
        assert_eq!(internal_map_name("x", ".rodata.abracadabra"), ".rodata.abracad");
        assert_eq!(internal_map_name("a-b", ".bss"), "a_b.bss");
    }

    #[test]
    fn ringbuf_rounding() {
        assert_eq!(adjust_ringbuf_size(0), 0);
        assert_eq!(adjust_ringbuf_size(1), 4096);
        assert_eq!(adjust_ringbuf_size(4096), 4096);
        assert_eq!(adjust_ringbuf_size(5000), 8192);
        assert_eq!(adjust_ringbuf_size(256 * 1024), 256 * 1024);
        assert_eq!(adjust_ringbuf_size(3 << 20), 4 << 20);
    }
}
