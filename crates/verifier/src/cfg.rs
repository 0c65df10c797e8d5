//! Static checks before the walk, as the kernel's `check_subprogs` and `check_cfg`:
//! functions (subprograms) from the targets of local calls and `BPF_PSEUDO_FUNC` loads,
//! jumps that stay inside their function and do not land inside an `lddw`, functions that
//! end with `exit` or a jump, no unreachable instruction. It also computes what the walk
//! needs: the prune points (where states are stored and compared) and the registers live
//! at each instruction (so that dead registers do not keep states apart).

use userbpf_isa::*;

/// Registers as a bit set.
pub type RegSet = u16;

pub struct Cfg {
    /// First instruction of each function, ascending; the entry function starts at 0.
    pub funcs: Vec<usize>,
    /// Where states are stored: jump targets, the instruction after a conditional jump or
    /// a call, function entries.
    pub prune: Vec<bool>,
    /// Targets of back-edges (loop heads).
    pub loop_head: Vec<bool>,
    /// Registers read before being written on some path from each instruction.
    pub live: Vec<RegSet>,
}

/// A static error: instruction and message.
pub type CfgError = (usize, String);

/// `bpf_loop`: the helper that calls a callback, and to which the callback returns.
pub const CALLBACK_HELPER: i32 = 181;

const CALLER_SAVED: RegSet = 0b11_1111; // r0-r5
const ARGS: RegSet = 0b11_1110; // r1-r5

fn bit(r: u8) -> RegSet {
    1 << r
}

impl Cfg {
    /// The function holding instruction `pc`.
    pub fn func_of(&self, pc: usize) -> usize {
        match self.funcs.binary_search(&pc) {
            Ok(i) => i,
            Err(i) => i - 1,
        }
    }

    pub fn func_end(&self, f: usize, len: usize) -> usize {
        self.funcs.get(f + 1).copied().unwrap_or(len)
    }
}

/// Where control may go after `pc` (excluding calls' targets: a call returns to `pc + 1`).
fn successors(insns: &[Insn], pc: usize) -> Vec<usize> {
    let insn = insns[pc];
    let class = insn.class();
    if class == BPF_JMP || class == BPF_JMP32 {
        match insn.code() {
            BPF_EXIT => return vec![],
            BPF_CALL => return vec![pc + 1],
            BPF_JA => {
                let off = if class == BPF_JMP32 { insn.imm as i64 } else { insn.off as i64 };
                return vec![(pc as i64 + off + 1) as usize];
            }
            _ => return vec![pc + 1, (pc as i64 + insn.off as i64 + 1) as usize],
        }
    }
    if insn.is_lddw() {
        return vec![pc + 2];
    }
    vec![pc + 1]
}

/// Registers an instruction reads and writes.
fn use_def(insn: Insn) -> (RegSet, RegSet) {
    let (d, s) = (bit(insn.dst), bit(insn.src));
    match insn.class() {
        BPF_ALU | BPF_ALU64 => {
            let src = if insn.source() == BPF_X && !matches!(insn.code(), BPF_NEG | BPF_END) { s } else { 0 };
            if insn.code() == BPF_MOV { (src, d) } else { (src | d, d) }
        }
        BPF_LDX => (s, d),
        BPF_ST => (d, 0),
        BPF_STX => {
            if insn.mode() == BPF_ATOMIC {
                if insn.imm == BPF_CMPXCHG {
                    (d | s | 1, 1)
                } else if insn.imm & BPF_FETCH != 0 {
                    (d | s, s)
                } else {
                    (d | s, 0)
                }
            } else {
                (d | s, 0)
            }
        }
        BPF_LD => {
            if insn.is_lddw() {
                (0, d)
            } else {
                // Legacy packet loads read r6 (and src), clobber r0-r5.
                (bit(6) | if insn.mode() == BPF_IND { s } else { 0 }, CALLER_SAVED)
            }
        }
        BPF_JMP | BPF_JMP32 => match insn.code() {
            BPF_CALL => (ARGS, CALLER_SAVED),
            BPF_EXIT => (1, 0),
            BPF_JA => (0, 0),
            _ => (d | if insn.source() == BPF_X { s } else { 0 }, 0),
        },
        _ => (0, 0),
    }
}

pub fn build(insns: &[Insn]) -> Result<Cfg, CfgError> {
    let len = insns.len();
    if len == 0 {
        return Err((0, "program has no instructions".into()));
    }
    // lddw second slots.
    let mut second = vec![false; len];
    let mut pc = 0;
    while pc < len {
        if insns[pc].is_lddw() {
            if pc + 1 >= len {
                return Err((pc, "invalid bpf_ld_imm64 insn".into()));
            }
            second[pc + 1] = true;
            pc += 2;
        } else {
            pc += 1;
        }
    }
    // Functions.
    let mut funcs = vec![0usize];
    for pc in 0..len {
        if second[pc] {
            continue;
        }
        let insn = insns[pc];
        let is_call = insn.op == OP_CALL && insn.src == BPF_PSEUDO_CALL;
        let is_func = insn.is_lddw() && insn.src == BPF_PSEUDO_FUNC;
        if is_call || is_func {
            let target = pc as i64 + insn.imm as i64 + 1;
            if target < 0 || target >= len as i64 || second[target as usize] {
                return Err((pc, format!("call to invalid destination {target}")));
            }
            funcs.push(target as usize);
        }
    }
    funcs.sort_unstable();
    funcs.dedup();
    let cfg_funcs = Cfg { funcs: funcs.clone(), prune: vec![], loop_head: vec![], live: vec![] };
    // Jumps stay in their function; functions end with exit or a jump.
    for (f, &start) in funcs.iter().enumerate() {
        let end = cfg_funcs.func_end(f, len);
        let mut last = end - 1;
        if second[last] {
            last -= 1;
        }
        let li = insns[last];
        let is_exit_or_ja =
            (li.class() == BPF_JMP || li.class() == BPF_JMP32) && matches!(li.code(), BPF_EXIT | BPF_JA);
        if !is_exit_or_ja || li.source() == BPF_X && li.code() == BPF_JA {
            return Err((last, "last insn is not an exit or jmp".into()));
        }
        for pc in start..end {
            if second[pc] || !insns[pc].is_jump() {
                continue;
            }
            for t in successors(insns, pc) {
                if t == pc + 1 && insns[pc].code() != BPF_JA {
                    continue;
                }
                if t < start || t >= end {
                    return Err((pc, format!("jump out of range from insn {pc} to {}", t as i64)));
                }
                if second[t] {
                    return Err((pc, format!("jump into the middle of ldimm64 insn {}", t - 1)));
                }
            }
        }
    }
    // Reachability, prune points and back-edges (iterative depth-first search from each
    // function's entry).
    let mut prune = vec![false; len];
    let mut loop_head = vec![false; len];
    let mut reached = vec![false; len];
    // 0 = unvisited, 1 = on the DFS stack, 2 = done.
    let mut color = vec![0u8; len];
    for &f in &funcs {
        prune[f] = true;
        let mut stack: Vec<(usize, usize)> = vec![(f, 0)];
        color[f] = 1;
        reached[f] = true;
        while let Some(&mut (pc, ref mut next)) = stack.last_mut() {
            let succ = successors(insns, pc);
            if *next < succ.len() {
                let t = succ[*next];
                *next += 1;
                if t >= len {
                    // Falling off the end: only possible past a function's last insn,
                    // which the check above refused.
                    return Err((pc, format!("jump out of range from insn {pc} to {t}")));
                }
                let insn = insns[pc];
                if insn.is_jump() {
                    prune[t] = true;
                    if insn.code() != BPF_JA {
                        prune[pc + 1] = true;
                    }
                }
                if insn.op == OP_CALL {
                    prune[pc + 1] = true;
                    if insn.src == 0 && insn.imm == CALLBACK_HELPER {
                        prune[pc] = true;
                    }
                }
                match color[t] {
                    0 => {
                        color[t] = 1;
                        reached[t] = true;
                        stack.push((t, 0));
                    }
                    1 => loop_head[t] = true,
                    _ => {}
                }
            } else {
                color[pc] = 2;
                stack.pop();
            }
        }
    }
    for pc in 0..len {
        if !second[pc] && !reached[pc] {
            return Err((pc, format!("unreachable insn {pc}")));
        }
    }
    // Liveness: a backward fixpoint per instruction.
    let mut live = vec![0 as RegSet; len];
    let mut changed = true;
    while changed {
        changed = false;
        for pc in (0..len).rev() {
            if second[pc] {
                continue;
            }
            let (u, d) = use_def(insns[pc]);
            let mut out: RegSet = 0;
            for t in successors(insns, pc) {
                if t < len {
                    out |= live[t];
                }
            }
            let inn = u | (out & !d);
            if inn != live[pc] {
                live[pc] = inn;
                changed = true;
            }
        }
    }
    Ok(Cfg { funcs, prune, loop_head, live })
}

#[cfg(test)]
mod tests {
    use super::*;
    use userbpf_isa::asm::assemble;

    fn cfg(src: &str) -> Result<Cfg, CfgError> {
        build(&assemble(&src.replace(" r", " %r")).unwrap())
    }

    #[test]
    fn static_errors() {
        assert_eq!(cfg("mov r0, 0\nexit\nmov r0, 1\nexit").err().unwrap(), (2, "unreachable insn 2".into()));
        assert_eq!(cfg("ja +5\nexit").err().unwrap().1, "jump out of range from insn 0 to 6");
        assert_eq!(cfg("mov r0, 0").err().unwrap().1, "last insn is not an exit or jmp");
        let c = cfg("mov r0, 0\njeq r1, 0, +1\nmov r0, 1\nexit").unwrap();
        assert!(c.prune[2] && c.prune[3]);
        assert_eq!(c.live[0] & bit(1), bit(1));
        assert_eq!(c.live[2] & bit(0), 0);
        let l = cfg("mov r0, 0\nadd r0, 1\njlt r0, 10, -2\nexit").unwrap();
        assert!(l.loop_head[1]);
    }
}
