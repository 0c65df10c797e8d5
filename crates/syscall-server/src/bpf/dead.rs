//! Which instructions can run, given what the kernel's verifier knows at load time: values
//! read from frozen read-only maps (`.rodata` of a libbpf object, frozen before its programs
//! load) are constants, so branches on them go one way only. The verifier never looks at the
//! instructions behind a branch that cannot be taken, so a helper this runtime lacks may sit
//! there (libbpf-tools' `if (filter_cg && !bpf_current_task_under_cgroup(...))` with
//! `filter_cg` false). [`reachable`] computes the instructions a run can reach by constant
//! propagation over registers (path-insensitive, joins lose constants, so it never calls
//! reachable code dead).

use std::sync::Arc;

use userbpf_isa::*;

use super::MapEntry;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Val {
    Unknown,
    Const(u64),
    /// A pointer into the value (element 0) of map `idx` of the program's frozen maps.
    MapValue {
        idx: usize,
        off: i64,
    },
}

type Regs = [Val; 11];

const BPF_ATOMIC_MODE: u8 = 0xc0;

fn join(a: &Regs, b: &Regs) -> Regs {
    let mut r = *a;
    for i in 0..11 {
        if a[i] != b[i] {
            r[i] = Val::Unknown;
        }
    }
    r
}

/// The frozen read-only maps' values: `(map id, bytes of element 0)`.
pub struct Frozen {
    pub maps: Vec<(u32, Vec<u8>)>,
}

impl Frozen {
    /// The maps among `maps` whose values the verifier treats as constants
    /// (`BPF_F_RDONLY_PROG` and frozen: the kernel's `bpf_map_is_rdonly`).
    pub fn of(maps: &[(u32, Arc<MapEntry>)]) -> Frozen {
        const BPF_F_RDONLY_PROG: u32 = 1 << 7;
        let mut v = Vec::new();
        for (id, e) in maps {
            if e.map_flags & BPF_F_RDONLY_PROG == 0 || !e.frozen.load(std::sync::atomic::Ordering::Acquire) {
                continue;
            }
            let mut value = vec![0u8; e.map.value_buf_size()];
            if e.map.lookup_elem(&0u32.to_ne_bytes(), &mut value).is_ok() {
                v.push((*id, value));
            }
        }
        Frozen { maps: v }
    }
}

fn alu(op: u8, a: u64, b: u64, is64: bool) -> Option<u64> {
    let (a, b) = if is64 { (a, b) } else { (a as u32 as u64, b as u32 as u64) };
    let bits = if is64 { 64 } else { 32 };
    let r = match op & 0xf0 {
        BPF_ADD => a.wrapping_add(b),
        BPF_SUB => a.wrapping_sub(b),
        BPF_MUL => a.wrapping_mul(b),
        BPF_OR => a | b,
        BPF_AND => a & b,
        BPF_XOR => a ^ b,
        BPF_LSH => a.checked_shl((b % bits) as u32).unwrap_or(0),
        BPF_RSH => {
            if is64 {
                a >> (b % 64)
            } else {
                ((a as u32) >> (b % 32)) as u64
            }
        }
        BPF_MOV => b,
        _ => return None,
    };
    Some(if is64 { r } else { r as u32 as u64 })
}

fn cond(op: u8, a: u64, b: u64, is64: bool) -> Option<bool> {
    let (a, b) = if is64 { (a, b) } else { (a as u32 as u64, b as u32 as u64) };
    let (sa, sb) = if is64 { (a as i64, b as i64) } else { (a as u32 as i32 as i64, b as u32 as i32 as i64) };
    Some(match op & 0xf0 {
        BPF_JEQ => a == b,
        BPF_JNE => a != b,
        BPF_JGT => a > b,
        BPF_JGE => a >= b,
        BPF_JLT => a < b,
        BPF_JLE => a <= b,
        BPF_JSGT => sa > sb,
        BPF_JSGE => sa >= sb,
        BPF_JSLT => sa < sb,
        BPF_JSLE => sa <= sb,
        BPF_JSET => a & b != 0,
        _ => return None,
    })
}

/// For each instruction, whether some run can reach it; `None` when the analysis gave up
/// (then everything counts as reachable).
pub fn reachable(insns: &[Insn], frozen: &Frozen) -> Option<Vec<bool>> {
    let n = insns.len();
    let mut state: Vec<Option<Regs>> = vec![None; n];
    let mut work: Vec<usize> = Vec::new();
    let entry = [Val::Unknown; 11];
    let push = |state: &mut Vec<Option<Regs>>, work: &mut Vec<usize>, pc: i64, regs: &Regs| {
        if pc < 0 || pc as usize >= n {
            return;
        }
        let pc = pc as usize;
        let merged = match &state[pc] {
            None => *regs,
            Some(old) => join(old, regs),
        };
        if state[pc] != Some(merged) {
            state[pc] = Some(merged);
            work.push(pc);
        }
    };
    push(&mut state, &mut work, 0, &entry);
    // Subprogram and callback entries are reached with unknown registers.
    for (pc, i) in insns.iter().enumerate() {
        if (i.op == OP_CALL && i.src == BPF_PSEUDO_CALL) || (i.is_lddw() && i.src == BPF_PSEUDO_FUNC) {
            push(&mut state, &mut work, pc as i64 + 1 + i.imm as i64, &entry);
        }
    }
    let mut steps = 0usize;
    while let Some(pc) = work.pop() {
        steps += 1;
        if steps > 2_000_000 {
            return None;
        }
        let Some(mut r) = state[pc] else { continue };
        let i = insns[pc];
        let class = i.op & 0x07;
        let next = pc as i64 + 1;
        match class {
            BPF_LD if i.is_lddw() => {
                let hi = insns.get(pc + 1).map_or(0, |h| h.imm as u32 as u64);
                r[(i.dst as usize).min(10)] = match i.src {
                    0 => Val::Const((i.imm as u32 as u64) | (hi << 32)),
                    BPF_PSEUDO_MAP_IDX_VALUE | BPF_PSEUDO_MAP_VALUE => {
                        match frozen.maps.iter().position(|(id, _)| *id == i.imm as u32) {
                            Some(idx) => Val::MapValue { idx, off: hi as u32 as i64 },
                            None => Val::Unknown,
                        }
                    }
                    _ => Val::Unknown,
                };
                push(&mut state, &mut work, next + 1, &r);
            }
            BPF_LD => {
                r[0] = Val::Unknown;
                push(&mut state, &mut work, next, &r);
            }
            BPF_LDX => {
                let dst = (i.dst as usize).min(10);
                let size = match i.op & 0x18 {
                    BPF_W => 4,
                    BPF_H => 2,
                    BPF_B => 1,
                    _ => 8,
                };
                r[dst] = match (i.op & 0xe0, r[(i.src as usize).min(10)]) {
                    (BPF_MEM, Val::MapValue { idx, off }) => {
                        let at = off + i.off as i64;
                        let v = &frozen.maps[idx].1;
                        if at >= 0 && (at as usize + size) <= v.len() {
                            let mut b = [0u8; 8];
                            b[..size].copy_from_slice(&v[at as usize..at as usize + size]);
                            Val::Const(u64::from_le_bytes(b))
                        } else {
                            Val::Unknown
                        }
                    }
                    _ => Val::Unknown,
                };
                push(&mut state, &mut work, next, &r);
            }
            BPF_ST | BPF_STX => {
                if class == BPF_STX && i.op & 0xe0 == BPF_ATOMIC_MODE {
                    r[(i.src as usize).min(10)] = Val::Unknown;
                    r[0] = Val::Unknown;
                }
                push(&mut state, &mut work, next, &r);
            }
            BPF_ALU | BPF_ALU64 => {
                let is64 = class == BPF_ALU64;
                let dst = (i.dst as usize).min(10);
                let src_val =
                    if i.op & BPF_X != 0 { r[(i.src as usize).min(10)] } else { Val::Const(i.imm as i64 as u64) };
                let op = i.op & 0xf0;
                r[dst] = match (op, r[dst], src_val) {
                    (BPF_MOV, _, v) if is64 && i.off == 0 => v,
                    (_, Val::Const(a), Val::Const(b)) if i.off == 0 => {
                        alu(op, a, b, is64).map_or(Val::Unknown, Val::Const)
                    }
                    (BPF_ADD, Val::MapValue { idx, off }, Val::Const(b)) if is64 => {
                        Val::MapValue { idx, off: off.wrapping_add(b as i64) }
                    }
                    (BPF_SUB, Val::MapValue { idx, off }, Val::Const(b)) if is64 => {
                        Val::MapValue { idx, off: off.wrapping_sub(b as i64) }
                    }
                    _ => Val::Unknown,
                };
                push(&mut state, &mut work, next, &r);
            }
            BPF_JMP | BPF_JMP32 => {
                let op = i.op & 0xf0;
                if i.op == OP_EXIT {
                    continue;
                }
                if i.op == OP_CALL || i.op == OP_CALLX {
                    for reg in r.iter_mut().take(6) {
                        *reg = Val::Unknown;
                    }
                    push(&mut state, &mut work, next, &r);
                    continue;
                }
                if op == BPF_JA {
                    let rel = if class == BPF_JMP32 { i.imm as i64 } else { i.off as i64 };
                    push(&mut state, &mut work, next + rel, &r);
                    continue;
                }
                let is64 = class == BPF_JMP;
                let a = r[(i.dst as usize).min(10)];
                let b = if i.op & BPF_X != 0 { r[(i.src as usize).min(10)] } else { Val::Const(i.imm as i64 as u64) };
                let taken = match (a, b) {
                    (Val::Const(a), Val::Const(b)) => cond(op, a, b, is64),
                    _ => None,
                };
                if taken != Some(false) {
                    push(&mut state, &mut work, next + i.off as i64, &r);
                }
                if taken != Some(true) {
                    push(&mut state, &mut work, next, &r);
                }
            }
            _ => push(&mut state, &mut work, next, &r),
        }
    }
    let mut live: Vec<bool> = state.iter().map(|s| s.is_some()).collect();
    // The second slot of a reachable lddw is part of it.
    for pc in 0..n.saturating_sub(1) {
        if live[pc] && insns[pc].is_lddw() {
            live[pc + 1] = true;
        }
    }
    Some(live)
}
