//! Extern symbols: `__kconfig` externs (resolved statically into a read-only `.kconfig` map,
//! as libbpf does: `LINUX_*` virtual externs computed, `CONFIG_*` ones from the values given
//! or the running kernel's config, see [`system_kconfig`]) and `__ksym` externs (kernel symbols and kfuncs, which a user-space runtime
//! cannot provide: refused unless weak).

use crate::ErrorKind;
use crate::btf::{BTF_FUNC_EXTERN, BTF_VAR_GLOBAL_EXTERN, Btf, Kind, TypeKind};
use std::collections::BTreeMap;

/// A value for a kconfig extern, as written in a kernel config (`CONFIG_X=y`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KconfigValue {
    Yes,
    No,
    Module,
    Number(i128),
    Str(String),
}

impl KconfigValue {
    /// Parses the right-hand side of a `.config` line: `y`, `n`, `m`, a number (decimal, `0x`
    /// hex or leading-zero octal, optionally negative) or a double-quoted string.
    pub fn parse(text: &str) -> Option<KconfigValue> {
        let t = text.trim();
        match t {
            "y" => return Some(KconfigValue::Yes),
            "n" => return Some(KconfigValue::No),
            "m" => return Some(KconfigValue::Module),
            _ => {}
        }
        if let Some(s) = t.strip_prefix('"').and_then(|s| s.strip_suffix('"')) {
            return Some(KconfigValue::Str(s.to_string()));
        }
        let (neg, digits) = match t.strip_prefix('-') {
            Some(d) => (true, d),
            None => (false, t),
        };
        let v = if let Some(h) = digits.strip_prefix("0x").or_else(|| digits.strip_prefix("0X")) {
            i128::from_str_radix(h, 16).ok()?
        } else if digits.len() > 1 && digits.starts_with('0') {
            i128::from_str_radix(&digits[1..], 8).ok()?
        } else {
            digits.parse::<i128>().ok()?
        };
        Some(KconfigValue::Number(if neg { -v } else { v }))
    }
}

/// Parses kernel config text (`.config` / `/proc/config.gz` contents): `CONFIG_X=value` lines,
/// `# CONFIG_X is not set` as `n`; other lines are ignored.
pub fn parse_kconfig(text: &str) -> BTreeMap<String, KconfigValue> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let line = line.trim();
        if let Some(name) = line.strip_prefix("# ").and_then(|l| l.strip_suffix(" is not set")) {
            out.insert(name.to_string(), KconfigValue::No);
        } else if let Some((name, value)) = line.split_once('=')
            && name.starts_with("CONFIG_")
            && let Some(v) = KconfigValue::parse(value)
        {
            out.insert(name.to_string(), v);
        }
    }
    out
}

/// The running kernel's config as libbpf finds it: `/boot/config-$(uname -r)`, else
/// `/proc/config.gz` (either may be gzip-compressed or plain text); `path` reads that file
/// instead. Only `CONFIG_X=value` lines count (libbpf skips `# CONFIG_X is not set`, so such
/// an extern stays unset: 0 if weak, refused if strong). Returns the file read and the
/// values, or why no file could be read.
pub fn system_kconfig(
    path: Option<&std::path::Path>,
) -> Result<(std::path::PathBuf, BTreeMap<String, KconfigValue>), String> {
    let candidates: Vec<std::path::PathBuf> = match path {
        Some(p) => vec![p.to_path_buf()],
        None => {
            let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
            let mut v = Vec::new();
            if !release.trim().is_empty() {
                v.push(std::path::PathBuf::from(format!("/boot/config-{}", release.trim())));
            }
            v.push("/proc/config.gz".into());
            v
        }
    };
    let mut tried = Vec::new();
    for c in candidates {
        match read_maybe_gzip(&c) {
            Ok(text) => {
                let set: Vec<&str> = text.lines().filter(|l| l.trim_start().starts_with("CONFIG_")).collect();
                return Ok((c, parse_kconfig(&set.join("\n"))));
            }
            Err(e) => tried.push(format!("{}: {e}", c.display())),
        }
    }
    Err(tried.join("; "))
}

/// A file's text, gunzipped when it starts with the gzip magic (as zlib's gzopen reads both).
fn read_maybe_gzip(path: &std::path::Path) -> Result<String, String> {
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    if bytes.starts_with(&[0x1f, 0x8b]) {
        use std::io::Read;
        let mut text = String::new();
        flate2::read::MultiGzDecoder::new(&bytes[..]).read_to_string(&mut text).map_err(|e| format!("gzip: {e}"))?;
        Ok(text)
    } else {
        String::from_utf8(bytes).map_err(|_| "not text".to_string())
    }
}

/// How a kconfig extern is stored (libbpf's `enum kcfg_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KcfgType {
    Bool,
    Tristate,
    Char,
    Int { signed: bool },
    CharArray,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ExternKind {
    /// A `.kconfig` extern at this offset of the kconfig map.
    Kcfg { offset: u32 },
    /// A `.ksyms` extern (variable or kfunc); only weak ones get here (they resolve to 0).
    WeakKsym,
}

#[derive(Debug, Clone)]
pub(crate) struct Extern {
    pub kind: ExternKind,
}

/// The externs of an object and the `.kconfig` map contents.
#[derive(Debug, Default)]
pub(crate) struct Externs {
    /// By symbol name.
    pub by_name: BTreeMap<String, Extern>,
    /// Contents of the `.kconfig` map, when there are kconfig externs.
    pub kconfig_data: Option<Vec<u8>>,
    /// BTF id of the `.kconfig` DATASEC.
    pub kconfig_datasec: Option<u32>,
}

fn find_kcfg_type(btf: &Btf, id: u32) -> Option<KcfgType> {
    let rid = btf.skip_mods_and_typedefs(id).ok()?;
    let t = btf.get(rid).ok()?;
    match &t.kind {
        TypeKind::Int(i) => {
            if i.is_bool() {
                return (i.size == 1).then_some(KcfgType::Bool);
            }
            if i.size == 1 {
                return Some(KcfgType::Char);
            }
            matches!(i.size, 2 | 4 | 8).then_some(KcfgType::Int { signed: i.is_signed() })
        }
        TypeKind::Enum(e) | TypeKind::Enum64(e) => {
            (btf.name_of(t.name_off) == "libbpf_tristate" && e.size == 4).then_some(KcfgType::Tristate)
        }
        TypeKind::Array(a) => {
            (a.nelems > 0 && find_kcfg_type(btf, a.elem_type) == Some(KcfgType::Char)).then_some(KcfgType::CharArray)
        }
        _ => None,
    }
}

/// Linux's `KERNEL_VERSION(a, b, c)` of a release string like `6.1.0-13-amd64`.
pub(crate) fn kernel_version_of(release: &str) -> Option<u32> {
    let mut it = release.split(|c: char| !c.is_ascii_digit());
    let major: u32 = it.next()?.parse().ok()?;
    let minor: u32 = it.next()?.parse().ok()?;
    let patch: u32 = it.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    Some((major.min(255) << 16) | (minor.min(255) << 8) | patch.min(255))
}

fn running_kernel_version() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/osrelease").ok().and_then(|s| kernel_version_of(&s)).unwrap_or(0)
}

fn store(kind: KcfgType, size: usize, value: &KconfigValue) -> Result<Vec<u8>, String> {
    let mut out = vec![0u8; size];
    match (kind, value) {
        (KcfgType::Bool, KconfigValue::Yes) => out[0] = 1,
        (KcfgType::Bool, KconfigValue::No) => {}
        (KcfgType::Bool, KconfigValue::Number(n)) if *n == 0 || *n == 1 => out[0] = *n as u8,
        (KcfgType::Tristate, KconfigValue::Yes) => out[..4].copy_from_slice(&1u32.to_le_bytes()),
        (KcfgType::Tristate, KconfigValue::No) => {}
        (KcfgType::Tristate, KconfigValue::Module) => out[..4].copy_from_slice(&2u32.to_le_bytes()),
        (KcfgType::Char, KconfigValue::Yes) => out[0] = b'y',
        (KcfgType::Char, KconfigValue::No) => out[0] = b'n',
        (KcfgType::Char, KconfigValue::Module) => out[0] = b'm',
        (KcfgType::Char, KconfigValue::Number(n)) if (-128..=255).contains(n) => out[0] = *n as u8,
        (KcfgType::Int { signed }, KconfigValue::Number(n)) => {
            let bits = size as u32 * 8;
            let ok = if signed {
                let min = -(1i128 << (bits - 1));
                let max = (1i128 << (bits - 1)) - 1;
                (min..=max).contains(n)
            } else {
                *n >= 0 && *n < (1i128 << bits)
            };
            if !ok {
                return Err(format!("value {n} does not fit in {size} bytes"));
            }
            let bytes = n.to_le_bytes();
            out.copy_from_slice(&bytes[..size]);
        }
        (KcfgType::CharArray, KconfigValue::Str(s)) => {
            // Truncated to leave room for the NUL, as libbpf does.
            let n = s.len().min(size.saturating_sub(1));
            out[..n].copy_from_slice(&s.as_bytes()[..n]);
        }
        (k, v) => return Err(format!("value {v:?} does not suit a {k:?} extern")),
    }
    Ok(out)
}

/// A symbol that is an extern: undefined, untyped, global or weak, named.
pub(crate) fn is_extern_symbol(sym: &crate::elf::Symbol) -> bool {
    sym.shndx == crate::elf::SHN_UNDEF
        && (sym.bind == crate::elf::STB_GLOBAL || sym.bind == crate::elf::STB_WEAK)
        && sym.typ == crate::elf::STT_NOTYPE
        && !sym.name.is_empty()
}

/// Finds the extern's BTF VAR/FUNC and the DATASEC holding it.
fn find_extern_btf(btf: &Btf, name: &str) -> Option<(u32, u32, String)> {
    for (id, t) in btf.types() {
        if btf.name_of(t.name_off) != name {
            continue;
        }
        let is_ext = match t.kind {
            TypeKind::Var { linkage, .. } => linkage == BTF_VAR_GLOBAL_EXTERN,
            TypeKind::Func { linkage, .. } => linkage == BTF_FUNC_EXTERN,
            _ => false,
        };
        if !is_ext {
            continue;
        }
        for (sid, st) in btf.types() {
            if let TypeKind::Datasec(d) = &st.kind
                && d.vars.iter().any(|v| v.type_id == id)
            {
                return Some((id, sid, btf.name_of(st.name_off).to_string()));
            }
        }
    }
    None
}

/// Collects externs from the symbol table, resolves kconfig ones and lays out the `.kconfig`
/// map (updating the DATASEC's size and offsets in `btf`, as libbpf does).
pub(crate) fn collect(
    symbols: &[crate::elf::Symbol],
    btf: Option<&mut Btf>,
    opts: &crate::ParseOptions<'_>,
) -> Result<Externs, ErrorKind> {
    let ext_syms: Vec<&crate::elf::Symbol> = symbols.iter().filter(|s| is_extern_symbol(s)).collect();
    let mut out = Externs::default();
    if ext_syms.is_empty() {
        return Ok(out);
    }
    let err = |name: &str, msg: String| ErrorKind::Extern { name: name.to_string(), msg };
    let Some(btf) = btf else {
        // Without BTF, externs cannot be classified; references to them are reported as
        // undefined symbols by the relocation pass.
        return Ok(out);
    };
    struct Kcfg {
        name: String,
        btf_id: u32,
        size: u32,
        align: u32,
        kind: KcfgType,
        weak: bool,
    }
    let mut kcfgs = Vec::new();
    let mut kconfig_ds = None;
    for sym in ext_syms {
        let name = sym.name.as_str();
        let weak = sym.bind == crate::elf::STB_WEAK;
        // Externs without BTF description (plain `extern` functions) stay undefined.
        let Some((id, ds, sec)) = find_extern_btf(btf, name) else { continue };
        let t = btf.get(id).map_err(|e| err(name, e.to_string()))?;
        match sec.as_str() {
            ".kconfig" => {
                let TypeKind::Var { type_id, .. } = t.kind else {
                    return Err(err(name, "extern functions are not supported in .kconfig".into()));
                };
                let size = btf.resolve_size(type_id).map_err(|e| err(name, format!("cannot size: {e}")))?;
                let align = btf.align_of(type_id).map_err(|e| err(name, format!("cannot align: {e}")))?;
                if size == 0 || align == 0 {
                    return Err(err(name, "kconfig extern has no size".into()));
                }
                let kind = find_kcfg_type(btf, type_id)
                    .ok_or_else(|| err(name, "kconfig extern type is unsupported".into()))?;
                kconfig_ds = Some(ds);
                kcfgs.push(Kcfg {
                    name: name.to_string(),
                    btf_id: id,
                    size: size as u32,
                    align: align as u32,
                    kind,
                    weak,
                });
            }
            ".ksyms" => {
                let what = if t.kind() == Kind::Func { "kfunc" } else { "kernel symbol" };
                if !weak {
                    return Err(err(
                        name,
                        format!(
                            "__ksym {what}s are resolved against the running kernel, which a user-space runtime cannot do (declare it __weak to let it resolve to 0)"
                        ),
                    ));
                }
                out.by_name.insert(name.to_string(), Extern { kind: ExternKind::WeakKsym });
            }
            other => return Err(err(name, format!("unrecognized extern section `{other}`"))),
        }
    }
    if kcfgs.is_empty() {
        return Ok(out);
    }
    // libbpf's layout: descending alignment, then ascending size, then name.
    kcfgs.sort_by(|a, b| b.align.cmp(&a.align).then(a.size.cmp(&b.size)).then(a.name.cmp(&b.name)));
    let mut off: u32 = 0;
    let mut offsets = Vec::with_capacity(kcfgs.len());
    for k in &kcfgs {
        let start = off.checked_next_multiple_of(k.align);
        let end = start.and_then(|o| o.checked_add(k.size));
        let (Some(start), Some(end)) = (start, end) else {
            return Err(err(&k.name, "kconfig externs overflow".into()));
        };
        offsets.push(start);
        off = end;
    }
    if off > opts.limits.max_value_size {
        return Err(err(
            &kcfgs[kcfgs.len() - 1].name,
            format!("kconfig externs take {off} bytes, beyond the value size limit of {}", opts.limits.max_value_size),
        ));
    }
    let mut data = vec![0u8; off as usize];
    let kernel_version = opts.kernel_version.unwrap_or_else(running_kernel_version);
    // libbpf reads the system's config when a CONFIG_ extern has no value given, and fails
    // when it cannot (weak externs too).
    let need_system = kcfgs.iter().any(|k| k.name.starts_with("CONFIG_") && !opts.kconfig.contains_key(&k.name));
    let system = if need_system {
        let read = match opts.kconfig_file.as_deref() {
            Some(path) => system_kconfig(Some(path)).map(|(_, v)| v),
            // The running kernel's config does not change: read it once per process.
            None => {
                static SYSTEM: std::sync::OnceLock<Result<BTreeMap<String, KconfigValue>, String>> =
                    std::sync::OnceLock::new();
                SYSTEM.get_or_init(|| system_kconfig(None).map(|(_, v)| v)).clone()
            }
        };
        match read {
            Ok(values) => values,
            Err(why) => {
                let first = kcfgs
                    .iter()
                    .find(|k| k.name.starts_with("CONFIG_") && !opts.kconfig.contains_key(&k.name))
                    .expect("need_system");
                return Err(err(
                    &first.name,
                    format!(
                        "the kernel's config is needed for CONFIG_ externs, as libbpf reads it, and none could be read ({why}); give the values in ParseOptions::kconfig"
                    ),
                ));
            }
        }
    } else {
        BTreeMap::new()
    };
    for (k, &o) in kcfgs.iter().zip(&offsets) {
        let given = opts.kconfig.get(&k.name).or_else(|| system.get(&k.name)).cloned();
        let value = if let Some(v) = given {
            Some(v)
        } else if k.name == "LINUX_KERNEL_VERSION" {
            Some(KconfigValue::Number(kernel_version as i128))
        } else if k.name == "LINUX_HAS_BPF_COOKIE" || k.name == "LINUX_HAS_SYSCALL_WRAPPER" {
            Some(KconfigValue::Number(1))
        } else if k.weak && (k.name.starts_with("CONFIG_") || k.name.starts_with("LINUX_")) {
            None // stays zero, as libbpf leaves missing weak externs
        } else if k.name.starts_with("LINUX_") {
            return Err(err(&k.name, "unrecognized virtual kconfig extern (declare it __weak to default to 0)".into()));
        } else if k.name.starts_with("CONFIG_") {
            return Err(err(
                &k.name,
                "no value for this kconfig extern in the kernel's config (declare it __weak to default to 0, or pass it in ParseOptions::kconfig)".into(),
            ));
        } else {
            return Err(err(&k.name, "unrecognized kconfig extern (only CONFIG_* and LINUX_* are known)".into()));
        };
        if let Some(v) = value {
            let bytes = store(k.kind, k.size as usize, &v).map_err(|m| err(&k.name, m))?;
            data[o as usize..(o + k.size) as usize].copy_from_slice(&bytes);
        }
        out.by_name.insert(k.name.clone(), Extern { kind: ExternKind::Kcfg { offset: o } });
    }
    // Describe the layout in the DATASEC, as libbpf does, so the map can be printed.
    if let Some(ds) = kconfig_ds
        && let Some(crate::btf::BtfType { kind: TypeKind::Datasec(d), .. }) = btf.type_mut(ds)
    {
        d.size = off;
        for v in d.vars.iter_mut() {
            if let Some(pos) = kcfgs.iter().position(|k| k.btf_id == v.type_id) {
                v.offset = offsets[pos];
                v.size = kcfgs[pos].size;
            }
        }
        d.vars.sort_by_key(|v| v.offset);
    }
    out.kconfig_data = Some(data);
    out.kconfig_datasec = kconfig_ds;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions() {
        assert_eq!(kernel_version_of("6.1.0-13-amd64"), Some(0x060100));
        assert_eq!(kernel_version_of("5.15.300"), Some(0x050fff));
        assert_eq!(kernel_version_of("4.19"), Some(0x041300));
        assert_eq!(kernel_version_of("x"), None);
    }

    #[test]
    fn config_text() {
        let m = parse_kconfig("CONFIG_A=y\n# CONFIG_B is not set\nCONFIG_HZ=250\nCONFIG_S=\"x y\"\njunk\n");
        assert_eq!(m.get("CONFIG_A"), Some(&KconfigValue::Yes));
        assert_eq!(m.get("CONFIG_B"), Some(&KconfigValue::No));
        assert_eq!(m.get("CONFIG_HZ"), Some(&KconfigValue::Number(250)));
        assert_eq!(m.get("CONFIG_S"), Some(&KconfigValue::Str("x y".into())));
        assert_eq!(m.len(), 4);
    }

    #[test]
    fn values() {
        assert_eq!(KconfigValue::parse("y"), Some(KconfigValue::Yes));
        assert_eq!(KconfigValue::parse("0x10"), Some(KconfigValue::Number(16)));
        assert_eq!(KconfigValue::parse("-5"), Some(KconfigValue::Number(-5)));
        assert_eq!(KconfigValue::parse("\"abc\""), Some(KconfigValue::Str("abc".into())));
        assert_eq!(store(KcfgType::Int { signed: false }, 4, &KconfigValue::Number(7)).unwrap(), vec![7, 0, 0, 0]);
        assert!(store(KcfgType::Int { signed: false }, 1 + 1, &KconfigValue::Number(70000)).is_err());
        assert!(store(KcfgType::Bool, 1, &KconfigValue::Module).is_err());
        assert_eq!(store(KcfgType::CharArray, 4, &KconfigValue::Str("abcdef".into())).unwrap(), b"abc\0".to_vec());
    }
}
