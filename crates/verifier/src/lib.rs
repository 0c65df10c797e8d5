//! A static verifier for eBPF programs with the Linux kernel's rules, so that a program
//! userbpf runs inside a process can no more crash it than a kernel program can crash the
//! kernel.
//!
//! [`verify`] walks every path of a program (with state pruning, as the kernel's
//! `do_check`), tracking what each register and stack slot holds:
//!
//! - [`tnum`]: tristate numbers (known and unknown bits).
//! - [`scalar`]: scalar ranges (tnum, signed and unsigned 64- and 32-bit bounds) and the
//!   ALU and branch transfer functions.
//! - [`reg`]: register types with pointer provenance (context, stack, map value, map
//!   pointer, ring buffer record, helper memory, and their nullable forms).
//! - [`stack`]: the 512-byte stack of each frame in 8-byte slots (spilled registers,
//!   unknown, zero and uninitialised bytes).
//! - [`ctx`]: program types and the context each may read.
//! - [`helpers`]: helper prototypes (argument and return types, map compatibility).
//! - [`overrides`]: userbpf's uprobe extensions (`bpf_override_return`, argument writes).
//! - [`cfg`]: the static checks (jump targets, unreachable code, subprograms) and the
//!   liveness and prune points the walk uses.
//! - [`state`]: the verifier state (frames, references) and when one state subsumes another.
//! - [`check`]: the transfer function of each instruction and its checks.
//! - [`explore`]: the walk itself: branches, pruning, loops, the complexity limit.
//!
//! Errors name the instruction and the rule in the kernel's words (`R1 invalid mem access
//! 'scalar'`, `invalid access to map value, value_size=8 off=8 size=8`, ...), with a log of
//! the path in the kernel's style when asked for, and the errno the kernel's `BPF_PROG_LOAD`
//! returns for the same refusal ([`VerifyError::errno`]: `EACCES`, `EINVAL` or `E2BIG`).
//!
//! # Rules as root
//!
//! [`Options::privileged`] gives the rules the kernel applies to a loader with
//! `CAP_BPF`+`CAP_PERFMON` (root): reading uninitialised stack gives an unknown value,
//! pointers may be stored in maps, compared, subtracted and returned. Without it, those
//! are refused as the kernel refuses them for unprivileged loaders.

use std::collections::BTreeMap;
use std::fmt;

pub mod cfg;
pub mod check;
pub mod ctx;
pub mod explore;
pub mod helpers;
pub mod overrides;
pub mod reg;
pub mod scalar;
pub mod stack;
pub mod state;
pub mod tnum;

pub use ctx::ProgType;
use userbpf_isa::Insn;

/// The kernel's `BPF_COMPLEXITY_LIMIT_INSNS`: instructions processed over all paths.
pub const COMPLEXITY_LIMIT: usize = 1_000_000;
/// The kernel's `BPF_COMPLEXITY_LIMIT_JMP_SEQ`: paths waiting to be explored.
pub const JMP_SEQ_LIMIT: usize = 8192;
/// The kernel's `MAX_CALL_FRAMES`.
pub const MAX_CALL_FRAMES: usize = 8;

/// A map the program refers to (by the `imm` of its `lddw`).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct MapInfo {
    pub name: String,
    /// `enum bpf_map_type`.
    pub map_type: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    /// `BPF_F_RDONLY_PROG`: the program may not write values.
    pub readonly: bool,
    /// The contents of element 0 of a read-only array that cannot change (a frozen
    /// `.rodata`): loads from it at constant offsets give constants, as in the kernel.
    pub frozen: Option<Vec<u8>>,
    /// For maps of maps: the inner maps' definition (what a lookup returns).
    pub inner: Option<Box<MapInfo>>,
}

/// Added to a map's key to name its inner map (the map a lookup in a map of maps returns).
pub const INNER_MAP: u32 = 1 << 31;

/// What to verify the program as.
#[derive(Clone, Debug)]
pub struct Options {
    pub prog_type: ProgType,
    /// Maps by the `imm` of the `lddw` instructions referring to them.
    pub maps: BTreeMap<u32, MapInfo>,
    /// The rules for root (see the crate docs).
    pub privileged: bool,
    /// The program's license is GPL-compatible (else GPL-only helpers are refused).
    pub gpl_compatible: bool,
    /// A uprobe program that may store into its argument registers (userbpf's `uprobe.w`
    /// extension, see [`overrides`]).
    pub writable_args: bool,
    /// 0: no log; 1: the instructions of each path and the state where paths start; 2: the
    /// state after every instruction.
    pub log_level: u32,
    /// Checks `bpf_snprintf`'s format when it is a constant string (a frozen read-only map's,
    /// as the helper demands), given the format's bytes (to its NUL) and the number of 8-byte
    /// arguments `data_len` gives: false refuses the program ("Invalid format string"), as the
    /// kernel's verifier does. The rules are the runtime's (its `printf`); `None`: unchecked.
    pub snprintf_format: Option<fn(&[u8], usize) -> bool>,
}

impl Options {
    pub fn new(prog_type: ProgType) -> Options {
        Options {
            prog_type,
            maps: BTreeMap::new(),
            privileged: true,
            gpl_compatible: true,
            writable_args: false,
            log_level: 0,
            snprintf_format: None,
        }
    }
}

/// A refused program: the instruction, the rule broken (in the kernel's words) and the
/// verifier log up to that point.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifyError {
    pub insn: usize,
    pub message: String,
    pub log: String,
    /// Instructions processed before the refusal (0 when refused before the walk: encodings,
    /// jumps, unreachable code, unknown helpers).
    pub insns_processed: usize,
}

impl VerifyError {
    /// The errno the kernel's `bpf(BPF_PROG_LOAD)` returns for this refusal: `E2BIG` for the
    /// complexity limits, `EINVAL` for malformed programs and the rules the kernel reports
    /// with it (unknown helpers, unreleased references, jumps, return values), `EACCES`
    /// for the rest (memory accesses, types, bounds: the kernel's default).
    pub fn errno(&self) -> i32 {
        const E2BIG: i32 = 7;
        const EINVAL: i32 = 22;
        const EACCES: i32 = 13;
        const TOO_BIG: &[&str] =
            &["BPF program is too large", "The sequence of ", "the call stack of ", "too many call"];
        const INVALID: &[&str] = &[
            "invalid func",
            "unknown func",
            "helper ",
            "program of this type cannot use helper",
            "cannot call GPL-restricted",
            "jump out of range",
            "jump into the middle",
            "unreachable insn",
            "last insn is not",
            "back-edge",
            "invalid bpf_ld_imm64",
            "infinite loop detected",
            "Unreleased reference",
            "cannot pass map_type",
            "invalid BPF_JMP",
            "BPF_LD_[ABS|IND]",
            "call to invalid destination",
            "invalid shift",
            "div by zero",
            "At callback return",
            "At program exit",
            "tail_call would lead to reference leak",
            "callx",
            "calling kernel functions",
            "ksym",
            "program has no instructions",
            "invalid atomic",
            "BPF_ATOMIC uses invalid",
            "no direct value access",
            "string is not zero-terminated",
            "the inner map of map",
            "fd ",
            "unknown opcode",
            "cannot return stack pointer",
            "math between",
            "value ",
            "invalid indirect access to stack",
            "invalid",
        ];
        let m = self.message.as_str();
        if self.insns_processed == 0 && !TOO_BIG.iter().any(|p| m.starts_with(p)) {
            // Refused before the walk: encodings, the control flow graph, unknown helpers.
            return EINVAL;
        }
        // Pointer arithmetic out of its region (the kernel's sanitize checks) and reference
        // misuse are EINVAL too.
        let invalid = m.contains("pointer be out of bounds")
            || (m.starts_with('R') && m.contains(" reference has not been acquired"))
            || m.contains("must have zero offset when passed to release func")
            || (INVALID.iter().any(|p| m.starts_with(p)) && !EACCES_INVALID.iter().any(|p| m.starts_with(p)));
        if TOO_BIG.iter().any(|p| m.starts_with(p)) {
            E2BIG
        } else if invalid {
            EINVAL
        } else {
            EACCES
        }
    }
}

/// Refusals starting with "invalid" that the kernel gives `EACCES` (memory accesses).
const EACCES_INVALID: &[&str] = &[
    "invalid access",
    "invalid mem access",
    "invalid read from stack",
    "invalid indirect read",
    "invalid variable-offset",
    "invalid unbounded",
    "invalid bpf_context access",
    "invalid size of register",
    "invalid stack",
    "invalid write to stack",
    "invalid zero-sized",
];

impl fmt::Display for VerifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "instruction {}: {}", self.insn, self.message)
    }
}

impl std::error::Error for VerifyError {}

/// What verifying an accepted program took.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Instructions processed over all paths (the kernel's `processed N insns`).
    pub insns_processed: usize,
    /// States stored at prune points.
    pub states: usize,
    /// Paths cut short because a stored state covered them.
    pub pruned: usize,
    /// Stack depth of each function, in the order of their first instruction.
    pub stack_depth: Vec<u32>,
    /// The log (empty unless [`Options::log_level`] asked for one).
    pub log: String,
}

/// Verifies a program: `Ok` when every path is safe under the kernel's rules.
pub fn verify(insns: &[Insn], opts: &Options) -> Result<Stats, VerifyError> {
    explore::run(insns, opts)
}
