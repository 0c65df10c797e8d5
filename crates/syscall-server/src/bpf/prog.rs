//! Program commands: PROG_LOAD (verified by userbpf's verifier with the kernel's rules, its
//! log returned in `log_buf` as the kernel returns its own, then the VM's load-time checks),
//! PROG_TEST_RUN and PROG_BIND_MAP.

use std::mem::offset_of;
use std::sync::{Arc, Mutex, OnceLock};

use userbpf_isa::helper_names::helper_name;
use userbpf_isa::*;
use userbpf_maps::{ENOTSUPP, Map};
use userbpf_runtime::context::{CpuSlots, RunContext};
use userbpf_runtime::program::MapResolver;
use userbpf_runtime::{Engine, LoadedProgram, ProgRecord};

use super::attr::{self, end_of};
use super::map::{check_name, map_by_id, map_of_fd};
use super::{Attr, read_user, read_user_str, state, write_user};
use crate::error::{Context, Error};
use crate::objects::{self, Kind};

// enum bpf_prog_type values the runtime runs.
pub const BPF_PROG_TYPE_SOCKET_FILTER: u32 = 1;
pub const BPF_PROG_TYPE_KPROBE: u32 = 2;
pub const BPF_PROG_TYPE_TRACEPOINT: u32 = 5;
pub const BPF_PROG_TYPE_PERF_EVENT: u32 = 7;
pub const BPF_PROG_TYPE_RAW_TRACEPOINT: u32 = 17;
pub const BPF_PROG_TYPE_SYSCALL: u32 = 31;

/// The verifier's instruction limit, as its log states it.
const INSN_LIMIT: usize = 1_000_000;
const BPF_LOG_MASK: u32 = 0xf;
const BPF_LOG_FIXED: u32 = 8;
const BPF_LOG_LEVEL2: u32 = 2;
const BPF_LOG_STATS: u32 = 4;

/// The program type's name as the kernel's `bpftool prog` and the session records use it,
/// for the types the runtime runs.
pub fn prog_type_name(t: u32) -> Option<&'static str> {
    Some(match t {
        BPF_PROG_TYPE_SOCKET_FILTER => "socket_filter",
        BPF_PROG_TYPE_KPROBE => "kprobe",
        BPF_PROG_TYPE_TRACEPOINT => "tracepoint",
        BPF_PROG_TYPE_PERF_EVENT => "perf_event",
        BPF_PROG_TYPE_RAW_TRACEPOINT => "raw_tracepoint",
        BPF_PROG_TYPE_SYSCALL => "syscall",
        _ => return None,
    })
}

/// The inverse of [`prog_type_name`] (records written by other loaders too).
pub fn prog_type_of(name: &str) -> u32 {
    match name {
        "socket_filter" => BPF_PROG_TYPE_SOCKET_FILTER,
        "kprobe" => BPF_PROG_TYPE_KPROBE,
        "tracepoint" => BPF_PROG_TYPE_TRACEPOINT,
        "perf_event" => BPF_PROG_TYPE_PERF_EVENT,
        "raw_tracepoint" => BPF_PROG_TYPE_RAW_TRACEPOINT,
        "syscall" => BPF_PROG_TYPE_SYSCALL,
        _ => 0,
    }
}

/// Helpers the kernel gives only to GPL-compatible programs (those the runtime has).
const GPL_ONLY: &[u32] = &[4, 6, 25, 27, 35, 36, 45, 67, 109, 112, 113, 114, 115, 117, 141, 148, 177];

/// The kernel's `license_is_gpl_compatible`.
fn gpl_compatible(license: &[u8]) -> bool {
    matches!(
        license,
        b"GPL" | b"GPL v2" | b"GPL and additional rights" | b"Dual BSD/GPL" | b"Dual MIT/GPL" | b"Dual MPL/GPL"
    )
}

/// What this process knows about a program.
pub struct ProgEntry {
    pub id: u32,
    pub prog_type: u32,
    pub expected_attach_type: u32,
    pub name: String,
    /// The instructions as recorded in the session (map references by id).
    pub insns: Vec<Insn>,
    /// Maps the program uses (referenced, then bound with PROG_BIND_MAP).
    pub map_ids: Mutex<Vec<u32>>,
    pub btf_id: u32,
    pub func_info_rec_size: u32,
    pub func_info: Vec<u8>,
    pub line_info_rec_size: u32,
    pub line_info: Vec<u8>,
    /// CLOCK_BOOTTIME nanoseconds at load (bpf_prog_info.load_time).
    pub load_time: u64,
    pub uid: u32,
    pub gpl: bool,
    pub tag: [u8; 8],
    /// Prepared on first use in this process (PROG_TEST_RUN).
    loaded: OnceLock<Result<Arc<LoadedProgram>, String>>,
}

impl ProgEntry {
    /// The program prepared to run in this process (interpreter; test runs are one-shot).
    pub fn loaded(&self) -> Result<Arc<LoadedProgram>, String> {
        self.loaded
            .get_or_init(|| {
                let maps: Vec<(u32, Arc<Map>)> = self
                    .map_ids
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .iter()
                    .filter_map(|&id| map_by_id(id).ok().map(|e| (id, e.map.clone())))
                    .collect();
                let slots = slots().map_err(|e| format!("CPU slots: {e}"))?;
                let p = LoadedProgram::prepare(
                    self.id,
                    &self.name,
                    &self.insns,
                    userbpf_runtime::helpers::registry(),
                    &maps.as_slice() as &dyn MapResolver,
                    Engine::Interpreter,
                    slots,
                )
                .map_err(|e| e.to_string())?;
                let p = Arc::new(p);
                if !userbpf_runtime::program_table::register(p.clone()) {
                    return Err(userbpf_runtime::program_table::full_message(&self.name));
                }
                Ok(p)
            })
            .clone()
    }
}

/// The session's CPU slots (shared with the agent and targets).
fn slots() -> Result<Arc<CpuSlots>, String> {
    crate::server::server().slots().map_err(|e| e.reason.into_owned())
}

/// CLOCK_BOOTTIME in nanoseconds (what the kernel's load_time counts from).
fn boottime_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The verifier log of one load: kept whole in memory, written to the caller's buffer as
/// the kernel writes it (NUL-terminated; when it does not fit, `ENOSPC`, keeping the end of
/// the log, or the start with BPF_LOG_FIXED).
pub struct VLog {
    pub level: u32,
    buf: u64,
    size: u32,
    pub text: String,
}

impl VLog {
    /// Validates the log attributes as the kernel's `bpf_verifier_log_attr_valid`.
    pub fn new(level: u32, buf: u64, size: u32) -> Result<VLog, Error> {
        // As the kernel's bpf_verifier_log_attr_valid (6.4 and later): buffer and size
        // together, a buffer needs a level, a level without a buffer only measures the log.
        if (buf != 0) != (size != 0) || (buf != 0 && level == 0) || level & !BPF_LOG_MASK != 0 || size > u32::MAX >> 2 {
            return Err(Error::inval(format!("log_level {level}, log_buf {buf:#x}, log_size {size}: inconsistent")));
        }
        Ok(VLog { level, buf, size, text: String::new() })
    }

    pub fn on(&self) -> bool {
        self.level != 0
    }

    /// Lines already ending in a newline (the verifier's log).
    pub fn text(&mut self, s: &str) {
        if self.on() {
            self.text.push_str(s);
            if !s.is_empty() && !s.ends_with('\n') {
                self.text.push('\n');
            }
        }
    }

    pub fn line(&mut self, s: &str) {
        if self.on() {
            self.text.push_str(s);
            self.text.push('\n');
        }
    }

    /// Copies the log out; `Err(ENOSPC)` when it was truncated. Returns the true size
    /// (with the NUL) for `log_true_size`.
    pub fn finish(&self) -> (u32, Result<(), i32>) {
        if !self.on() {
            return (0, Ok(()));
        }
        let bytes = self.text.as_bytes();
        let true_size = bytes.len() as u32 + 1;
        if self.buf == 0 {
            return (true_size, Ok(()));
        }
        let cap = self.size as usize - 1;
        let (part, full) = if bytes.len() <= cap {
            (bytes, true)
        } else if self.level & BPF_LOG_FIXED != 0 {
            (&bytes[..cap], false)
        } else {
            (&bytes[bytes.len() - cap..], false)
        };
        let mut out = part.to_vec();
        out.push(0);
        if let Err(e) = write_user(self.buf, &out) {
            return (true_size, Err(e));
        }
        (true_size, if full { Ok(()) } else { Err(libc::ENOSPC) })
    }
}

/// One instruction as the verifier's log prints it: `pc: (op) text`.
fn insn_line(insns: &[Insn], pc: usize) -> String {
    let insn = insns[pc];
    if insn.op == OP_CALL && insn.src == 0 {
        let id = insn.imm as u32;
        return match helper_name(id) {
            Some(n) => format!("{pc}: (85) call bpf_{n}#{id}"),
            None => format!("{pc}: (85) call unknown#{id}"),
        };
    }
    format!("{pc}: ({:02x}) {}", insn.op, userbpf_isa::disasm::format_insn(insn, insns.get(pc + 1).copied()))
}

/// The kernel's `bpf_prog_calc_tag`: the first 8 bytes of the SHA-256 of the instructions
/// with the immediates of map-referencing `lddw`s zeroed.
pub fn prog_tag(insns: &[Insn]) -> [u8; 8] {
    let mut v = insns.to_vec();
    let mut pc = 0;
    while pc < v.len() {
        if v[pc].is_lddw() {
            if matches!(
                v[pc].src,
                BPF_PSEUDO_MAP_FD | BPF_PSEUDO_MAP_VALUE | BPF_PSEUDO_MAP_IDX | BPF_PSEUDO_MAP_IDX_VALUE
            ) {
                v[pc].imm = 0;
                if pc + 1 < v.len() {
                    v[pc + 1].imm = 0;
                }
            }
            pc += 2;
        } else {
            pc += 1;
        }
    }
    let d = sha256(&encode(&v));
    d[..8].try_into().expect("8 bytes")
}

/// SHA-256 (FIPS 180-4), for program tags (kernels since 6.18 take the tag from SHA-256;
/// before, from SHA-1).
fn sha256(data: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(data).into()
}

/// Instructions other paths enter: jump targets, subprogram and callback entries.
fn jump_targets(insns: &[Insn]) -> Vec<bool> {
    let mut t = vec![false; insns.len() + 1];
    let mut mark = |to: i64| {
        if to >= 0 && (to as usize) < t.len() {
            t[to as usize] = true;
        }
    };
    for (pc, i) in insns.iter().enumerate() {
        let class = i.op & 0x07;
        if (i.is_lddw() && i.src == BPF_PSEUDO_FUNC) || (i.op == OP_CALL && i.src == BPF_PSEUDO_CALL) {
            mark(pc as i64 + 1 + i.imm as i64);
        } else if (class == BPF_JMP || class == BPF_JMP32) && i.op != OP_CALL && i.op != OP_CALLX && i.op != OP_EXIT {
            let rel = if class == BPF_JMP32 && i.op & 0xf0 == BPF_JA { i.imm as i64 } else { i.off as i64 };
            mark(pc as i64 + 1 + rel);
        }
    }
    t
}

/// The map (session id) whose pointer r1 holds at the helper call at `pc`, when the
/// straight-line code just before the call loads it (`r1 = map ll`, as compilers emit it);
/// None when r1 comes from elsewhere or another path enters in between. What the kernel's
/// `check_map_func_compatibility` looks at for helpers taking a map in r1.
fn r1_map_before(insns: &[Insn], targets: &[bool], pc: usize) -> Option<u32> {
    let mut k = pc;
    while k > 0 {
        if targets[k] {
            return None;
        }
        k -= 1;
        if k > 0 && insns[k - 1].is_lddw() {
            k -= 1;
            let i = insns[k];
            if i.dst == 1 {
                return (i.src == BPF_PSEUDO_MAP_IDX).then_some(i.imm as u32);
            }
            continue;
        }
        let i = insns[k];
        let class = i.op & 0x07;
        let atomic_src = class == BPF_STX && i.op & 0xe0 == 0xc0 && i.src == 1;
        if class == BPF_JMP || class == BPF_JMP32 || class == BPF_LD || atomic_src {
            return None;
        }
        if (class == BPF_ALU || class == BPF_ALU64 || class == BPF_LDX) && i.dst == 1 {
            return None;
        }
    }
    None
}

/// The kernel's `check_map_func_compatibility` for the helpers taking a map in r1, as far as
/// cgroup arrays go: `current_task_under_cgroup` (37) takes nothing else, and they go to no
/// other helper of those (`skb_under_cgroup` takes its map in r2).
fn map_func_compatible(map_type: u32, func: u32) -> bool {
    const CGROUP_ARRAY: u32 = super::map::BPF_MAP_TYPE_CGROUP_ARRAY;
    // Helpers whose r1 is a map (map operations, queue/stack, for_each, ringbuf).
    const R1_MAP: &[u32] = &[1, 2, 3, 87, 88, 89, 130, 131, 134, 164, 195];
    match func {
        37 => map_type == CGROUP_ARRAY,
        f if R1_MAP.contains(&f) => map_type != CGROUP_ARRAY,
        _ => true,
    }
}

/// Why a load stopped: refused by the checks the verifier makes (written into the log, as
/// the verifier writes it), or failed before the verifier ran (no log, as in the kernel).
enum Stop {
    Refused(Refusal),
    Failed(Error),
}

/// A refusal as the verifier logs it: the instruction it is about when the walk reached one,
/// the message, how many instructions were processed, and the errno.
struct Refusal {
    pc: Option<usize>,
    msg: String,
    errno: i32,
    processed: usize,
    /// The verifier's own log of the refusal (it ends with the message).
    log: Option<String>,
}

impl Stop {
    /// Refused before the walk reached an instruction.
    fn refused(errno: i32, msg: impl Into<String>) -> Stop {
        Stop::Refused(Refusal { pc: None, msg: msg.into(), errno, processed: 0, log: None })
    }

    /// Refused at instruction `pc`, `processed` instructions into the walk.
    fn refused_at(pc: usize, processed: usize, errno: i32, msg: impl Into<String>) -> Stop {
        Stop::Refused(Refusal { pc: Some(pc), msg: msg.into(), errno, processed, log: None })
    }
}

impl<E: Into<Error>> From<E> for Stop {
    fn from(e: E) -> Stop {
        Stop::Failed(e.into())
    }
}

impl Refusal {
    /// The refusal in the log: the offending instruction and the reason, then the
    /// verifier's summary line.
    fn log(&self, log: &mut VLog, insns: &[Insn]) {
        if let Some(text) = &self.log {
            log.text(text);
            return;
        }
        if let Some(pc) = self.pc.filter(|&p| p < insns.len()) {
            // The verifier's walk reached the instruction: its state line, then the instruction.
            log.line("0: R1=ctx() R10=fp0");
            let l = insn_line(insns, pc);
            log.line(&l);
        }
        log.line(&self.msg);
        log.line(&format!(
            "processed {} insns (limit {INSN_LIMIT}) max_states_per_insn 0 total_states 0 peak_states 0 mark_read 0",
            self.processed
        ));
    }

    /// The error the loader gets: the errno, the log's message as the reason.
    fn error(&self) -> Error {
        let at = self.pc.map(|p| format!("insn {p}: ")).unwrap_or_default();
        Error::new(self.errno, format!("{at}{}", self.msg))
    }
}

/// What PROG_LOAD checks of its attributes before the verifier runs (no log): the program
/// type's name and the program's name.
fn check_load_attr(at: &attr::ProgLoad) -> Result<(&'static str, String), Error> {
    // Flags the kernel knows: strict/any alignment, test_rnd_hi32, test_state_freq,
    // sleepable, xdp_has_frags, test_reg_invariants.
    const KNOWN_FLAGS: u32 = 1 | 2 | 4 | 8 | 16 | 32 | 128;
    let writable_args = userbpf_runtime::helpers::overrides::BPF_F_USERBPF_WRITABLE_ARGS;
    if at.prog_flags & writable_args != 0 && at.prog_type != BPF_PROG_TYPE_KPROBE {
        return Err(Error::inval(format!(
            "prog_flags {writable_args:#x} (userbpf's writable arguments) is for uprobe programs only"
        )));
    }
    if at.prog_flags & !(KNOWN_FLAGS | writable_args) != 0 {
        return Err(Error::inval(format!("prog_flags {:#x} unknown", at.prog_flags & !KNOWN_FLAGS)));
    }
    let Some(type_name) = prog_type_name(at.prog_type) else {
        // The kernel knows more types (networking, cgroups, LSM, tracing by BTF...), none of
        // which runs in user space: as a kernel built without them, EINVAL.
        return Err(Error::inval(format!("prog_type {}: not a program type that runs in user space", at.prog_type)));
    };
    let name = check_name(&attr::c_name(&at.prog_name), 16)?;
    if at.prog_flags & 16 != 0 {
        return Err(Error::inval(format!("BPF_F_SLEEPABLE: {type_name} programs do not sleep")));
    }
    if at.prog_ifindex != 0 {
        return Err(Error::inval(format!("prog_ifindex {}: no device to offload to", at.prog_ifindex)));
    }
    if at.insn_cnt == 0 || at.insn_cnt as usize > INSN_LIMIT {
        return Err(Error::new(libc::E2BIG, format!("insn_cnt {} (the limit is {INSN_LIMIT})", at.insn_cnt)));
    }
    Ok((type_name, name))
}

/// The program's license string and its instructions, from the loader's memory.
fn read_program(at: &attr::ProgLoad) -> Result<(Vec<u8>, Vec<Insn>), Error> {
    let license = read_user_str(at.license, 128)
        .map_err(|e| if e == libc::EINVAL { libc::EINVAL } else { libc::EFAULT })
        .context(|| "license")?;
    let mut raw = vec![0u8; at.insn_cnt as usize * 8];
    read_user(at.insns, &mut raw).context(|| format!("insns ({} instructions at {:#x})", at.insn_cnt, at.insns))?;
    let insns = decode(&raw).map_err(|e| Error::inval(format!("insns: {e}")))?;
    Ok((license, insns))
}

/// What the checks of a load found: the program's BTF, func and line info, the maps it
/// uses and its tag.
struct Checked {
    btf_id: u32,
    func_info: Vec<u8>,
    line_info: Vec<u8>,
    map_ids: Vec<u32>,
    tag: [u8; 8],
    /// What the verifier found (None when verification is off).
    verified: Option<Verified>,
}

/// An accepted program's verification: the verifier's statistics and log, and its time.
struct Verified {
    stats: userbpf_verifier::Stats,
    usec: u128,
}

/// BTF-attached programs (fentry/fexit, freplace) and in-kernel CO-RE relocations: refused.
fn check_attach_and_relocs(at: &attr::ProgLoad) -> Result<(), Stop> {
    if at.attach_prog_fd != 0 || at.attach_btf_id != 0 {
        return Err(Stop::refused(
            libc::EINVAL,
            "attach_btf_id and attach_prog_fd are for BTF-attached (fentry/freplace) programs, which userbpf does not run",
        ));
    }
    if at.core_relo_cnt != 0 {
        return Err(Stop::refused(
            libc::EINVAL,
            "in-kernel CO-RE relocations are not supported; relocate in the loader",
        ));
    }
    Ok(())
}

/// The program's BTF (0: none) and its func and line info.
fn read_btf_info(at: &attr::ProgLoad) -> Result<(u32, Vec<u8>, Vec<u8>), Stop> {
    let fd = at.prog_btf_fd;
    let btf_id = if fd != 0 { objects::get_kind(fd, Kind::Btf).context(|| format!("prog_btf_fd {fd}"))?.id } else { 0 };
    if btf_id != 0 && super::kbtf::is_kernel(btf_id) {
        // A program's BTF is its own, never the kernel's (as the kernel answers).
        return Err(Stop::refused(libc::EACCES, "prog_btf_fd is the kernel's BTF, not the program's"));
    }
    let read_info = |rec: u32, ptr: u64, cnt: u32, what: &str| -> Result<Vec<u8>, Stop> {
        if cnt == 0 {
            return Ok(Vec::new());
        }
        if btf_id == 0 {
            return Err(Stop::refused(libc::EINVAL, format!("{what} requires btf")));
        }
        if !(8..=256).contains(&rec) || !rec.is_multiple_of(4) {
            return Err(Stop::refused(libc::EINVAL, format!("invalid {what} rec size {rec}")));
        }
        let mut v = vec![0u8; rec as usize * cnt as usize];
        read_user(ptr, &mut v).map_err(|_| Stop::refused(libc::EINVAL, format!("cannot read {what}")))?;
        Ok(v)
    };
    let func_info = read_info(at.func_info_rec_size, at.func_info, at.func_info_cnt, "func_info")?;
    let line_info = read_info(at.line_info_rec_size, at.line_info, at.line_info_cnt, "line_info")?;
    Ok((btf_id, func_info, line_info))
}

/// Map references by descriptor (`lddw` of a map fd or fd_array index) become references by
/// session map id; returns the maps, in the order first referenced.
fn resolve_maps(insns: &mut [Insn], fd_array: u64) -> Result<Vec<(u32, Arc<Map>)>, Stop> {
    let mut maps: Vec<(u32, Arc<Map>)> = Vec::new();
    let mut pc = 0;
    while pc < insns.len() {
        let insn = insns[pc];
        if insn.op == OP_CALL && insn.src == BPF_PSEUDO_KFUNC_CALL {
            return Err(Stop::refused_at(pc, pc, libc::EINVAL, "calling kernel functions is not allowed"));
        }
        if !insn.is_lddw() {
            pc += 1;
            continue;
        }
        if pc + 1 >= insns.len() {
            return Err(Stop::refused_at(pc, pc, libc::EINVAL, "invalid bpf_ld_imm64 insn"));
        }
        let src = insn.src;
        let fd = match src {
            BPF_PSEUDO_MAP_FD | BPF_PSEUDO_MAP_VALUE => Some(insn.imm),
            BPF_PSEUDO_MAP_IDX | BPF_PSEUDO_MAP_IDX_VALUE => {
                if fd_array == 0 {
                    return Err(Stop::refused_at(pc, pc, libc::EPROTO, "fd_idx without fd_array is invalid"));
                }
                let mut b = [0u8; 4];
                let idx = insn.imm as u32;
                read_user(fd_array + idx as u64 * 4, &mut b).context(|| format!("insn {pc}: fd_array[{idx}]"))?;
                Some(i32::from_ne_bytes(b))
            }
            BPF_PSEUDO_BTF_ID => {
                return Err(Stop::refused_at(
                    pc,
                    pc,
                    libc::EINVAL,
                    "kernel variables (ksyms) do not exist for user-space programs",
                ));
            }
            _ => None,
        };
        if let Some(fd) = fd {
            let e = map_of_fd(fd)
                .map_err(|errno| Stop::refused(errno, format!("fd {fd} is not pointing to valid bpf_map")))?;
            let id = e.map.id();
            insns[pc].src = if matches!(src, BPF_PSEUDO_MAP_FD | BPF_PSEUDO_MAP_IDX) {
                BPF_PSEUDO_MAP_IDX
            } else {
                BPF_PSEUDO_MAP_IDX_VALUE
            };
            insns[pc].imm = id as i32;
            if !maps.iter().any(|(m, _)| *m == id) {
                maps.push((id, e.map.clone()));
            }
        }
        pc += 2;
    }
    Ok(maps)
}

/// The helper calls the verifier would check: known to the runtime, allowed for the
/// license, given a map of a type they take. Calls the verifier can never reach (behind
/// branches on frozen read-only data) are not checked, as in the kernel; such calls to
/// helpers this runtime lacks are replaced, since they never run.
fn check_calls(insns: &mut [Insn], map_ids: &[u32], gpl: bool) -> Result<(), Stop> {
    let registry = userbpf_runtime::helpers::registry();
    let missing = |i: &Insn| i.op == OP_CALL && i.src == 0 && registry.get(i.imm as u32).is_none();
    let mut live: Option<Vec<bool>> = None;
    let reachable = |insns: &[Insn]| {
        let entries: Vec<(u32, Arc<super::MapEntry>)> =
            map_ids.iter().filter_map(|&id| map_by_id(id).ok().map(|e| (id, e))).collect();
        super::dead::reachable(insns, &super::dead::Frozen::of(&entries))
    };
    if insns.iter().any(missing) {
        live = reachable(insns);
        if let Some(live) = &live {
            for pc in 0..insns.len() {
                if !live[pc] && missing(&insns[pc]) {
                    insns[pc] = Insn::new(BPF_ALU64 | BPF_MOV | BPF_K, 0, 0, 0, 0);
                }
            }
        }
    }
    let targets = jump_targets(insns);
    for pc in 0..insns.len() {
        let insn = insns[pc];
        if insn.op != OP_CALL || insn.src != 0 || (pc > 0 && insns[pc - 1].is_lddw()) {
            continue;
        }
        if live.as_ref().is_some_and(|l| !l[pc]) {
            continue;
        }
        let id = insn.imm as u32;
        if registry.get(id).is_none() {
            let msg = match helper_name(id) {
                Some(n) => format!("unknown func bpf_{n}#{id}"),
                None => format!("invalid func unknown#{id}"),
            };
            return Err(Stop::refused_at(pc, pc + 1, libc::EINVAL, msg));
        }
        if !gpl && GPL_ONLY.contains(&id) {
            return Err(Stop::refused_at(
                pc,
                pc + 1,
                libc::EINVAL,
                "cannot call GPL-restricted function from non-GPL compatible program",
            ));
        }
        if let Some(t) = r1_map_before(insns, &targets, pc).and_then(|m| map_by_id(m).ok()).map(|e| e.map_type)
            && !map_func_compatible(t, id)
        {
            // Only where the verifier goes (the walk above was only made if a helper
            // is missing).
            if live.is_none() {
                live = reachable(insns);
            }
            if live.as_ref().is_some_and(|l| !l[pc]) {
                continue;
            }
            let msg = format!("cannot pass map_type {t} into func bpf_{}#{id}", helper_name(id).unwrap_or("unknown"));
            return Err(Stop::refused_at(pc, pc + 1, libc::EINVAL, msg));
        }
    }
    Ok(())
}

/// The VM's load-time checks, with the runtime's helpers and these maps.
fn check_in_vm(name: &str, insns: &[Insn], maps: &[(u32, Arc<Map>)]) -> Result<(), Stop> {
    let slots = slots().map_err(|m| Stop::refused(libc::ENOMEM, format!("userbpf: {m}")))?;
    let prepared = LoadedProgram::prepare(
        0,
        name,
        insns,
        userbpf_runtime::helpers::registry(),
        &maps as &dyn MapResolver,
        Engine::Interpreter,
        slots,
    );
    let Err(e) = prepared else { return Ok(()) };
    let msg = e.to_string();
    // "instruction N: why" names the instruction: log it as the verifier does.
    let pc = msg.strip_prefix("instruction ").and_then(|r| r.split(':').next()).and_then(|n| n.parse::<usize>().ok());
    let why = match pc {
        Some(_) => msg.split_once(": ").map(|(_, w)| w.to_string()).unwrap_or(msg.clone()),
        None => msg.clone(),
    };
    // Structural faults (jumps, the last instruction) are found before the walk, as the
    // kernel's check_subprogs and check_cfg find them: no instruction line.
    Err(Stop::refused(libc::EINVAL, format!("{}{why}", pc.map(|p| format!("insn {p}: ")).unwrap_or_default())))
}

/// The checks the kernel's verifier makes of a program, in its order; `insns` are rewritten
/// as the session records them (map references by id, unreachable missing helpers gone).
fn verify(at: &attr::ProgLoad, name: &str, gpl: bool, insns: &mut [Insn]) -> Result<Checked, Stop> {
    check_attach_and_relocs(at)?;
    let (btf_id, func_info, line_info) = read_btf_info(at)?;
    let tag = prog_tag(insns);
    let maps = resolve_maps(insns, at.fd_array)?;
    let map_ids: Vec<u32> = maps.iter().map(|(id, _)| *id).collect();
    check_calls(insns, &map_ids, gpl)?;
    let verified = run_verifier(at, name, gpl, insns, &maps)?;
    check_in_vm(name, insns, &maps)?;
    Ok(Checked { btf_id, func_info, line_info, map_ids, tag, verified })
}

/// The verifier's description of map `id` as this process knows it: frozen read-only maps
/// (`BPF_F_RDONLY_PROG`, then BPF_MAP_FREEZE) give their values as constants, and maps of
/// maps the template their loader gave.
fn map_info(id: u32, map: &Map) -> userbpf_verifier::MapInfo {
    let mut info = userbpf_runtime::verify::map_info(map.spec());
    let Ok(e) = map_by_id(id) else { return info };
    if let Some((_, value)) = super::dead::Frozen::of(&[(id, e.clone())]).maps.pop() {
        info.frozen = Some(value);
    }
    if let Some((map_type, key_size, value_size, max_entries, flags)) = e.inner {
        info.inner = Some(Box::new(userbpf_verifier::MapInfo {
            name: String::new(),
            map_type,
            key_size,
            value_size,
            max_entries,
            readonly: flags & userbpf_maps::BPF_F_RDONLY_PROG != 0,
            frozen: None,
            inner: None,
        }));
    }
    info
}

/// The verifier (crate `userbpf-verifier`, the kernel's rules as for root), as the kernel
/// runs its own at PROG_LOAD: a refusal carries the verifier's log and the kernel's errno.
/// `USERBPF_VERIFY=0` skips it, with a warning.
fn run_verifier(
    at: &attr::ProgLoad,
    name: &str,
    gpl: bool,
    insns: &[Insn],
    maps: &[(u32, Arc<Map>)],
) -> Result<Option<Verified>, Stop> {
    if !userbpf_runtime::verify::enabled() {
        userbpf_runtime::verify::warn_unverified(name);
        // PROG_TEST_RUN runs it in this process.
        userbpf_runtime::helpers::maps::distrust_pointers();
        return Ok(None);
    }
    let type_name = prog_type_name(at.prog_type).unwrap_or("kprobe");
    let Some(prog_type) = userbpf_runtime::verify::prog_type(type_name) else {
        return Err(Stop::refused(libc::EINVAL, format!("programs of type {type_name} cannot be verified")));
    };
    let mut opts = userbpf_verifier::Options::new(prog_type);
    opts.gpl_compatible = gpl;
    // userbpf's writable-arguments flag (SEC("uprobe.w") through libbpf): the opt-in for pt_regs stores.
    opts.writable_args = at.prog_flags & userbpf_runtime::helpers::overrides::BPF_F_USERBPF_WRITABLE_ARGS != 0;
    opts.maps = maps.iter().map(|(id, m)| (*id, map_info(*id, m))).collect();
    // At level 1 only a refusal is logged (its paths): verify without a log first, and
    // again with one if refused (the walk is deterministic).
    opts.log_level = if at.log_level & BPF_LOG_LEVEL2 != 0 { 2 } else { 0 };
    let start = std::time::Instant::now();
    let verdict = userbpf_verifier::verify(insns, &opts);
    let usec = start.elapsed().as_micros();
    let verdict = match verdict {
        Err(_) if at.log_level & (1 | BPF_LOG_LEVEL2) == 1 => {
            opts.log_level = 1;
            userbpf_verifier::verify(insns, &opts)
        }
        v => v,
    };
    match verdict {
        Ok(stats) => Ok(Some(Verified { stats, usec })),
        Err(e) => {
            // The verifier's log ends with the message (without a log level it holds the
            // register states where the rule was broken, then the message); with only
            // BPF_LOG_STATS the kernel logs the message alone.
            let mut text = if at.log_level & (1 | BPF_LOG_LEVEL2) != 0 { e.log.clone() } else { e.message.clone() };
            if !text.ends_with('\n') {
                text.push('\n');
            }
            if at.log_level & BPF_LOG_STATS != 0 {
                text.push_str(&format!("verification time {usec} usec\n"));
            }
            text.push_str(&stats_line(e.insns_processed, 0));
            Err(Stop::Refused(Refusal {
                pc: Some(e.insn),
                processed: e.insns_processed,
                log: Some(text),
                errno: e.errno(),
                msg: e.message,
            }))
        }
    }
}

/// The verifier's last log line, as the kernel prints it (bpftrace reads its limit there).
fn stats_line(processed: usize, states: usize) -> String {
    format!(
        "processed {processed} insns (limit {INSN_LIMIT}) max_states_per_insn 0 total_states {states} peak_states {states} mark_read 0"
    )
}

/// The log of a successful load: the verifier's, with the kernel's statistics lines.
fn log_accepted(log: &mut VLog, insns: &[Insn], verified: Option<&Verified>) {
    if !log.on() {
        return;
    }
    if let Some(v) = verified {
        // As the kernel: the paths' log only at level 2 (at level 1 an accepted program's
        // log is its statistics); the verifier's own summary line gives way to the kernel's.
        if log.level & BPF_LOG_LEVEL2 != 0 {
            let text = v.stats.log.trim_end_matches('\n');
            log.text(text.rsplit_once('\n').map_or("", |(head, _)| head));
        }
        if log.level & BPF_LOG_STATS != 0 {
            let depth: Vec<String> = v.stats.stack_depth.iter().map(|d| (d.div_ceil(8) * 8).to_string()).collect();
            log.line(&format!("verification time {} usec\nstack depth {}", v.usec, depth.join("+")));
        }
        log.line(&stats_line(v.stats.insns_processed, v.stats.states));
        return;
    }
    if log.level & BPF_LOG_LEVEL2 != 0 {
        log.line("func#0 @0");
        log.line("0: R1=ctx() R10=fp0");
        let mut pc = 0;
        while pc < insns.len() {
            let l = insn_line(insns, pc);
            log.line(&l);
            pc += if insns[pc].is_lddw() { 2 } else { 1 };
        }
    }
    if log.level & BPF_LOG_STATS != 0 {
        log.line("verification time 0 usec\nstack depth 0");
    }
    // The verifier counts the instructions it walked, an lddw once (bpftrace reads its
    // instruction limit from this line).
    let walked = insns.len() - insns.iter().filter(|i| i.is_lddw()).count();
    log.line(&format!(
        "processed {walked} insns (limit {INSN_LIMIT}) max_states_per_insn 0 total_states 0 peak_states 0 mark_read 0"
    ));
}

/// The section name a loaded program is recorded with: libbpf does not pass its section, so
/// none, but for a uprobe program loaded with userbpf's writable-arguments flag (what
/// `include/userbpf/libbpf.h` sets for `SEC("uprobe.w/...")`), which is recorded as
/// `uprobe.w`: its argument writes are then verified as `userbpf run` verifies that section's.
fn section_of(at: &attr::ProgLoad) -> String {
    use userbpf_runtime::helpers::overrides::{BPF_F_USERBPF_WRITABLE_ARGS, WRITABLE_ARGS_SECTION};
    if at.prog_flags & BPF_F_USERBPF_WRITABLE_ARGS != 0 { WRITABLE_ARGS_SECTION.to_string() } else { String::new() }
}

/// Records an accepted program in the session and this process; its new descriptor.
fn record_prog(
    at: &attr::ProgLoad,
    name: String,
    type_name: &str,
    license: &[u8],
    insns: Vec<Insn>,
    checked: Checked,
) -> Result<i64, Error> {
    let session = objects::session()?;
    let mut sorted_ids = checked.map_ids.clone();
    sorted_ids.sort_unstable();
    let record = ProgRecord {
        id: 0,
        name: name.clone(),
        section: section_of(at),
        prog_type: type_name.to_string(),
        insns_hex: encode(&insns).iter().map(|b| format!("{b:02x}")).collect(),
        map_ids: sorted_ids,
        btf_id: (checked.btf_id != 0).then_some(checked.btf_id),
        object: None,
        license: String::from_utf8_lossy(license).into_owned(),
    };
    let record = session
        .add_prog(record)
        .map_err(|e| Error::new(super::io_errno(&e), format!("recording the program in the session: {e}")))?;
    let id = record.id;
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let entry = Arc::new(ProgEntry {
        id,
        prog_type: at.prog_type,
        expected_attach_type: at.expected_attach_type,
        name,
        insns,
        map_ids: Mutex::new(checked.map_ids),
        btf_id: checked.btf_id,
        func_info_rec_size: at.func_info_rec_size,
        func_info: checked.func_info,
        line_info_rec_size: at.line_info_rec_size,
        line_info: checked.line_info,
        load_time: boottime_ns(),
        uid,
        gpl: gpl_compatible(license),
        tag: checked.tag,
        loaded: OnceLock::new(),
    });
    state().progs.insert(id, entry);
    Ok(objects::install(Kind::Prog, id, &session.layout().prog(id))? as i64)
}

/// BPF_PROG_LOAD: the attributes checked, the program read, verified (the log written as
/// the verifier writes it, a refusal's reason included), then recorded in the session.
pub fn load(a: &Attr) -> Result<i64, Error> {
    let at: attr::ProgLoad = a.get(end_of!(attr::ProgLoad, log_true_size))?;
    let (type_name, name) = check_load_attr(&at)?;
    let (license, mut insns) = read_program(&at)?;
    let mut log = VLog::new(at.log_level, at.log_buf, at.log_size)?;
    let checked = match verify(&at, &name, gpl_compatible(&license), &mut insns) {
        // Failed before the verifier ran: no log, as in the kernel.
        Err(Stop::Failed(e)) => return Err(e),
        Err(Stop::Refused(r)) => {
            r.log(&mut log, &insns);
            Err(r)
        }
        Ok(c) => {
            log_accepted(&mut log, &insns, c.verified.as_ref());
            Ok(c)
        }
    };
    let (true_size, written) = log.finish();
    let _ = a.put_u32(offset_of!(attr::ProgLoad, log_true_size), true_size);
    // A log that did not fit gives ENOSPC, a refusal's errno included (as the kernel).
    written.context(|| format!("the verifier log ({true_size} bytes) does not fit log_size {}", at.log_size))?;
    let checked = checked.map_err(|r| r.error())?;
    record_prog(&at, name, type_name, &license, insns, checked)
}

/// The program with session id `id` (loaded by this process, or recorded by another).
pub fn prog_by_id(id: u32) -> Result<Arc<ProgEntry>, i32> {
    if let Some(p) = state().progs.get(&id) {
        return Ok(p.clone());
    }
    let session = objects::session()?;
    let rec = session.progs().map_err(|e| super::io_errno(&e))?.into_iter().find(|r| r.id == id).ok_or(libc::ENOENT)?;
    let bytes = parse_hex(&rec.insns_hex).map_err(|_| libc::EINVAL)?;
    let insns = decode(&bytes).map_err(|_| libc::EINVAL)?;
    let entry = Arc::new(ProgEntry {
        id,
        prog_type: prog_type_of(&rec.prog_type),
        expected_attach_type: 0,
        name: rec.name.chars().take(15).collect(),
        tag: prog_tag(&insns),
        insns,
        map_ids: Mutex::new(rec.map_ids.clone()),
        btf_id: rec.btf_id.unwrap_or(0),
        func_info_rec_size: 0,
        func_info: Vec::new(),
        line_info_rec_size: 0,
        line_info: Vec::new(),
        load_time: 0,
        // SAFETY: getuid has no preconditions.
        uid: unsafe { libc::getuid() },
        gpl: gpl_compatible(rec.license.as_bytes()),
        loaded: OnceLock::new(),
    });
    Ok(state().progs.entry(id).or_insert(entry).clone())
}

/// The program `fd` refers to.
pub fn prog_of_fd(fd: i32) -> Result<Arc<ProgEntry>, i32> {
    let obj = objects::get_kind(fd, Kind::Prog)?;
    prog_by_id(obj.id)
}

/// BPF_PROG_TEST_RUN (BPF_PROG_RUN): raw tracepoint and syscall programs run once here, in
/// the loader, as the kernel runs them (bpftrace runs BEGIN and END this way). Other types
/// the runtime loads have no test run in the kernel either (`ENOTSUPP`).
pub fn test_run(a: &Attr) -> Result<i64, Error> {
    let at: attr::TestRun = a.get(end_of!(attr::TestRun, batch_size))?;
    let p = prog_of_fd(at.prog_fd).context(|| format!("prog_fd {}", at.prog_fd))?;
    let (data_size_in, data_size_out, data_in, data_out) = (at.data_size_in, at.data_size_out, at.data_in, at.data_out);
    let (repeat, duration) = (at.repeat, at.duration);
    let (ctx_size_in, ctx_size_out, ctx_in, ctx_out) = (at.ctx_size_in, at.ctx_size_out, at.ctx_in, at.ctx_out);
    let (flags, cpu, batch_size) = (at.flags, at.cpu, at.batch_size);
    const BPF_F_TEST_RUN_ON_CPU: u32 = 1;
    match p.prog_type {
        BPF_PROG_TYPE_RAW_TRACEPOINT => {
            if data_size_in != 0
                || data_size_out != 0
                || data_in != 0
                || data_out != 0
                || ctx_size_out != 0
                || ctx_out != 0
                || repeat != 0
                || duration != 0
                || batch_size != 0
            {
                return Err(Error::inval(
                    "a raw tracepoint program's test run takes ctx_in only (no data, repeat, duration, batch or ctx_out)",
                ));
            }
            if ctx_size_in > 8 * 12 || (ctx_size_in != 0) != (ctx_in != 0) {
                return Err(Error::inval(format!("ctx_size_in {ctx_size_in}: up to 12 arguments, with ctx_in")));
            }
            if flags & !BPF_F_TEST_RUN_ON_CPU != 0 || (flags & BPF_F_TEST_RUN_ON_CPU == 0 && cpu != 0) {
                return Err(Error::inval(format!("flags {flags:#x} with cpu {cpu}")));
            }
            if flags & BPF_F_TEST_RUN_ON_CPU != 0 && cpu >= userbpf_maps::shm::possible_cpus() {
                return Err(Error::new(libc::ENXIO, format!("cpu {cpu} does not exist")));
            }
            // The arguments, zero-extended to the most a raw tracepoint has.
            let mut ctx = vec![0u8; 8 * 12];
            read_user(ctx_in, &mut ctx[..ctx_size_in as usize])?;
            let retval = run_once(&p, &mut ctx)?;
            a.put_u32(offset_of!(attr::TestRun, retval), retval as u32)?;
            Ok(0)
        }
        BPF_PROG_TYPE_SYSCALL => {
            if data_size_in != 0
                || data_size_out != 0
                || data_in != 0
                || data_out != 0
                || ctx_size_out != 0
                || ctx_out != 0
                || repeat != 0
                || flags != 0
                || cpu != 0
                || batch_size != 0
            {
                return Err(Error::inval(
                    "a syscall program's test run takes ctx_in only (no data, repeat, flags, cpu, batch or ctx_out)",
                ));
            }
            if ctx_size_in > u16::MAX as u32 || (ctx_size_in != 0) != (ctx_in != 0) {
                return Err(Error::inval(format!("ctx_size_in {ctx_size_in}: up to {}, with ctx_in", u16::MAX)));
            }
            let mut ctx = vec![0u8; ctx_size_in as usize];
            read_user(ctx_in, &mut ctx)?;
            let retval = run_once(&p, &mut ctx)?;
            write_user(ctx_in, &ctx)?;
            a.put_u32(offset_of!(attr::TestRun, retval), retval as u32)?;
            Ok(0)
        }
        t => Err(Error::new(ENOTSUPP, format!("no test run for programs of type {t}"))),
    }
}

/// Runs `p` once on `ctx`: its return value.
fn run_once(p: &ProgEntry, ctx: &mut [u8]) -> Result<u64, i32> {
    let loaded = p.loaded().map_err(|_| libc::EINVAL)?;
    let mut buf = ctx.to_vec();
    if buf.is_empty() {
        buf.resize(8, 0);
    }
    let r = loaded.run(buf.as_mut_ptr(), ctx.len(), RunContext::EMPTY);
    let n = ctx.len();
    ctx.copy_from_slice(&buf[..n]);
    match r {
        Ok(Some(v)) => Ok(v),
        // Skipped (this thread is already running a program): the kernel counts a miss and
        // reports the program as not run, retval 0.
        Ok(None) => Ok(0),
        Err(_) => Err(libc::EFAULT),
    }
}

/// BPF_PROG_BIND_MAP: the map stays with the program (listed in its map ids).
pub fn bind_map(a: &Attr) -> Result<i64, Error> {
    let at: attr::ProgBindMap = a.get(end_of!(attr::ProgBindMap, flags))?;
    if at.flags != 0 {
        return Err(Error::inval(format!("flags {:#x} unknown", at.flags)));
    }
    let p = prog_of_fd(at.prog_fd).context(|| format!("prog_fd {}", at.prog_fd))?;
    let m = map_of_fd(at.map_fd).context(|| format!("map_fd {}", at.map_fd))?;
    let id = m.map.id();
    let mut ids = p.map_ids.lock().unwrap_or_else(|e| e.into_inner());
    if !ids.contains(&id) {
        ids.push(id);
    }
    Ok(0)
}

/// The translated instructions as the kernel's xlated dump gives them: map references as
/// `BPF_PSEUDO_MAP_FD`/`BPF_PSEUDO_MAP_VALUE` with the map id in `imm`.
pub fn xlated(p: &ProgEntry) -> Vec<u8> {
    let mut v = p.insns.clone();
    for i in v.iter_mut() {
        if i.is_lddw() {
            if i.src == BPF_PSEUDO_MAP_IDX {
                i.src = BPF_PSEUDO_MAP_FD;
            } else if i.src == BPF_PSEUDO_MAP_IDX_VALUE {
                i.src = BPF_PSEUDO_MAP_VALUE;
            }
        }
    }
    encode(&v)
}

#[cfg(test)]
mod tests {
    #[test]
    fn sha256_known_answers() {
        let hex = |d: [u8; 32]| d.iter().map(|b| format!("{b:02x}")).collect::<String>();
        assert_eq!(hex(super::sha256(b"")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
        assert_eq!(hex(super::sha256(b"abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        let long = vec![b'a'; 1000];
        assert_eq!(hex(super::sha256(&long)), "41edece42d63e8d9bf515a9ba6932e1c20cbc9f5a5d134645adb5db1b9737ea3");
    }

    #[test]
    fn tag_of_return_zero_is_the_kernels() {
        use userbpf_isa::Insn;
        let p = [Insn::new(0xb7, 0, 0, 0, 0), Insn::new(0x95, 0, 0, 0, 0)];
        // What Linux 6.18 reports for `r0 = 0; exit`.
        assert_eq!(super::prog_tag(&p), [0x59, 0xf4, 0xa9, 0x31, 0x74, 0x4d, 0xcd, 0xc6]);
    }
}
