//! Loading an object into a session: its maps are created in shared memory (initial data,
//! map-in-map and prog-array slots filled in; `LIBBPF_PIN_BY_NAME` maps reused from the
//! session's pins or pinned there, as libbpf does under /sys/fs/bpf), its BTF stored, its
//! programs recorded with map references by session map id, and prepared to run in this
//! process. Programs named by a statically initialised prog array come with the programs
//! asked for; [`prepare_tail_targets`] prepares them where only linked programs run (the
//! agent). Agents report how each link fared ([`report_attach`], [`attach_reports`]).
//!
//! Refused as the kernel refuses them, naming the map or program: kernel-only program kinds,
//! map types or flags userbpf lacks, `numa_node` not online (with `BPF_F_NUMA_NODE`), a pinned
//! map that does not match its definition, a prog-array slot naming a program left unloaded,
//! GPL-only helpers called by a program whose license is not GPL-compatible, and userbpf's own
//! helpers in a program the kernel would run ([`check_kernel_helpers`]).

use std::sync::Arc;

use userbpf_isa::*;
use userbpf_maps::{BPF_ANY, Map, MapSpec, MapType};
use userbpf_object::{InitSlot, MapDef, Object, ProgramKind, ProgramSpec};
use userbpf_vm::HelperRegistry;

use crate::context::CpuSlots;
use crate::program::{Engine, LoadedProgram, PrepareError};
use crate::session::{MapRecord, ProgRecord, Session, SessionError};

/// Why an object could not be loaded; names the object and the map or program.
#[derive(Debug, thiserror::Error)]
pub enum LoadObjectError {
    #[error("{object}: map `{map}`: {why}")]
    Map { object: String, map: String, why: String },
    #[error("{object}: program `{prog}` (section {section}): {why}")]
    Program { object: String, prog: String, section: String, why: String },
    #[error("{object}: {why}")]
    Other { object: String, why: String },
}

/// A map of a loaded object.
pub struct LoadedMap {
    pub record: MapRecord,
    pub map: Arc<Map>,
    pub def: MapDef,
    /// A pinned map (`LIBBPF_PIN_BY_NAME`) found in the session and reused, not created.
    pub reused: bool,
}

/// An object loaded into a session and prepared in this process.
pub struct LoadedObject {
    pub object: Object,
    pub btf_id: Option<u32>,
    pub maps: Vec<LoadedMap>,
    pub programs: Vec<(ProgRecord, Arc<LoadedProgram>)>,
}

impl LoadedObject {
    pub fn map(&self, name: &str) -> Option<&LoadedMap> {
        self.maps.iter().find(|m| m.def.name == name)
    }
    pub fn program(&self, name: &str) -> Option<&Arc<LoadedProgram>> {
        self.programs.iter().find(|(r, _)| r.name == name).map(|(_, p)| p)
    }
}

/// What to load.
pub struct LoadOptions<'a> {
    pub engine: Engine,
    pub helpers: Arc<HelperRegistry>,
    /// Load only these programs (by function name); `None`: every autoload program.
    pub only: Option<&'a [String]>,
}

/// The kernel's program type name for a section kind (what `bpftool prog` shows).
pub fn prog_type_name(kind: &ProgramKind) -> &'static str {
    match kind {
        ProgramKind::Uprobe { .. } | ProgramKind::Usdt { .. } => "kprobe",
        ProgramKind::Tracepoint { .. } => "tracepoint",
        ProgramKind::RawTracepoint { .. } => "raw_tracepoint",
        ProgramKind::KernelOnly { .. } => "kernel",
        ProgramKind::Unknown => "unspec",
    }
}

fn spec_of(def: &MapDef) -> Result<MapSpec, String> {
    let map_type = MapType::from_u32(def.map_type).ok_or_else(|| {
        format!(
            "map type {} ({}) is not supported by userbpf",
            def.map_type,
            userbpf_object::map_type_name(def.map_type).unwrap_or("unknown")
        )
    })?;
    Ok(MapSpec {
        map_type,
        key_size: def.key_size,
        value_size: def.value_size,
        max_entries: def.max_entries,
        map_flags: def.map_flags,
        map_extra: def.map_extra,
        name: def.name.clone(),
    })
}

/// libbpf's default pin root: `LIBBPF_PIN_BY_NAME` maps are pinned at `PIN_ROOT/NAME`.
pub const PIN_ROOT: &str = "/sys/fs/bpf";

/// The session file recording a pin at absolute path `path` (`/sys/fs/bpf/NAME`): in the
/// session's `pins/`, named by the path without its leading `/`, bytes other than
/// alphanumerics, `.`, `_` and `-` as `%xx`, holding `map ID` (the layout of the syscall
/// server's BPF_OBJ_PIN, so that a loader's BPF_OBJ_GET finds what an object pinned).
fn pin_file(session: &Session, path: &str) -> std::path::PathBuf {
    session.layout().pin(path.as_bytes())
}

/// The map pinned at `path` in `session`, if any, when it matches `spec` as libbpf's
/// `map_is_reuse_compat` requires (type, key and value sizes, max_entries, flags, map_extra).
fn reuse_pinned(session: &Session, path: &str, spec: &MapSpec) -> Result<Option<(MapRecord, Map)>, String> {
    let Ok(text) = std::fs::read_to_string(pin_file(session, path)) else { return Ok(None) };
    let id = match text.trim().split_once(' ') {
        Some(("map", id)) => {
            id.parse::<u32>().map_err(|_| format!("the pin at {path} is corrupt ({:?})", text.trim()))?
        }
        _ => return Err(format!("{path} is pinned, but not to a map ({:?})", text.trim())),
    };
    let Some(record) = session.maps().map_err(|e| e.to_string())?.into_iter().find(|r| r.id == id) else {
        // A pin left by a map that is gone: pin anew.
        return Ok(None);
    };
    let map = session.open_map(id).map_err(|e| format!("opening the map pinned at {path} (id {id}): {e}"))?;
    let have = map.spec();
    let mut diffs = Vec::new();
    if have.map_type != spec.map_type {
        diffs.push(format!("type {} != {}", have.map_type.name(), spec.map_type.name()));
    }
    for (what, a, b) in [
        ("key_size", have.key_size, spec.key_size),
        ("value_size", have.value_size, spec.value_size),
        ("max_entries", have.max_entries, spec.max_entries),
        ("map_flags", have.map_flags, spec.map_flags),
    ] {
        if a != b {
            diffs.push(format!("{what} {a:#x} != {b:#x}"));
        }
    }
    if have.map_extra != spec.map_extra {
        diffs.push(format!("map_extra {:#x} != {:#x}", have.map_extra, spec.map_extra));
    }
    if !diffs.is_empty() {
        return Err(format!(
            "the map pinned at {path} (id {id}) does not match this definition ({}): libbpf refuses to reuse it",
            diffs.join(", ")
        ));
    }
    Ok(Some((record, map)))
}

/// Pins map `id` at `path` (see [`pin_file`]).
fn pin_map(session: &Session, path: &str, id: u32) -> std::io::Result<()> {
    let file = pin_file(session, path);
    if let Some(d) = file.parent() {
        std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700).create(d)?;
    }
    let tmp = file.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, format!("map {id}\n"))?;
    std::fs::rename(&tmp, &file)
}

/// The kernel's check of `numa_node` (used only with `BPF_F_NUMA_NODE`): an online node.
fn check_numa_node(def: &MapDef) -> Result<(), String> {
    const BPF_F_NUMA_NODE: u32 = 1 << 2;
    if def.map_flags & BPF_F_NUMA_NODE == 0 {
        return Ok(());
    }
    let online = std::fs::read_to_string("/sys/devices/system/node/online").unwrap_or_else(|_| "0".into());
    let node = def.numa_node;
    let is_online = online.trim().split(',').any(|r| match r.split_once('-') {
        Some((a, b)) => a.parse::<u32>().is_ok_and(|a| a <= node) && b.parse::<u32>().is_ok_and(|b| node <= b),
        None => r.parse::<u32>() == Ok(node),
    });
    if !is_online {
        return Err(format!(
            "numa_node {node} (with BPF_F_NUMA_NODE) is not an online NUMA node (online: {})",
            online.trim()
        ));
    }
    Ok(())
}

/// Loads `object` into `session`.
pub fn load_object(
    session: &Session,
    object: Object,
    opts: &LoadOptions<'_>,
    slots: Arc<CpuSlots>,
) -> Result<LoadedObject, LoadObjectError> {
    let mut pinned: Vec<(String, u32)> = Vec::new();
    let r = load_object_pinning(session, object, opts, slots, &mut pinned);
    if r.is_err() {
        // As libbpf: a failed load unpins the maps it pinned (not those it reused).
        for (path, id) in &pinned {
            let _ = unpin(session, path, *id);
        }
    }
    r
}

fn load_object_pinning(
    session: &Session,
    object: Object,
    opts: &LoadOptions<'_>,
    slots: Arc<CpuSlots>,
    pinned: &mut Vec<(String, u32)>,
) -> Result<LoadedObject, LoadObjectError> {
    let oname = object.file.clone();
    let other = |why: String| LoadObjectError::Other { object: oname.clone(), why };
    let btf_id = match &object.btf {
        Some(btf) => {
            Some(session.add_btf(&btf.to_bytes()).map_err(|e| other(format!("storing BTF in the session: {e}")))?)
        }
        None => None,
    };

    // trace_printk lines go to the session's trace pipe.
    let pipe = session.trace_pipe().map_err(|e| other(format!("opening the session's trace pipe: {e}")))?;
    crate::helpers::printf::set_trace_sink(Some(Arc::new(pipe))).map_err(|e| other(e.to_string()))?;

    // Maps, in definition order (inner-map templates are not created: slots name real maps).
    let mut maps: Vec<LoadedMap> = Vec::with_capacity(object.maps.len());
    for def in &object.maps {
        let map_err = |why: String| LoadObjectError::Map { object: oname.clone(), map: def.name.clone(), why };
        let spec = spec_of(def).map_err(map_err)?;
        check_numa_node(def).map_err(map_err)?;
        // LIBBPF_PIN_BY_NAME: reuse the map pinned at the pin path, or create it and pin it
        // there (libbpf's bpf_object__reuse_map, then bpf_map__pin).
        let pin_path = (def.pinning == userbpf_object::maps::PIN_BY_NAME).then(|| format!("{PIN_ROOT}/{}", def.name));
        if let Some(path) = &pin_path
            && let Some((record, map)) = reuse_pinned(session, path, &spec).map_err(map_err)?
        {
            let map = Arc::new(map);
            if !crate::helpers::maps::register_map(record.id, map.clone()) {
                return Err(map_err(crate::helpers::maps::full_message()));
            }
            maps.push(LoadedMap { record, map, def: def.clone(), reused: true });
            continue;
        }
        let record = MapRecord {
            id: 0,
            name: def.name.clone(),
            btf_id,
            key_type_id: def.key_type_id,
            value_type_id: def.value_type_id,
            object: Some(oname.clone()),
            pinned: pin_path.clone(),
        };
        let (record, map) = session.create_map(&spec, record).map_err(|e| map_err(e.to_string()))?;
        if let Some(path) = &pin_path {
            // The record says pinned from its creation: undo that too if pinning fails.
            pinned.push((path.clone(), record.id));
            pin_map(session, path, record.id).map_err(|e| map_err(format!("pinning it at {path}: {e}")))?;
        }
        if let Some(init) = &def.initial {
            let key = 0u32.to_ne_bytes();
            let mut value = init.clone();
            value.resize(def.value_size as usize, 0);
            map.update_elem(&key, &value, BPF_ANY).map_err(|e| map_err(format!("writing its initial value: {e}")))?;
            if def.is_readonly() {
                // As libbpf freezes `.rodata` and `.kconfig`: no system call writes them any
                // more, and the verifier takes their values as constants.
                std::fs::write(session.layout().map_frozen(record.id), b"")
                    .map_err(|e| map_err(format!("freezing it: {e}")))?;
            }
        }
        let map = Arc::new(map);
        if !crate::helpers::maps::register_map(record.id, map.clone()) {
            return Err(map_err(crate::helpers::maps::full_message()));
        }
        maps.push(LoadedMap { record, map, def: def.clone(), reused: false });
    }
    // Map-in-map slots (not in a reused pinned map, as libbpf).
    for (i, def) in object.maps.iter().enumerate() {
        if maps[i].reused {
            continue;
        }
        for (slot, init) in def.init_slots.iter().enumerate() {
            if let Some(InitSlot::Map(j)) = init {
                let inner = maps.get(*j).ok_or_else(|| {
                    other(format!("map `{}` slot {slot} names map #{j}, which does not exist", def.name))
                })?;
                let id = inner.record.id;
                maps[i].map.update_elem(&(slot as u32).to_ne_bytes(), &id.to_ne_bytes(), BPF_ANY).map_err(|e| {
                    LoadObjectError::Map {
                        object: oname.clone(),
                        map: def.name.clone(),
                        why: format!("setting slot {slot}: {e}"),
                    }
                })?;
            }
        }
    }

    // Programs.
    let ids: Vec<u32> = maps.iter().map(|m| m.record.id).collect();
    let resolver: Vec<(u32, Arc<Map>)> = maps.iter().map(|m| (m.record.id, m.map.clone())).collect();
    let mut programs = Vec::new();
    let mut prog_ids: Vec<Option<u32>> = vec![None; object.programs.len()];
    let wanted = wanted_programs(&object, opts.only);
    for (pi, spec) in object.programs.iter().enumerate() {
        if !wanted[pi] {
            continue;
        }
        let perr = |why: String| LoadObjectError::Program {
            object: oname.clone(),
            prog: spec.name.clone(),
            section: spec.section.clone(),
            why,
        };
        if let ProgramKind::KernelOnly { kind } = &spec.kind {
            check_kernel_helpers(&spec.insns).map_err(perr)?;
            return Err(perr(format!(
                "{kind} programs run only in the kernel; userbpf runs user-space programs (uprobe, uretprobe, usdt, syscall tracepoints) and cannot hand this one to the kernel yet"
            )));
        }
        check_license(spec, &object.license, &opts.helpers).map_err(perr)?;
        let insns = rewrite_map_refs(spec, &ids).map_err(perr)?;
        let inner = |m: &Map| {
            maps.iter()
                .find(|lm| std::ptr::eq(&*lm.map, m))
                .and_then(|lm| lm.def.inner.as_deref())
                .and_then(|d| spec_of(d).ok())
        };
        crate::verify::check(
            Some(session),
            &crate::verify::Candidate {
                name: &spec.name,
                insns: &insns,
                prog_type: prog_type_name(&spec.kind),
                section: &spec.section,
                license: &object.license,
            },
            &resolver.as_slice(),
            &inner,
        )
        .map_err(perr)?;
        let record = ProgRecord {
            id: 0,
            name: spec.name.clone(),
            section: spec.section.clone(),
            prog_type: prog_type_name(&spec.kind).to_string(),
            insns_hex: encode(&insns).iter().map(|b| format!("{b:02x}")).collect(),
            map_ids: referenced_maps(&insns),
            btf_id,
            object: Some(oname.clone()),
            license: object.license.clone(),
        };
        let record = session.add_prog(record).map_err(|e| perr(format!("recording it in the session: {e}")))?;
        let prog = LoadedProgram::prepare(
            record.id,
            &spec.name,
            &insns,
            opts.helpers.clone(),
            &resolver.as_slice(),
            opts.engine,
            slots.clone(),
        )
        .map_err(|e| perr(explain(e)))?;
        prog_ids[pi] = Some(record.id);
        let prog = Arc::new(prog);
        if !crate::program_table::register(prog.clone()) {
            return Err(perr(crate::program_table::full_message(&record.name)));
        }
        programs.push((record, prog));
    }
    // Prog-array slots (libbpf fills them once the programs are loaded, and fails the load
    // when a slot names a program that was not loaded).
    for (i, def) in object.maps.iter().enumerate() {
        for (slot, init) in def.init_slots.iter().enumerate() {
            if let Some(InitSlot::Program(p)) = init {
                let Some(Some(id)) = prog_ids.get(*p) else {
                    if opts.only.is_some() {
                        // A map no loaded program uses (the slots of those that are used were
                        // loaded with them, see `wanted_programs`).
                        continue;
                    }
                    let name = object.programs.get(*p).map_or("?", |s| s.name.as_str());
                    let section = object.programs.get(*p).map_or("?", |s| s.section.as_str());
                    return Err(LoadObjectError::Map {
                        object: oname.clone(),
                        map: def.name.clone(),
                        why: format!(
                            "`.values` slot {slot} names program `{name}` (section ?{section}), which is not loaded: its section starts with `?` (no autoload)"
                        ),
                    });
                };
                maps[i].map.update_elem(&(slot as u32).to_ne_bytes(), &id.to_ne_bytes(), BPF_ANY).map_err(|e| {
                    LoadObjectError::Map {
                        object: oname.clone(),
                        map: def.name.clone(),
                        why: format!("setting slot {slot}: {e}"),
                    }
                })?;
            }
        }
    }
    Ok(LoadedObject { object, btf_id, maps, programs })
}

/// Which programs of `object` to load: the autoload ones (`only` = `None`) or the named ones,
/// and in both cases every program a loaded program can reach through the `.values` slots
/// of a statically initialised prog array it references (so that its tail calls land).
fn wanted_programs(object: &Object, only: Option<&[String]>) -> Vec<bool> {
    let mut wanted: Vec<bool> = object
        .programs
        .iter()
        .map(|p| match only {
            Some(names) => names.contains(&p.name),
            None => p.autoload,
        })
        .collect();
    if only.is_none() {
        // As libbpf: autoload decides; a slot naming a program left out is an error (below).
        return wanted;
    }
    let mut work: Vec<usize> = (0..wanted.len()).filter(|&i| wanted[i]).collect();
    while let Some(pi) = work.pop() {
        for m in referenced_maps(&object.programs[pi].insns) {
            let Some(def) = object.maps.get(m as usize) else { continue };
            for slot in def.init_slots.iter().flatten() {
                if let InitSlot::Program(t) = slot
                    && *t < wanted.len()
                    && !wanted[*t]
                {
                    wanted[*t] = true;
                    work.push(*t);
                }
            }
        }
    }
    wanted
}

/// Helpers the kernel lets only GPL-compatible programs call (`gpl_only` in their
/// `bpf_func_proto`), among those a tracing program may call: probe_read (4), trace_printk
/// (6), perf_event_read (22), perf_event_output (25), get_stackid (27), get_current_task (35),
/// probe_write_user (36), probe_read_str (45), perf_event_read_value (55), get_stack (67),
/// probe_read_user (112), probe_read_kernel (113), probe_read_user_str (114),
/// probe_read_kernel_str (115), get_current_task_btf (158), snprintf (165), the timer
/// helpers (169-172), get_func_ip (173), task_pt_regs (175), get_branch_snapshot (176),
/// trace_vprintk (177), copy_from_user_task (191). Checked against the running kernel's
/// verifier (a kprobe program of license "Proprietary" calling each id; 36 from the kernel
/// source, this kernel refuses it for kprobes altogether).
const GPL_ONLY_HELPERS: &[u32] =
    &[4, 6, 22, 25, 27, 35, 36, 45, 55, 67, 112, 113, 114, 115, 158, 165, 169, 170, 171, 172, 173, 175, 176, 177, 191];

/// The kernel's `license_is_gpl_compatible`.
fn license_is_gpl_compatible(license: &str) -> bool {
    matches!(license, "GPL" | "GPL v2" | "GPL and additional rights" | "Dual BSD/GPL" | "Dual MIT/GPL" | "Dual MPL/GPL")
}

/// For a program the kernel is to run: refuses calls to userbpf's own helpers (ids from
/// [`userbpf_isa::helper_names::USERBPF_HELPER_BASE`], the io_uring helpers), which exist
/// only in user space, naming the first one and its instruction.
pub fn check_kernel_helpers(insns: &[Insn]) -> Result<(), String> {
    let mut pc = 0;
    while pc < insns.len() {
        let insn = &insns[pc];
        let id = insn.imm as u32;
        if insn.op == OP_CALL && insn.src == 0 && userbpf_isa::helper_names::is_userbpf_helper(id) {
            let name = userbpf_isa::helper_names::helper_name(id).unwrap_or("unknown");
            return Err(format!(
                "instruction {pc}: helper bpf_{name} (id {id}) is a userbpf helper and runs only in user space; the kernel cannot run this program"
            ));
        }
        pc += if insn.is_lddw() { 2 } else { 1 };
    }
    Ok(())
}

/// The verifier's license check: a program whose license is not GPL-compatible may not call
/// a GPL-only helper ("cannot call GPL-restricted function from non-GPL compatible
/// program").
fn check_license(spec: &ProgramSpec, license: &str, helpers: &HelperRegistry) -> Result<(), String> {
    if license_is_gpl_compatible(license) {
        return Ok(());
    }
    let mut pc = 0;
    while pc < spec.insns.len() {
        let insn = &spec.insns[pc];
        if insn.op == OP_CALL && insn.src == 0 && GPL_ONLY_HELPERS.contains(&(insn.imm as u32)) {
            let id = insn.imm as u32;
            let name = helpers.get(id).map_or_else(|| format!("#{id}"), |h| format!("bpf_{}#{id}", h.name));
            let shown =
                if license.is_empty() { "no license section".to_string() } else { format!("license \"{license}\"") };
            return Err(format!(
                "instruction {pc}: cannot call GPL-restricted function {name} from a program that is not GPL-compatible ({shown}; the kernel refuses it too)"
            ));
        }
        pc += if insn.is_lddw() { 2 } else { 1 };
    }
    Ok(())
}

/// Replaces object map indices with session map ids in `lddw` map references.
fn rewrite_map_refs(spec: &ProgramSpec, ids: &[u32]) -> Result<Vec<Insn>, String> {
    let mut insns = spec.insns.clone();
    for (pc, insn) in insns.iter_mut().enumerate() {
        if insn.is_lddw() && (insn.src == BPF_PSEUDO_MAP_IDX || insn.src == BPF_PSEUDO_MAP_IDX_VALUE) {
            let id = ids.get(insn.imm as u32 as usize).ok_or_else(|| {
                format!("instruction {pc} refers to map #{}, which the object does not define", insn.imm)
            })?;
            insn.imm = *id as i32;
        }
    }
    Ok(insns)
}

fn referenced_maps(insns: &[Insn]) -> Vec<u32> {
    let mut v: Vec<u32> = insns
        .iter()
        .filter(|i| i.is_lddw() && (i.src == BPF_PSEUDO_MAP_IDX || i.src == BPF_PSEUDO_MAP_IDX_VALUE))
        .map(|i| i.imm as u32)
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

fn explain(e: PrepareError) -> String {
    let s = e.to_string();
    if s.contains(&format!("unknown helper id {}", userbpf_object::CORE_POISON_HELPER)) {
        return format!("{s} (a CO-RE relocation could not be resolved and libbpf-style poisoned this call)");
    }
    s
}

/// Whether a program calls `bpf_trace_printk` (helper 6) or `bpf_trace_vprintk` (177).
fn calls_trace_printk(insns: &[userbpf_isa::Insn]) -> bool {
    insns.iter().any(|i| i.op == userbpf_isa::insn::OP_CALL && i.src == 0 && (i.imm == 6 || i.imm == 177))
}

/// Prepares a program recorded in `session` (by a loader, possibly another process) to run in
/// this process: opens the maps it references and compiles it.
pub fn prepare_record(
    session: &Session,
    record: &ProgRecord,
    helpers: Arc<HelperRegistry>,
    engine: Engine,
    slots: Arc<CpuSlots>,
) -> Result<LoadedProgram, String> {
    let bytes =
        userbpf_isa::parse_hex(&record.insns_hex).map_err(|e| format!("program {} in the session: {e}", record.id))?;
    let insns = userbpf_isa::decode(&bytes).map_err(|e| format!("program {} in the session: {e}", record.id))?;
    if calls_trace_printk(&insns) && !crate::helpers::has_trace_sink() {
        // Its lines go to the session's trace pipe (opened by the first program that prints,
        // so processes whose programs never print hold no descriptor for it).
        let pipe =
            session.trace_pipe().map_err(|e| format!("program `{}`: the session's trace pipe: {e}", record.name))?;
        crate::helpers::set_trace_sink(Some(Arc::new(pipe))).map_err(|e| format!("program `{}`: {e}", record.name))?;
    }
    let mut maps: Vec<(u32, Arc<Map>)> = Vec::new();
    for &id in &record.map_ids {
        let (map, key) = open_shared(session, id).map_err(|e| match e {
            // The other errors name the map already.
            SessionError::Map(m) => format!("map {id}: {m}"),
            e => e.to_string(),
        })?;
        if !crate::helpers::maps::register_map_in(key, id, map.clone()) {
            return Err(format!("program `{}`: map {id}: {}", record.name, crate::helpers::maps::full_message()));
        }
        maps.push((id, map));
    }
    crate::verify::check(
        Some(session),
        &crate::verify::Candidate {
            name: &record.name,
            insns: &insns,
            prog_type: &record.prog_type,
            section: &record.section,
            license: &record.license,
        },
        &maps.as_slice(),
        &|m| crate::verify::inner_from_slots(session, m),
    )?;
    LoadedProgram::prepare(record.id, &record.name, &insns, helpers, &maps.as_slice(), engine, slots)
        .map_err(|e| format!("program `{}` (id {}): {}", record.name, record.id, explain(e)))
}

/// A session map opened in this process: by session directory and id, with the identity
/// (device, inode) of the file it was opened from and its session key for the helpers'
/// registry (computed where it was opened: the key is read through the opening thread's
/// descriptor, see `session_key_of`).
struct OpenedMap {
    dir: std::path::PathBuf,
    id: u32,
    file: (u64, u64),
    map: Arc<Map>,
    key: u64,
}

/// The session maps this process opened for the programs it prepared ([`open_shared`]).
static OPENED: std::sync::Mutex<Vec<OpenedMap>> = std::sync::Mutex::new(Vec::new());

/// Map `id` of `session`, opened once per process: every program prepared here that uses it
/// shares one opening (one mapping, one entry of the helpers' registry, whose maps stay
/// mapped while the process lives). An opening is reused only while the session's file is
/// the same one (a session made again under the same name numbers its maps from 1 again).
/// Returns the map and its session key.
fn open_shared(session: &Session, id: u32) -> Result<(Arc<Map>, u64), SessionError> {
    use std::os::unix::fs::MetadataExt;
    let path = session.map_path(id);
    let file = || std::fs::metadata(&path).map(|m| (m.dev(), m.ino())).ok();
    let dir = session.dir().to_path_buf();
    let mut opened = OPENED.lock().unwrap_or_else(|e| e.into_inner());
    // A process that cannot stat the file (it reaches the session through the broker) opens
    // the map each time.
    let before = file();
    if let Some(f) = before
        && let Some(o) = opened.iter().find(|o| o.id == id && o.file == f && o.dir == dir)
    {
        return Ok((o.map.clone(), o.key));
    }
    // Every hit that uses the map reads its descriptor: with the hit path's other objects.
    let map = userbpf_arena::scope(|| session.open_map(id).map(Arc::new))?;
    let key = crate::helpers::maps::session_key_of(&map);
    // Kept only if the file opened is the one looked for (not replaced meanwhile).
    if let Some(f) = before.filter(|f| file() == Some(*f)) {
        opened.retain(|o| !(o.id == id && o.dir == dir));
        opened.push(OpenedMap { dir, id, file: f, map: map.clone(), key });
    }
    Ok((map, key))
}

/// Prepares, in this process, the programs `record` can tail-call: those in the prog arrays
/// it references (and, in turn, theirs), which a process that runs only linked programs
/// would otherwise not have (a tail call to a program this process lacks falls through).
/// Programs already in this process's table ([`crate::programs`]) are skipped; the new ones
/// are registered there and returned with their ids. The prog arrays are read as they are
/// now: a program put in one later is found when this is called again.
pub fn prepare_tail_targets(
    session: &Session,
    record: &ProgRecord,
    helpers: Arc<HelperRegistry>,
    engine: Engine,
    slots: Arc<CpuSlots>,
) -> Result<Vec<(u32, Arc<LoadedProgram>)>, String> {
    let mut out: Vec<(u32, Arc<LoadedProgram>)> = Vec::new();
    let mut records: Option<Vec<ProgRecord>> = None;
    let mut seen_maps: Vec<u32> = Vec::new();
    let mut work: Vec<Vec<u32>> = vec![record.map_ids.clone()];
    while let Some(map_ids) = work.pop() {
        for id in map_ids {
            if seen_maps.contains(&id) {
                continue;
            }
            seen_maps.push(id);
            let opened;
            let map: &Map = match crate::helpers::maps::map_by_id(id) {
                Some(m) => m,
                None => match session.open_map(id) {
                    Ok(m) => {
                        opened = m;
                        &opened
                    }
                    Err(_) => continue,
                },
            };
            if map.map_type() != MapType::BPF_MAP_TYPE_PROG_ARRAY {
                continue;
            }
            for slot in 0..map.spec().max_entries {
                let mut v = [0u8; 4];
                if map.lookup_elem(&slot.to_ne_bytes(), &mut v).is_err() {
                    continue;
                }
                let target = u32::from_ne_bytes(v);
                if target == 0 || crate::program_table::get(target).is_some() || out.iter().any(|(i, _)| *i == target) {
                    continue;
                }
                let all = match &records {
                    Some(r) => r,
                    None => {
                        records.insert(session.progs().map_err(|e| format!("reading the session's programs: {e}"))?)
                    }
                };
                let Some(rec) = all.iter().find(|p| p.id == target).cloned() else { continue };
                let prog = prepare_record(session, &rec, helpers.clone(), engine, slots.clone())
                    .map_err(|e| format!("tail call target in slot {slot} of prog array {id}: {e}"))?;
                let prog = userbpf_arena::scope(|| Arc::new(prog));
                if !crate::program_table::register(prog.clone()) {
                    return Err(crate::program_table::full_message(&rec.name));
                }
                work.push(rec.map_ids.clone());
                out.push((target, prog));
            }
        }
    }
    Ok(out)
}

/// How a link fared in one process, as its agent reported it (see [`report_attach`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachReport {
    pub link: u32,
    pub pid: u32,
    /// `None`: attached; otherwise why not.
    pub error: Option<String>,
}

/// Set (to `1`) in the environment of a command whose loader reads the attach reports
/// (`userbpf run` sets it for its command); without it [`report_attach`] writes nothing, so
/// that long-lived sessions of many processes (`userbpf start`) collect no files.
pub const ATTACH_REPORTS_ENV: &str = "USERBPF_ATTACH_REPORTS";

/// Records in `session` that this process attached link `link` (`Ok`) or could not
/// (`Err(reason)`), for the loader that made the link (`userbpf run` fails on such an
/// error), when [`ATTACH_REPORTS_ENV`] asks for it. Best effort: a report that cannot be
/// written is lost, the link's fate unchanged.
pub fn report_attach(session: &Session, link: u32, result: Result<(), &str>) {
    if std::env::var_os(ATTACH_REPORTS_ENV).is_none_or(|v| v != "1") {
        return;
    }
    let l = session.layout();
    let _ = crate::session::layout::make_dir(&l.attach_dir());
    let pid = std::process::id();
    let text = match result {
        Ok(()) => "ok\n".to_string(),
        Err(why) => format!("error\n{why}\n"),
    };
    let _ = crate::session::layout::write_atomic(&l.attach_report(link, pid), text.as_bytes());
}

/// Every attach report of the session in directory `dir` (see [`report_attach`]), by link
/// then pid.
pub fn attach_reports(dir: &std::path::Path) -> Vec<AttachReport> {
    let Ok(rd) = std::fs::read_dir(crate::session::Layout::new(dir).attach_dir()) else { return Vec::new() };
    let mut out: Vec<AttachReport> = rd
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let (link, pid) = crate::session::Layout::parse_attach_report(&name)?;
            let text = std::fs::read_to_string(e.path()).ok()?;
            let error = match text.split_once('\n') {
                Some(("ok", _)) => None,
                Some(("error", why)) => Some(why.trim_end().to_string()),
                _ => return None,
            };
            Some(AttachReport { link, pid, error })
        })
        .collect();
    out.sort_by_key(|r| (r.link, r.pid));
    out
}

/// Removes the pins `object` made or reused (`LIBBPF_PIN_BY_NAME`), as `bpf_object__unpin_maps`
/// does: for a session nobody else can reach (`userbpf run`'s own), which a pin would
/// otherwise keep after everyone left.
pub fn unpin_maps(session: &Session, object: &LoadedObject) -> std::io::Result<()> {
    for m in object.maps.iter().filter(|m| m.def.pinning == userbpf_object::maps::PIN_BY_NAME) {
        unpin(session, &format!("{PIN_ROOT}/{}", m.def.name), m.record.id)?;
    }
    Ok(())
}

/// Removes the pin at `path` and the pinned mark of map `id`'s record.
fn unpin(session: &Session, path: &str, id: u32) -> std::io::Result<()> {
    match std::fs::remove_file(pin_file(session, path)) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let rec_path = session.layout().map_record(id);
    if let Ok(text) = std::fs::read(&rec_path)
        && let Ok(mut rec) = serde_json::from_slice::<MapRecord>(&text)
        && rec.pinned.is_some()
    {
        rec.pinned = None;
        crate::session::layout::write_atomic(
            &rec_path,
            &serde_json::to_vec_pretty(&rec).map_err(std::io::Error::other)?,
        )?;
    }
    Ok(())
}
