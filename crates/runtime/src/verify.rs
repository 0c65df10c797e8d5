//! The verifier on the load path: every program is checked by [`userbpf_verifier`] with the
//! kernel's rules (as for root: the rules that keep memory safe, without the kernel's
//! information-leak restrictions for unprivileged users) before the JIT or the interpreter
//! sees it. `USERBPF_VERIFY=0` (or `--no-verify`) turns verification off, with a warning on
//! every load; a process that loads a program unverified makes its map helpers distrust key
//! and value pointers from then on (`helpers::maps::distrust_pointers`), since nothing
//! proved them any more.

use userbpf_isa::*;
use userbpf_verifier::{MapInfo, Options, ProgType};

use userbpf_maps::{Map, MapSpec, MapType};

use crate::program::MapResolver;
use crate::session::Session;

/// The verifier's description of a map (not frozen, no inner map: the caller adds those).
pub fn map_info(spec: &MapSpec) -> MapInfo {
    MapInfo {
        name: spec.name.clone(),
        map_type: spec.map_type as u32,
        key_size: spec.key_size,
        value_size: spec.value_size,
        max_entries: spec.max_entries,
        readonly: spec.map_flags & userbpf_maps::BPF_F_RDONLY_PROG != 0,
        frozen: None,
        inner: None,
    }
}

/// The definition of the inner maps of a map of maps, from the first map it holds (the
/// kernel requires all of them to match the template; userbpf keeps no template).
pub fn inner_from_slots(session: &Session, outer: &Map) -> Option<MapSpec> {
    let mut key: Option<Vec<u8>> = None;
    let mut next = vec![0u8; outer.spec().key_size as usize];
    let mut value = vec![0u8; outer.value_buf_size()];
    for _ in 0..outer.spec().max_entries {
        outer.get_next_key(key.as_deref(), &mut next).ok()?;
        if outer.lookup_elem(&next, &mut value).is_ok() && value.len() >= 4 {
            let id = u32::from_ne_bytes([value[0], value[1], value[2], value[3]]);
            if id != 0
                && let Ok(m) = session.open_map(id)
            {
                return Some(m.spec().clone());
            }
        }
        key = Some(next.clone());
    }
    None
}

/// Environment variable: `0` skips verification (for experiments).
pub const VERIFY_ENV: &str = "USERBPF_VERIFY";

/// Whether verification is on (it is unless `USERBPF_VERIFY=0`).
pub fn enabled() -> bool {
    std::env::var(VERIFY_ENV).map_or(true, |v| v != "0")
}

/// Warns, on stderr, that program `name` runs unverified (verification is off); the caller
/// also calls [`crate::helpers::maps::distrust_pointers`] if the program runs in this process.
pub fn warn_unverified(name: &str) {
    eprintln!(
        "userbpf: warning: {VERIFY_ENV}=0: program `{name}` runs unverified; a faulty program can crash the process it runs in"
    );
}

/// The verifier's program type for a kernel program type's name (`kprobe`, `tracepoint`, ...).
pub fn prog_type(name: &str) -> Option<ProgType> {
    Some(match name {
        "kprobe" => ProgType::Kprobe,
        "tracepoint" => ProgType::Tracepoint { record_size: None },
        "raw_tracepoint" => ProgType::RawTracepoint { args: None },
        "perf_event" => ProgType::PerfEvent,
        "syscall" => ProgType::Syscall,
        "socket_filter" => ProgType::SocketFilter,
        _ => return None,
    })
}

/// A program as the loaders hold it, before verification.
#[derive(Clone, Copy)]
pub struct Candidate<'a> {
    /// The program's name, for messages.
    pub name: &'a str,
    /// Its instructions, map references already rewritten to ids.
    pub insns: &'a [Insn],
    /// Its kernel type (`kprobe`, `tracepoint`, `raw_tracepoint`, ...).
    pub prog_type: &'a str,
    /// Its ELF section (`uprobe.w/...` opts in to argument writes).
    pub section: &'a str,
    /// The object's license (GPL-only helpers).
    pub license: &'a str,
}

/// Verifies program `name` of kernel type `prog_type` (`kprobe`, `tracepoint`,
/// `raw_tracepoint`) from section `section` (a `uprobe.w` section may write the argument
/// registers of its context: [`userbpf_object::section::writable_args`]), whose map
/// references are ids `maps` resolves. The error names the
/// instruction and the rule broken (the caller adds the program), followed by the register
/// states there.
///
/// `inner` gives, for a map of maps (by id), the definition of its inner maps. Maps of
/// `session` that are read-only for programs and frozen (`maps/ID.frozen`: `.rodata`,
/// `.kconfig`, BPF_MAP_FREEZE) give their values as constants, as in the kernel.
pub fn check(
    session: Option<&Session>,
    program: &Candidate<'_>,
    maps: &dyn MapResolver,
    inner: &dyn Fn(&Map) -> Option<MapSpec>,
) -> Result<(), String> {
    let Candidate { name, insns, prog_type, section, license } = *program;
    if !enabled() {
        warn_unverified(name);
        crate::helpers::maps::distrust_pointers();
        return Ok(());
    }
    let Some(prog_type) = self::prog_type(prog_type) else {
        return Err(format!("program `{name}`: programs of type {prog_type} cannot be verified"));
    };
    let mut opts = Options::new(prog_type);
    opts.gpl_compatible = userbpf_verifier::helpers::license_is_gpl_compatible(license);
    opts.writable_args = userbpf_object::section::writable_args(section);
    opts.snprintf_format = Some(crate::helpers::printf::snprintf_format_is_valid);
    let mut pc = 0;
    while pc < insns.len() {
        let insn = insns[pc];
        if insn.is_lddw()
            && matches!(
                insn.src,
                BPF_PSEUDO_MAP_IDX | BPF_PSEUDO_MAP_IDX_VALUE | BPF_PSEUDO_MAP_FD | BPF_PSEUDO_MAP_VALUE
            )
        {
            let id = insn.imm as u32;
            if let Some(map) = maps.map(id) {
                let mut info = map_info(map.spec());
                if matches!(map.map_type(), MapType::BPF_MAP_TYPE_ARRAY_OF_MAPS | MapType::BPF_MAP_TYPE_HASH_OF_MAPS) {
                    info.inner = inner(&map).map(|s| Box::new(map_info(&s)));
                }
                if info.readonly
                    && map.map_type() == MapType::BPF_MAP_TYPE_ARRAY
                    && session.is_some_and(|s| s.layout().map_frozen(id).exists())
                {
                    let mut value = vec![0u8; map.value_buf_size()];
                    if map.lookup_elem(&0u32.to_ne_bytes(), &mut value).is_ok() {
                        info.frozen = Some(value);
                    }
                }
                opts.maps.insert(id, info);
            }
        }
        pc += if insn.is_lddw() { 2 } else { 1 };
    }
    userbpf_verifier::verify(insns, &opts).map(|_| ()).map_err(|e| {
        let state =
            e.log.lines().rev().find(|l| l.contains("R10=")).map(|l| format!(" [{}]", l.trim())).unwrap_or_default();
        format!("{e}{state}")
    })
}
