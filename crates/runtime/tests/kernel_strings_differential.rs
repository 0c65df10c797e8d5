//! Differential testing of the string helpers against the kernel: `bpf_strncmp` on strings
//! sharing prefixes, `bpf_snprintf` with random
//! format strings (every conversion the kernel knows and some it refuses, flags, widths,
//! precisions, length modifiers, `%s` of strings in read-only memory, stray `%`) and
//! arguments, and `bpf_strtol` / `bpf_strtoul` on random numbers (signs, bases and their
//! prefixes, white space, digits outside the base, overflow, the buffer cut short) with every
//! base flag, run by the kernel (a socket filter through `BPF_PROG_TEST_RUN`, its strings in
//! a frozen read-only array map) and by userbpf's interpreter and JIT, must give the same
//! return value and write the same bytes.
//!
//! Environment: `KSTR_SEED=N` (decimal or 0x-hex, or `time`), `KSTR_COUNT=N` (default 2000).
//! A difference prints the case's seed, its strings and arguments and both results;
//! `KSTR_SEED=<seed> KSTR_COUNT=1` reproduces it.

mod common;

use std::sync::Arc;

use common::{Registered, lddw};
use userbpf_isa::Insn;
use userbpf_maps::{MapSpec, MapType};
use userbpf_runtime::context::CpuSlots;
use userbpf_runtime::helpers;
use userbpf_testutil::kernel;
use userbpf_testutil::{Rng, TmpDir};
use userbpf_vm::{LoadOptions, Program};

/// The read-only strings: the format (or the number) at 0, then `%s` arguments.
const RO_LEN: usize = 512;
/// Where each `%s` argument string starts.
const STR_AT: [usize; 4] = [256, 320, 384, 448];
/// The output: the helper's return value, a second word (`*res` of strtol), then the
/// snprintf's buffer.
const OUT_LEN: usize = 16 + 256;
const BPF_F_RDONLY_PROG: u32 = 1 << 7;
const NOTHING: i32 = -12345;

/// A case's call: snprintf's output size and arguments, strtol's length and flags, or
/// strncmp's length of its first string (the `%s` string 0; the second, constant, is 1).
#[derive(Debug)]
enum Call {
    Snprintf { size: i32, args: Vec<Arg> },
    Strtol { unsigned: bool, len: i32, flags: i32 },
    Strncmp { len: i32 },
}

#[derive(Debug, Clone, Copy)]
enum Arg {
    Value(u64),
    Str(usize),
}

struct Case {
    seed: u64,
    ro: Vec<u8>,
    call: Call,
}

/// A random format string and its arguments.
fn format(rng: &mut Rng) -> (String, Vec<Arg>) {
    let mut fmt = String::new();
    let mut args = Vec::new();
    for _ in 0..1 + rng.below(5) {
        match rng.below(10) {
            0 => fmt.push_str(rng.pick(&["abc", " ", "x=", "-", "\t", "é", "\u{1}", "\u{7f}", "\r\n"])),
            1 => fmt.push_str("%%"),
            _ => {
                fmt.push('%');
                // Mostly what the kernel takes, sometimes what it refuses (`#`, a precision,
                // `h`, `z`, `L`, `o`, `e`, `n`, `q`, `%p` with a modifier it does not know).
                let rare = |rng: &mut Rng| rng.chance(1, 16);
                for _ in 0..rng.below(3) {
                    fmt.push(if rare(rng) { '#' } else { rng.pick(&['-', '+', ' ', '0']) });
                }
                if rng.chance(1, 3) {
                    fmt += &rng.below(25).to_string();
                }
                if rare(rng) {
                    fmt.push('.');
                    fmt += &rng.below(12).to_string();
                }
                let conv = if rare(rng) {
                    rng.pick(&['o', 'e', 'n', 'q', 'p'])
                } else {
                    rng.pick(&['d', 'i', 'u', 'x', 'X', 'd', 'x', 'c', 's'])
                };
                let len = if rare(rng) {
                    rng.pick(&["h", "hh", "z", "L", "l"])
                } else if matches!(conv, 'd' | 'i' | 'u' | 'x' | 'X') {
                    rng.pick(&["", "", "l", "ll"])
                } else {
                    ""
                };
                fmt.push_str(len);
                fmt.push(conv);
                if conv == 'p' {
                    // Pointers print as addresses, which differ: only `%p` forms the kernel
                    // refuses are drawn.
                    fmt.push(rng.pick(&['Z', 'F']));
                }
                args.push(if conv == 's' {
                    Arg::Str(rng.below(STR_AT.len() as u64) as usize)
                } else {
                    Arg::Value(rng.edge_u64())
                });
            }
        }
    }
    // Sometimes a stray `%` at the end (a `%` within would pair with the next conversion's).
    if rng.chance(1, 32) {
        fmt.push('%');
    }
    // Sometimes an argument too many or too few, or more than the helper takes (12: the
    // kernel loads the program, the call fails).
    match rng.below(16) {
        0 => args.push(Arg::Value(rng.edge_u64())),
        2 if rng.chance(1, 4) => {
            while args.len() < 13 {
                args.push(Arg::Value(rng.edge_u64()));
            }
        }
        1 => {
            args.pop();
        }
        _ => {}
    }
    (fmt, args)
}

/// A random number as text, for strtol and strtoul.
fn number(rng: &mut Rng) -> String {
    let mut s = String::new();
    for _ in 0..rng.below(3) {
        s.push(rng.pick(&[' ', '\t', '\n']));
    }
    match rng.below(4) {
        0 => s.push('-'),
        1 => s.push('+'),
        _ => {}
    }
    s.push_str(rng.pick(&["", "", "0x", "0X", "0", "0b"]));
    let digits = "0123456789abcdefABCDEFgz";
    let n = rng.below(22);
    for _ in 0..n {
        let d = if rng.chance(1, 8) { rng.below(digits.len() as u64) } else { rng.below(10) };
        s.push(digits.as_bytes()[d as usize] as char);
    }
    if rng.chance(1, 4) {
        s.push_str(rng.pick(&[
            "18446744073709551615",
            "18446744073709551616",
            "9223372036854775808",
            "7fffffffffffffff",
        ]));
    }
    if rng.chance(1, 3) {
        s.push(rng.pick(&[' ', 'x', '-', '\0']));
    }
    s
}

impl Case {
    fn new(seed: u64) -> Case {
        let mut rng = Rng::new(seed);
        let mut ro = vec![0u8; RO_LEN];
        for at in STR_AT {
            let words = ["", "a", "hello", "0123456789abcdef0123456789abcdef0123456789", "é\t%s"];
            let w = rng.pick(&words).as_bytes();
            ro[at..at + w.len()].copy_from_slice(w);
        }
        let call = if rng.chance(1, 3) {
            // Strings that share prefixes, cases and bytes above 0x7f.
            let words = ["", "a", "A", "hell", "hello", "help", "hello world", "hellO", "é", "\u{7f}", "\t"];
            for at in &STR_AT[..2] {
                ro[*at..*at + 64].fill(0);
                let w = rng.pick(&words).as_bytes();
                ro[*at..*at + w.len()].copy_from_slice(w);
            }
            Call::Strncmp { len: 1 + rng.below(64) as i32 }
        } else if rng.chance(1, 2) {
            let (fmt, args) = format(&mut rng);
            let f = fmt.as_bytes();
            let f = &f[..f.len().min(STR_AT[0] - 1)];
            ro[..f.len()].copy_from_slice(f);
            let size = rng.pick(&[0, 1, 5, 16, 64, 200, 256]);
            // KSTR_SIZE: another output size for the case (to see a cut output whole).
            let size = userbpf_testutil::env_u64("KSTR_SIZE").map_or(size, |s| s as i32);
            Call::Snprintf { size, args }
        } else {
            let num = number(&mut rng);
            let n = num.as_bytes();
            let n = &n[..n.len().min(STR_AT[0] - 1)];
            ro[..n.len()].copy_from_slice(n);
            let len = match rng.below(4) {
                // The length is at least 1 (the verifier refuses a constant 0).
                0 => 1 + rng.below(n.len() as u64 + 1) as i32,
                1 => 1,
                _ => (n.len() as i32 + rng.below(3) as i32).max(1),
            };
            let flags = rng.pick(&[0, 0, 8, 10, 16, 2, 0x110, 1]);
            Call::Strtol { unsigned: rng.chance(1, 2), len, flags }
        };
        Case { seed, ro, call }
    }

    fn text(&self) -> String {
        let end = self.ro.iter().position(|&b| b == 0).unwrap_or(0);
        format!("{:?}", String::from_utf8_lossy(&self.ro[..end]))
    }

    /// The program: `ro(off)` loads the address of the read-only bytes at `off` into r1
    /// (then moved where needed), `out` the output array's reference into r1.
    fn program(&self, ro: impl Fn(i32) -> [Insn; 2], out: [Insn; 2]) -> Vec<Insn> {
        let mov_x = |d, s| Insn::new(0xbf, d, s, 0, 0);
        let mov_k = |d, k| Insn::new(0xb7, d, 0, 0, k);
        let add_k = |d, k| Insn::new(0x07, d, 0, 0, k);
        let mut p = Vec::new();
        let null_check = common::output_frame_start(&mut p, out, -4);
        match &self.call {
            Call::Snprintf { size, args } => {
                // The arguments at fp - 8 * 13 and up.
                let base = -8 * 13i16;
                for (i, a) in args.iter().enumerate() {
                    match *a {
                        Arg::Value(v) => {
                            p.push(Insn::new(0x18, 1, 0, 0, v as u32 as i32));
                            p.push(Insn::new(0, 0, 0, 0, (v >> 32) as u32 as i32));
                        }
                        Arg::Str(s) => p.extend(ro(STR_AT[s] as i32)),
                    }
                    p.push(Insn::new(0x7b, 10, 1, base + 8 * i as i16, 0));
                }
                p.extend(ro(0));
                p.push(mov_x(3, 1));
                p.push(mov_x(1, 6));
                p.push(add_k(1, 16));
                p.push(mov_k(2, *size));
                p.push(mov_x(4, 10));
                p.push(add_k(4, i32::from(base)));
                p.push(mov_k(5, 8 * args.len() as i32));
                if args.is_empty() {
                    p.push(mov_k(4, 0));
                }
                p.push(Insn::new(0x85, 0, 0, 0, 165));
                p.push(Insn::new(0x7b, 6, 0, 0, 0));
            }
            Call::Strncmp { len } => {
                p.extend(ro(STR_AT[1] as i32));
                p.push(mov_x(3, 1));
                p.extend(ro(STR_AT[0] as i32));
                p.push(mov_k(2, *len));
                p.push(Insn::new(0x85, 0, 0, 0, 182));
                p.push(Insn::new(0x7b, 6, 0, 0, 0));
            }
            Call::Strtol { unsigned, len, flags } => {
                p.push(Insn::new(0x7a, 10, 0, -16, NOTHING)); // *(u64 *)(fp - 16) = NOTHING
                p.extend(ro(0));
                p.push(mov_k(2, *len));
                p.push(mov_k(3, *flags));
                p.push(mov_x(4, 10));
                p.push(add_k(4, -16));
                p.push(Insn::new(0x85, 0, 0, 0, if *unsigned { 106 } else { 105 }));
                p.push(Insn::new(0x7b, 6, 0, 0, 0));
                p.push(Insn::new(0x79, 7, 10, -16, 0));
                p.push(Insn::new(0x7b, 6, 7, 8, 0));
            }
        }
        common::output_frame_end(&mut p, null_check);
        p
    }
}

// ---- the kernel's side ----

fn array(value_size: usize, flags: u32) -> MapSpec {
    MapSpec {
        map_type: MapType::BPF_MAP_TYPE_ARRAY,
        key_size: 4,
        value_size: value_size as u32,
        max_entries: 1,
        map_flags: flags,
        map_extra: 0,
        name: "s".into(),
    }
}

/// Runs the case in the kernel: its output element, or `Err` when the verifier refuses the
/// program for its format string (which it checks when loading, as a constant).
fn kernel_run(case: &Case) -> Result<Vec<u8>, String> {
    // The read-only strings, frozen (`bpf_snprintf` takes its format only from such a map).
    let ro = common::kernel_map(&array(RO_LEN, BPF_F_RDONLY_PROG));
    userbpf_kernel::sys::update(ro.0, &0u32.to_ne_bytes(), &case.ro, 0).expect("BPF_MAP_UPDATE_ELEM");
    kernel::map_freeze(&ro).expect("BPF_MAP_FREEZE");
    let out = common::kernel_map(&common::Output::spec(OUT_LEN));
    // BPF_PSEUDO_MAP_VALUE (src 2): the map's value at an offset; BPF_PSEUDO_MAP_FD (src 1).
    let insns = case.program(
        |off| [Insn::new(0x18, 1, 2, 0, ro.0), Insn::new(0, 0, 0, 0, off)],
        [Insn::new(0x18, 1, 1, 0, out.0), Insn::new(0, 0, 0, 0, 0)],
    );
    match common::kernel_run_output(&insns, &out, OUT_LEN, None) {
        Ok(value) => Ok(value),
        Err((_, log)) if log.contains("Invalid format string") => Err(log),
        Err((e, log)) => panic!("case seed {:#x}: the kernel refuses the program: {e}\n{log}", case.seed),
    }
}

// ---- ours ----

#[test]
fn string_helpers_agree_with_the_kernel() {
    let Some((seed, count)) = kernel::fuzz_setup("KSTR_SEED", 0x6b73_7472, "KSTR_COUNT", 2000) else { return };
    let dir = TmpDir::new("kernel-strings-differential");
    let out = common::Output::new(&dir, OUT_LEN, 1);
    let opts = LoadOptions { helpers: helpers::registry(), memory: Some(Arc::new(Registered)), allow_callx: false };
    let slots = CpuSlots::private().unwrap();
    let mut failures = Vec::new();
    let (mut refused, mut refused_at_load) = (0, 0);
    for c in 0..count {
        let case = Case::new(seed.wrapping_add(c));
        // A format the kernel's verifier refuses: ours must refuse it when run (-EINVAL,
        // nothing written).
        let (k_out, at_load) = match kernel_run(&case) {
            Ok(o) => (o, false),
            Err(_) => {
                let mut o = vec![0u8; OUT_LEN];
                o[..8].copy_from_slice(&(-i64::from(libc::EINVAL)).to_ne_bytes());
                (o, true)
            }
        };
        // The verifier's load-time check (the runtime's rule, given to the verifier) must
        // refuse exactly the formats the kernel's verifier refuses.
        if let Call::Snprintf { args, .. } = &case.call {
            let end = case.ro.iter().position(|&b| b == 0).unwrap_or(0);
            let ours = helpers::printf::snprintf_format_is_valid(&case.ro[..end], args.len());
            if ours == at_load {
                failures.push(format!(
                    "case seed {:#x} (reproduce: KSTR_SEED={:#x} KSTR_COUNT=1): format {} with {} arguments: the kernel's verifier {}, ours {}",
                    case.seed,
                    case.seed,
                    case.text(),
                    args.len(),
                    if at_load { "refuses it" } else { "accepts it" },
                    if ours { "accepts it" } else { "refuses it" },
                ));
            }
        }
        if at_load {
            refused_at_load += 1;
            if std::env::var_os("KSTR_SHOW_REFUSED").is_some() {
                println!("refused: {} {:?}", case.text(), case.call);
            }
        } else if i64::from_ne_bytes(k_out[..8].try_into().unwrap()) == -i64::from(libc::EINVAL) {
            refused += 1;
        }
        // Ours read the same bytes, from memory of the test's.
        let ro = case.ro.clone();
        let ro_addr = ro.as_ptr() as u64;
        let insns = case.program(|off| lddw(1, ro_addr + off as u64), lddw(1, out.addr));
        let prog = Arc::new(Program::load(&insns, &opts, None).unwrap());
        for (e, engine) in ["interpreter", "JIT"].iter().enumerate() {
            let o = out.run(&prog, e == 1, &slots);
            if o != k_out {
                let word = |b: &[u8], at: usize| i64::from_ne_bytes(b[at..at + 8].try_into().unwrap());
                let text = |b: &[u8]| String::from_utf8_lossy(&b[16..]).trim_end_matches('\0').to_string();
                failures.push(format!(
                    "case seed {:#x} (reproduce: KSTR_SEED={:#x} KSTR_COUNT=1): {:?} on {}\n  kernel{}: {}, {}, {:?}\n  {engine}: {}, {}, {:?}",
                    case.seed,
                    case.seed,
                    case.call,
                    case.text(),
                    if at_load { " (refused by the verifier)" } else { "" },
                    word(&k_out, 0),
                    word(&k_out, 8),
                    text(&k_out),
                    word(&o, 0),
                    word(&o, 8),
                    text(&o),
                ));
            }
        }
        drop(ro);
        if failures.len() >= 6 {
            break;
        }
    }
    println!(
        "{count} calls of bpf_snprintf, bpf_strtol, bpf_strtoul and bpf_strncmp (first seed {seed:#x}): the kernel refused {refused_at_load} formats when loading, {refused} calls with EINVAL"
    );
    assert!(failures.is_empty(), "{} difference(s):\n\n{}", failures.len(), failures.join("\n\n"));
}
