//! The eBPF object loader: reads an ELF object produced by `clang -target bpf -g -O2` following
//! libbpf's conventions and produces everything the runtime needs, without touching the kernel.
//!
//! [`Object::parse`] (or [`Object::open`], [`Object::parse_with`]) returns:
//!
//! - [`ProgramSpec`]s: one per entry function (a global function in a non-`.text` section), with
//!   self-contained instructions: the entry function followed by every subprogram it calls or
//!   takes the address of (as libbpf appends them), call and `BPF_PSEUDO_FUNC` offsets fixed up,
//!   CO-RE relocations applied, map references rewritten to `lddw` with
//!   `src = BPF_PSEUDO_MAP_IDX` (`imm` = index into [`Object::maps`]) and global variables to
//!   `src = BPF_PSEUDO_MAP_IDX_VALUE` (`imm` = map index, second slot `imm` = offset in the map's
//!   value). The runtime resolves those through the VM's relocation hook.
//! - [`MapDef`]s: BTF-defined maps (`.maps`), legacy `maps` definitions, one single-entry array
//!   per global data section (`.data`, `.rodata`, `.bss`, `.data.*`, `.rodata.*`, `.bss.*`) and
//!   a `.kconfig` map when the object has `__kconfig` externs.
//! - the license, the kernel version (`version` section) and the object's [`Btf`].
//!
//! Modules: [`btf`] (BTF, `.BTF.ext`, the value printer), [`section`] (program kinds), [`core_relo`]
//! (CO-RE relocations), [`maps`] (map definitions), [`elf`] (a small ELF reader).
//!
//! # Refused
//!
//! Every refusal is an [`ObjectError`] naming the file and the section, map, symbol, extern or
//! relocation at fault: files that are not little-endian 64-bit BPF relocatable ELF objects,
//! truncated or inconsistent ELF/BTF/`.BTF.ext` data, BTF-defined maps without BTF, unknown
//! map types or definition fields, maps beyond the [`Limits`], relocations against undefined
//! symbols or on instructions that are neither calls nor 64-bit loads, calls that do not land
//! on a function, static programs outside `.text`, strong `__ksym` externs (kernel symbols and
//! kfuncs), `__kconfig` externs with no value, malformed attach targets in section names, and
//! CO-RE relocations that libbpf refuses (ambiguous candidates, unexpected instructions),
//! `struct_ops` maps (`.struct_ops`, `.struct_ops.link` variables: kernel-only; struct_ops
//! programs are [`ProgramKind::KernelOnly`], refused by the runtime when loaded).
//!
//! # Differences from libbpf
//!
//! - Map and variable references become `BPF_PSEUDO_MAP_IDX`/`_IDX_VALUE` loads (libbpf's
//!   gen_loader form) rather than file descriptors; nothing is created in the kernel.
//! - Legacy `maps` sections are accepted (libbpf 1.x refuses them), as libbpf 0.x read them,
//!   with key/value types from `BPF_ANNOTATE_KV_PAIR`'s `____btf_map_<name>`.
//! - A call may target a function of any code section, not only `.text`; calling another entry
//!   program appends a copy of it.
//! - Malformed attach targets (`uprobe/PATH` without `:FUNC`, `usdt/` without three parts,
//!   `tp/CAT` without a name, `uretprobe` with an offset) are refused when parsing; libbpf
//!   fails only when attaching. `uprobe/PATH:OFFSET` (no function) is accepted.
//! - Without a target BTF, CO-RE relocations resolve against the object's own BTF (identity);
//!   libbpf would use the running kernel's. Module BTFs are never searched.
//! - `.kconfig`: `LINUX_KERNEL_VERSION` comes from [`ParseOptions::kernel_version`] or
//!   `/proc/sys/kernel/osrelease`; `LINUX_HAS_BPF_COOKIE` and `LINUX_HAS_SYSCALL_WRAPPER` are
//!   1 (libbpf probes the kernel); `CONFIG_*` values come from [`ParseOptions::kconfig`], then
//!   as libbpf from `/boot/config-$(uname -r)` or `/proc/config.gz` ([`system_kconfig`]; an
//!   object with a `CONFIG_*` extern is refused when neither is readable, as libbpf fails).
//!   Weak `__ksym` variables resolve to
//!   0 and weak kfunc calls stay unresolved kfunc calls (`imm` 0), as libbpf leaves missing
//!   ones; strong `__ksym`s are refused.
//! - Ring buffer sizes are rounded up with a 4096-byte page. `pinning`, `numa_node`,
//!   `map_flags` and `map_extra` are recorded in the [`MapDef`] for the runtime, which pins
//!   `LIBBPF_PIN_BY_NAME` maps in its session and checks the rest as the kernel does.
//! - Malformed `.BTF`/`.BTF.ext` refuse the object (libbpf may drop BTF it does not need).

pub mod btf;
pub mod core_relo;
pub mod elf;
mod error;
mod externs;
mod link;
mod loader;
pub mod maps;
pub mod section;

pub use btf::Btf;
pub use btf::ext::{FuncInfo, LineInfo};
pub use error::{CoreFailure, ErrorKind, ObjectError};
pub use externs::{KconfigValue, parse_kconfig, system_kconfig};
pub use maps::{InitSlot, Limits, MapDef, MapKind, map_type_name};
pub use section::{ProgramKind, UprobeTarget, UsdtTarget};

use std::collections::BTreeMap;
use std::path::Path;
use userbpf_isa::Insn;

/// The instruction a failed CO-RE relocation is replaced with, as libbpf does: a call to the
/// non-existent helper 195896080 (`0xbad2310`, "bad relo"). A runtime that meets it should say
/// that a CO-RE relocation could not be resolved.
pub const CORE_POISON_HELPER: i32 = 0xbad2310;

/// One function placed in a [`ProgramSpec`]'s instructions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionSpan {
    /// The function's symbol name.
    pub name: String,
    /// ELF section it came from.
    pub section: String,
    /// First instruction slot in [`ProgramSpec::insns`].
    pub start: usize,
    /// Number of instruction slots.
    pub len: usize,
}

/// A loadable program: an entry function and everything it needs.
#[derive(Debug, Clone, PartialEq)]
pub struct ProgramSpec {
    /// The entry function's symbol name.
    pub name: String,
    /// The ELF section name, without libbpf's `?` (no-autoload) prefix.
    pub section: String,
    pub kind: ProgramKind,
    /// Section names ending in `.s` (`uprobe.s`, `usdt.s`, ...) ask for a sleepable program.
    pub sleepable: bool,
    /// False when the section name started with `?` (libbpf: not loaded unless asked for).
    pub autoload: bool,
    /// Self-contained instructions (see the crate docs).
    pub insns: Vec<Insn>,
    /// The entry function (first, at 0) and the appended subprograms, in placement order.
    pub functions: Vec<FunctionSpan>,
    /// BTF `FUNC` of each function, `insn_off` as an instruction index in `insns`.
    pub func_info: Vec<FuncInfo>,
    /// Source lines, `insn_off` as an instruction index in `insns`; names are in [`Object::btf`].
    pub line_info: Vec<LineInfo>,
}

/// A parsed object file.
#[derive(Debug, Clone)]
pub struct Object {
    /// libbpf's object name: the file's base name up to the first `.`, at most 15 bytes.
    pub name: String,
    /// The file name this object was parsed from (as given), used in messages.
    pub file: String,
    /// Contents of the `license` section up to its NUL ("" when absent).
    pub license: String,
    /// The `version` section (a `u32`), when present.
    pub kern_version: Option<u32>,
    pub programs: Vec<ProgramSpec>,
    pub maps: Vec<MapDef>,
    /// The object's BTF (with DATASEC sizes and offsets filled in as libbpf does).
    pub btf: Option<Btf>,
}

/// Options for [`Object::parse_with_options`].
#[derive(Debug, Clone, Default)]
pub struct ParseOptions<'a> {
    /// BTF to resolve CO-RE relocations against (e.g. the traced binary's or the kernel's).
    /// `None`: the object's own BTF, so every relocation keeps the value compiled in (right
    /// for user-space structs described by the object itself).
    pub target_btf: Option<&'a Btf>,
    /// Value of the `LINUX_KERNEL_VERSION` kconfig extern; `None` reads
    /// `/proc/sys/kernel/osrelease` (0 when unreadable).
    pub kernel_version: Option<u32>,
    /// Values for `CONFIG_*` (and `LINUX_*`) kconfig externs, overriding the defaults (as
    /// libbpf's `kconfig` open option).
    pub kconfig: BTreeMap<String, KconfigValue>,
    /// The kernel config file to read `CONFIG_*` externs from when [`kconfig`](Self::kconfig)
    /// lacks one; `None`: libbpf's `/boot/config-$(uname -r)`, else `/proc/config.gz`.
    pub kconfig_file: Option<std::path::PathBuf>,
    /// Sanity limits on map sizes.
    pub limits: Limits,
}

impl Object {
    /// Parses an object from memory. `name` is the file name used in messages and to derive
    /// the object name (as libbpf does from the path).
    pub fn parse(bytes: &[u8], name: &str) -> Result<Object, ObjectError> {
        Self::parse_with_options(bytes, name, &ParseOptions::default())
    }

    /// Like [`parse`](Self::parse), resolving CO-RE relocations against `target_btf` when given.
    pub fn parse_with(bytes: &[u8], name: &str, target_btf: Option<&Btf>) -> Result<Object, ObjectError> {
        Self::parse_with_options(bytes, name, &ParseOptions { target_btf, ..Default::default() })
    }

    /// Parses with every option.
    pub fn parse_with_options(bytes: &[u8], name: &str, opts: &ParseOptions<'_>) -> Result<Object, ObjectError> {
        loader::load(bytes, name, opts).map_err(|kind| ObjectError::new(name, kind))
    }

    /// Reads and parses a file.
    pub fn open(path: impl AsRef<Path>) -> Result<Object, ObjectError> {
        Self::open_with_options(path, &ParseOptions::default())
    }

    /// Reads and parses a file with options.
    pub fn open_with_options(path: impl AsRef<Path>, opts: &ParseOptions<'_>) -> Result<Object, ObjectError> {
        let path = path.as_ref();
        let shown = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|e| ObjectError::new(shown.clone(), ErrorKind::Io(e)))?;
        Self::parse_with_options(&bytes, &shown, opts)
    }

    /// The program with this (function) name.
    pub fn program(&self, name: &str) -> Option<&ProgramSpec> {
        self.programs.iter().find(|p| p.name == name)
    }

    /// The map with this name, and its index (the `imm` of `BPF_PSEUDO_MAP_IDX` loads).
    pub fn map(&self, name: &str) -> Option<(usize, &MapDef)> {
        self.maps.iter().enumerate().find(|(_, m)| m.name == name)
    }
}

/// libbpf's object name for a path: the base name up to the first `.`, cut to 15 bytes.
pub fn object_name(path: &str) -> String {
    let base = path.rsplit('/').next().unwrap_or(path);
    let stem = base.split('.').next().unwrap_or(base);
    let mut end = stem.len().min(15);
    while !stem.is_char_boundary(end) {
        end -= 1;
    }
    stem[..end].to_string()
}
