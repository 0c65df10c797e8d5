//! The walk over all paths (the kernel's `do_check` and `is_state_visited`).
//!
//! One path is followed at a time; at a conditional jump that can go both ways, the
//! fall-through is followed first and the taken branch is queued. At each prune point the
//! current state is compared with the states stored there: if a stored state whose paths
//! were all explored covers it, this path is done (pruned); if a stored state whose paths
//! are still being explored (a loop on the current path) is exactly the current state, the
//! loop makes no progress ("infinite loop detected"). Otherwise the state is stored (not
//! at every prune point: as the kernel, only after a few jumps and instructions, and more
//! rarely inside a loop) and the walk goes on. A bounded loop is thus followed iteration by
//! iteration until its exit condition is decided, within the complexity limit of
//! 1,000,000 processed instructions.
//!
//! Precision (the kernel's `mark_chain_precision`): a scalar's range takes part in the
//! comparison only where some check on a path from the stored state depended on it (a
//! branch decided by it, a pointer offset, a helper's size argument, ...). Each path keeps
//! the instructions it ran since its last stored state; when a check depends on a scalar,
//! the walk goes back over them (and over the stored states' own instructions) to find the
//! scalars it came from and marks them in the stored states on the way. States that keep
//! failing to prune are dropped from their instruction's list, as in the kernel.
//!
//! `bpf_loop` callbacks return to the helper call, which may call them again: the helper
//! call is a prune point where states still being explored may prune (the helper bounds the
//! repetitions), and scalars the callback keeps changing are widened to unknown there.

use userbpf_isa::*;

use crate::cfg::{self, Cfg, RegSet};
use crate::reg::{Reg, RegType};
use crate::stack::Stack;
use crate::state::{Frame, Mode, Precise, State, covers};
use crate::{COMPLEXITY_LIMIT, JMP_SEQ_LIMIT, MAX_CALL_FRAMES, Options, Stats, VerifyError};

/// What an instruction leads to.
pub enum Next {
    /// Continue at this instruction.
    Goto(usize),
    /// Continue at the first instruction (fall-through) with the current state; queue the
    /// second with the other state.
    Fork(usize, Box<State>, usize),
    /// The path ended (exit from the entry function).
    Done,
}

/// A stored state.
struct Checkpoint {
    state: State,
    /// Paths from this state still being explored.
    branches: u32,
    parent: Option<usize>,
    /// Comparisons that pruned / did not prune: a state that keeps failing to prune is
    /// dropped from its instruction's list (as the kernel does), which keeps loops linear.
    hits: u32,
    misses: u32,
    /// The scalars whose ranges paths from here depended on.
    precise: Precise,
    /// The instructions from the parent checkpoint to this one.
    history: Vec<Hist>,
}

/// One processed instruction, as precision backtracking needs it.
#[derive(Clone, Copy)]
pub struct Hist {
    pc: u32,
    /// Number of frames when it ran.
    depth: u8,
    /// The stack slot (frame, slot) a load or store at a constant offset touched.
    slot: Option<(u8, u8)>,
    /// A stack access at a variable offset.
    var_stack: bool,
}

struct Path {
    state: State,
    pc: usize,
    parent: Option<usize>,
    /// Jumps and instructions since the last stored state (the kernel's heuristic).
    jumps: u32,
    insns: u32,
    history: Vec<Hist>,
}

/// The verifier's working data for one program.
pub struct Verifier<'a> {
    pub insns: &'a [Insn],
    pub opts: &'a Options,
    pub cfg: Cfg,
    pub id_gen: u32,
    /// Deepest stack use of each function.
    pub depth: Vec<u32>,
    pub log: Log,
    checkpoints: Vec<Checkpoint>,
    at: Vec<Vec<usize>>,
    processed: usize,
    pruned: usize,
    fail_state: String,
    /// Scalars the instruction being processed needs precisely (registers of the current
    /// frame, stack slots), and the stack slot it touched.
    pub demand: Precise,
    pub touched_slot: Option<(u8, u8)>,
    pub touched_var_stack: bool,
}

/// The verifier log, kept to its last [`Log::LIMIT`] bytes.
#[derive(Default)]
pub struct Log {
    pub level: u32,
    pub text: String,
}

impl Log {
    pub const LIMIT: usize = 16 << 20;
    pub fn line(&mut self, s: impl FnOnce() -> String) {
        if self.level == 0 {
            return;
        }
        self.text.push_str(&s());
        self.text.push('\n');
        if self.text.len() > Self::LIMIT {
            let cut = self.text.len() - Self::LIMIT / 2;
            let cut = self.text[cut..].find('\n').map_or(cut, |n| cut + n + 1);
            self.text.drain(..cut);
        }
    }
}

pub type Fail = String;

impl<'a> Verifier<'a> {
    pub fn new_id(&mut self) -> u32 {
        self.id_gen += 1;
        self.id_gen
    }

    fn caller_live(&self, callsite: usize) -> RegSet {
        // After the call, r0-r5 are the callee's result and clobbered.
        self.cfg.live.get(callsite + 1).copied().unwrap_or(0) & !0b11_1111
    }

    /// Returns true when the path is pruned.
    fn visit(&mut self, p: &mut Path) -> Result<bool, Fail> {
        let pc = p.pc;
        let live = self.cfg.live[pc];
        let mut looping = false;
        let privileged = self.opts.privileged;
        // At a call of a helper that calls a callback, the callback's repetitions are bounded
        // by the helper: a state there may be pruned by one whose paths are still being
        // explored (the kernel does the same for its callback-calling instructions).
        let ci = self.insns[pc];
        let callback_call = ci.op == OP_CALL && ci.src == 0 && ci.imm == cfg::CALLBACK_HELPER;
        if callback_call {
            // A callback called again: values the callback keeps changing (a sum in its
            // context) are widened to unknown, so that the repetitions converge.
            if let Some(&ci) = self.at[pc].iter().rev().find(|&&ci| self.checkpoints[ci].branches > 0) {
                widen(&self.checkpoints[ci].state, &mut p.state);
            }
        }
        let mut evict = Vec::new();
        let mut pruned = None;
        for (slot, &ci) in self.at[pc].iter().enumerate() {
            let c = &self.checkpoints[ci];
            let caller_live = |cs: usize| self.caller_live(cs);
            if c.branches > 0 && !callback_call {
                looping = true;
                if covers(&c.state, &Precise::everything(), &p.state, live, &caller_live, Mode::Exact, privileged) {
                    return Err(format!("infinite loop detected at insn {pc}"));
                }
            } else if covers(&c.state, &c.precise, &p.state, live, &caller_live, Mode::Subsumes, privileged) {
                pruned = Some(ci);
                self.checkpoints[ci].hits += 1;
                break;
            }
            let c = &mut self.checkpoints[ci];
            c.misses += 1;
            if c.misses > c.hits * 3 + 3 {
                evict.push(slot);
            }
        }
        for slot in evict.into_iter().rev() {
            self.at[pc].remove(slot);
        }
        if let Some(ci) = pruned {
            self.pruned += 1;
            // This path is safe because the stored state's precise scalars cover it: they
            // must be precise on this path too.
            let need = self.checkpoints[ci].precise.clone();
            let history = std::mem::take(&mut p.history);
            self.backtrack(&history, p.parent, p.state.frames.len(), need);
            return Ok(true);
        }
        let add = if looping {
            p.jumps >= 20 || p.insns >= 100
        } else {
            (p.jumps >= 2 && p.insns >= 8)
                || self.cfg.funcs.binary_search(&pc).is_ok()
                || self.cfg.loop_head[pc]
                || callback_call
        };
        if add {
            let ci = self.checkpoints.len();
            self.checkpoints.push(Checkpoint {
                state: p.state.clone(),
                branches: 1,
                parent: p.parent,
                hits: 0,
                misses: 0,
                precise: Precise::default(),
                history: std::mem::take(&mut p.history),
            });
            self.at[pc].push(ci);
            p.parent = Some(ci);
            p.jumps = 0;
            p.insns = 0;
        }
        Ok(false)
    }

    /// Precision backtracking (the kernel's `mark_chain_precision`): the scalars in `need`
    /// (registers of the current frame at the current instruction, stack slots) are needed
    /// precisely; walking back over the path's instructions, find the scalars they came
    /// from and mark them precise in every stored state on the way. Calls and returns
    /// between frames are not followed: the stored states before them get every scalar
    /// marked (as precise as without this analysis).
    fn backtrack(&mut self, history: &[Hist], parent: Option<usize>, depth: usize, mut need: Precise) {
        let mut depth = depth;
        let walk = |need: &mut Precise, hist: &[Hist], depth: usize| {
            for h in hist.iter().rev() {
                if need.all || need.is_empty() {
                    return;
                }
                if h.depth as usize != depth {
                    need.all = true;
                    return;
                }
                reverse(self.insns[h.pc as usize], h, need);
            }
        };
        walk(&mut need, history, depth);
        let mut parent = parent;
        while let Some(ci) = parent {
            if need.is_empty() {
                return;
            }
            let c = &mut self.checkpoints[ci];
            if c.state.frames.len() != depth {
                need.all = true;
                depth = c.state.frames.len();
            }
            if !c.precise.merge(&need) {
                // Already marked here, so in its ancestors too.
                return;
            }
            parent = c.parent;
            let c = &self.checkpoints[ci];
            for h in c.history.iter().rev() {
                if need.all || need.is_empty() {
                    break;
                }
                if h.depth as usize != depth {
                    need.all = true;
                    break;
                }
                reverse(self.insns[h.pc as usize], h, &mut need);
            }
        }
    }

    /// A path ended: its stored ancestors have one unfinished path fewer.
    fn finish(&mut self, mut parent: Option<usize>) {
        while let Some(ci) = parent {
            let c = &mut self.checkpoints[ci];
            c.branches -= 1;
            if c.branches > 0 {
                break;
            }
            parent = c.parent;
        }
    }

    fn initial_state(&self) -> State {
        let mut regs = [Reg::NOT_INIT; 11];
        regs[1] = Reg::pointer(RegType::Ctx);
        regs[10] = Reg::pointer(RegType::Stack);
        State {
            frames: vec![Frame { regs, stack: Stack::default(), callsite: 0, func: 0, callback: false }],
            refs: vec![],
        }
    }

    fn walk(&mut self) -> Result<(), (usize, Fail)> {
        let mut work =
            vec![Path { state: self.initial_state(), pc: 0, parent: None, jumps: 0, insns: 0, history: Vec::new() }];
        self.log.line(|| format!("func#0 @0\n0: {}", work[0].state.describe()));
        while let Some(mut p) = work.pop() {
            loop {
                let pc = p.pc;
                if self.cfg.prune[pc] {
                    match self.visit(&mut p) {
                        Ok(true) => {
                            self.log.line(|| format!("{pc}: safe"));
                            self.finish(p.parent);
                            break;
                        }
                        Ok(false) => {}
                        Err(e) => return Err((pc, e)),
                    }
                }
                self.processed += 1;
                p.insns += 1;
                if self.processed > COMPLEXITY_LIMIT {
                    return Err((pc, format!("BPF program is too large. Processed {} insn", self.processed)));
                }
                let insn = self.insns[pc];
                if self.log.level > 0 {
                    let next = self.insns.get(pc + 1).copied();
                    let text = log_insn(insn, next);
                    self.log.line(|| format!("{pc}: ({:02x}) {text}", insn.op));
                }
                self.touched_slot = None;
                self.touched_var_stack = false;
                let depth = p.state.frames.len();
                let next = match self.step(&mut p.state, pc) {
                    Ok(n) => n,
                    Err(e) => {
                        // The register states where the rule was broken, whatever the log level.
                        self.fail_state = format!("{pc}: {}", p.state.describe());
                        return Err((pc, e));
                    }
                };
                if self.log.level > 1 {
                    let s = p.state.describe();
                    self.log.line(|| format!("{pc}: {s}"));
                }
                if !self.demand.is_empty() {
                    let need = std::mem::take(&mut self.demand);
                    self.backtrack(&p.history, p.parent, depth, need);
                }
                p.history.push(Hist {
                    pc: pc as u32,
                    depth: depth as u8,
                    slot: self.touched_slot,
                    var_stack: self.touched_var_stack,
                });
                if insn.is_jump() {
                    p.jumps += 1;
                }
                match next {
                    Next::Goto(t) => p.pc = t,
                    Next::Fork(t, other, other_pc) => {
                        if let Some(ci) = p.parent {
                            self.checkpoints[ci].branches += 1;
                        }
                        work.push(Path {
                            state: *other,
                            pc: other_pc,
                            parent: p.parent,
                            jumps: p.jumps,
                            insns: p.insns,
                            history: p.history.clone(),
                        });
                        if work.len() > JMP_SEQ_LIMIT {
                            return Err((pc, format!("The sequence of {} jumps is too complex.", work.len())));
                        }
                        p.pc = t;
                    }
                    Next::Done => {
                        self.finish(p.parent);
                        break;
                    }
                }
            }
            if let Some(next) = work.last().filter(|_| self.log.level > 0) {
                let (pc, s) = (next.pc, next.state.describe());
                self.log.line(|| format!("from {} to {pc}: {s}", "?"));
            }
        }
        Ok(())
    }

    /// The kernel's `check_max_stack_depth` (6.13+ on x86-64): along every chain of local
    /// calls, the frames' stack (each rounded up to 16 bytes, as with the JIT) add up to at
    /// most 512 bytes and chains are at most 8 frames deep. As the kernel gives frames of 64
    /// bytes or more a private stack in tracing programs without tail calls, such frames
    /// are not added to the chain's total (userbpf's executors give every frame its own
    /// 512 bytes). A function with a tail call may not be called with 256 bytes or more of
    /// stack in use by its callers.
    fn check_stack_depth(&self) -> Result<(), (usize, Fail)> {
        let has_tail_call = |f: usize| {
            let (start, end) = (self.cfg.funcs[f], self.cfg.func_end(f, self.insns.len()));
            (start..end).any(|pc| self.insns[pc].op == OP_CALL && self.insns[pc].src == 0 && self.insns[pc].imm == 12)
        };
        let private = !(0..self.cfg.funcs.len()).any(has_tail_call);
        let mut stack = vec![(0usize, 0u32, 1usize)];
        let mut seen_chains = 0usize;
        while let Some((f, callers, frames)) = stack.pop() {
            seen_chains += 1;
            if seen_chains > 1 << 16 {
                return Err((0, "too many call chains".into()));
            }
            let start = self.cfg.funcs[f];
            if frames > MAX_CALL_FRAMES {
                return Err((start, format!("the call stack of {frames} frames is too deep !")));
            }
            let d = self.depth[f].div_ceil(16) * 16;
            if f > 0 && has_tail_call(f) && callers >= 256 {
                return Err((
                    start,
                    format!(
                        "tail_calls are not allowed when call stack of previous frames is {callers} bytes. Too large"
                    ),
                ));
            }
            let total = if private && d >= 64 { callers } else { callers + d };
            if total > 512 {
                return Err((start, format!("combined stack size of {frames} calls is {total}. Too large")));
            }
            let end = self.cfg.func_end(f, self.insns.len());
            for pc in start..end {
                let i = self.insns[pc];
                if i.op == OP_CALL && i.src == BPF_PSEUDO_CALL {
                    let g = self.cfg.func_of((pc as i64 + i.imm as i64 + 1) as usize);
                    stack.push((g, total, frames + 1));
                }
            }
        }
        Ok(())
    }
}

/// An instruction as the kernel's log prints it (`print_bpf_insn`) where that differs from
/// llvm-objdump's text: helper and local calls, map loads, memory offsets.
fn log_insn(insn: Insn, next: Option<Insn>) -> String {
    if insn.op == OP_CALL && insn.src == 0 {
        return format!("call {}#{}", crate::helpers::name(insn.imm as u32), insn.imm);
    }
    if insn.op == OP_CALL && insn.src == BPF_PSEUDO_CALL {
        return format!("call pc{:+}", insn.imm);
    }
    if insn.is_lddw() && matches!(insn.src, BPF_PSEUDO_MAP_IDX | BPF_PSEUDO_MAP_FD) {
        return format!("r{} = map[id:{}]", insn.dst, insn.imm);
    }
    if insn.is_lddw() && matches!(insn.src, BPF_PSEUDO_MAP_IDX_VALUE | BPF_PSEUDO_MAP_VALUE) {
        let off = next.map_or(0, |n| n.imm);
        return format!("r{} = map[id:{}][0]+{off}", insn.dst, insn.imm);
    }
    userbpf_isa::disasm::format_insn(insn, next).replace(" + ", " +").replace(" - ", " -")
}

/// What an instruction needs precisely for its results in `need` to be precise (backwards).
fn reverse(insn: Insn, h: &Hist, need: &mut Precise) {
    let bit = |r: u8| 1u16 << r;
    let (d, s) = (insn.dst, insn.src);
    let x = insn.source() == BPF_X;
    match insn.class() {
        BPF_ALU | BPF_ALU64 => {
            if need.regs & bit(d) != 0 {
                if insn.code() == BPF_MOV {
                    need.regs &= !bit(d);
                }
                if x && !matches!(insn.code(), BPF_NEG | BPF_END) {
                    need.regs |= bit(s);
                }
            }
        }
        BPF_LDX => {
            if need.regs & bit(d) != 0 {
                need.regs &= !bit(d);
                if h.var_stack {
                    need.all = true;
                } else if let Some((f, spi)) = h.slot {
                    need.add_slot(f as usize, spi as usize);
                }
            }
        }
        BPF_ST | BPF_STX => {
            if insn.mode() == BPF_ATOMIC {
                if h.var_stack
                    || h.slot.is_some_and(|(f, spi)| need.slot(f as usize, spi as usize))
                    || need.regs & (bit(s) | 1) != 0
                {
                    need.all = true;
                }
            } else if h.var_stack {
                // A store somewhere in a range of slots: its value may be any of them.
                if insn.class() == BPF_STX {
                    need.regs |= bit(s);
                }
            } else if let Some((f, spi)) = h.slot
                && need.slot(f as usize, spi as usize)
            {
                if insn.size() == BPF_DW {
                    need.remove_slot(f as usize, spi as usize);
                }
                if insn.class() == BPF_STX {
                    need.regs |= bit(s);
                }
            }
        }
        BPF_LD => {
            if insn.is_lddw() {
                need.regs &= !bit(d);
            } else {
                need.all = true;
            }
        }
        _ => match insn.code() {
            BPF_CALL => {
                // Helper results are not derived from precise inputs; r1-r5 are clobbered.
                need.regs &= !0b11_1111;
            }
            BPF_EXIT | BPF_JA => {}
            _ => {
                let ops = bit(d) | if x { bit(s) } else { 0 };
                if need.regs & ops != 0 {
                    need.regs |= ops;
                }
            }
        },
    }
}

/// Widens to unknown every scalar of `cur` (register or spill) that `old` does not cover,
/// when the two states have the same frames.
fn widen(old: &State, cur: &mut State) {
    if old.frames.len() != cur.frames.len() {
        return;
    }
    for (of, cf) in old.frames.iter().zip(cur.frames.iter_mut()) {
        if of.callsite != cf.callsite {
            return;
        }
        for (o, c) in of.regs.iter().zip(cf.regs.iter_mut()) {
            if o.is_scalar() && c.is_scalar() && !o.val.contains(&c.val) {
                *c = Reg::unknown();
            }
        }
        for (i, c) in cf.stack.slots.iter_mut().enumerate() {
            let o = of.stack.slot(i);
            if o.is_spill()
                && c.is_spill()
                && o.spilled.is_scalar()
                && c.spilled.is_scalar()
                && !o.spilled.val.contains(&c.spilled.val)
            {
                c.spilled = Reg::unknown();
            }
        }
    }
}

pub fn run(insns: &[Insn], opts: &Options) -> Result<Stats, VerifyError> {
    let err = |insn: usize, message: String, log: String| VerifyError { insn, message, log, insns_processed: 0 };
    if let Err(e) = userbpf_isa::validate::check_program(insns) {
        return Err(err(e.index, e.message, String::new()));
    }
    let cfg = cfg::build(insns).map_err(|(pc, m)| err(pc, m, String::new()))?;
    // Helpers userbpf does not implement are refused where the walk reaches them, as the
    // kernel refuses unknown ones: libbpf's poisoned calls (CO-RE relocations that did not
    // resolve) behind branches on constants never run, and pass.
    let nfuncs = cfg.funcs.len();
    let mut v = Verifier {
        insns,
        opts,
        cfg,
        id_gen: 0,
        depth: vec![0; nfuncs],
        log: Log { level: opts.log_level, text: String::new() },
        checkpoints: Vec::new(),
        at: vec![Vec::new(); insns.len()],
        processed: 0,
        pruned: 0,
        fail_state: String::new(),
        demand: Precise::default(),
        touched_slot: None,
        touched_var_stack: false,
    };
    let result = v.walk().and_then(|()| v.check_stack_depth());
    match result {
        Ok(()) => {
            let states = v.checkpoints.len();
            v.log.line(|| format!("processed {} insns, {} states, {} pruned", v.processed, states, v.pruned));
            Ok(Stats {
                insns_processed: v.processed,
                states,
                pruned: v.pruned,
                stack_depth: v.depth.clone(),
                log: std::mem::take(&mut v.log.text),
            })
        }
        Err((pc, message)) => {
            let m = message.clone();
            if v.log.level == 0 {
                v.log.level = 1;
                let st = std::mem::take(&mut v.fail_state);
                v.log.line(|| st);
            }
            v.log.line(|| m);
            let mut e = err(pc, message, std::mem::take(&mut v.log.text));
            e.insns_processed = v.processed;
            Err(e)
        }
    }
}
