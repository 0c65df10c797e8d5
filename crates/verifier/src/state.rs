//! The verifier state on one path: the call frames (registers and stack of each) and the
//! references held, and the comparison that lets the walk prune: a stored state
//! *subsumes* the current one when every register and stack slot the rest of the program
//! may read holds, in the stored state, a superset of what it holds now (the kernel's
//! `states_equal` with `regsafe`/`stacksafe`, ids matched through a map).

use std::fmt::Write;

use crate::cfg::RegSet;
use crate::reg::{Reg, RegType};
use crate::stack::{Byte, Stack};

#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Frame {
    pub regs: [Reg; 11],
    pub stack: Stack,
    /// The call instruction that made this frame (0 for the entry function).
    pub callsite: usize,
    /// Index of the function in [`Cfg::funcs`](crate::cfg::Cfg::funcs).
    pub func: usize,
    /// A `bpf_loop` callback frame: returns to the helper, which may call it again.
    pub callback: bool,
}

/// An acquired reference (a ring buffer record): its id and the instruction that took it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct RefState {
    pub id: u32,
    pub insn: usize,
}

#[derive(Clone, PartialEq, Eq, Debug)]
pub struct State {
    pub frames: Vec<Frame>,
    pub refs: Vec<RefState>,
}

impl State {
    pub fn cur(&self) -> &Frame {
        self.frames.last().expect("a state has a frame")
    }
    pub fn cur_mut(&mut self) -> &mut Frame {
        self.frames.last_mut().expect("a state has a frame")
    }

    /// Applies `f` to every register and spilled register of every frame.
    pub fn for_each_reg(&mut self, mut f: impl FnMut(&mut Reg)) {
        for fr in &mut self.frames {
            for r in fr.regs.iter_mut() {
                f(r);
            }
            for s in fr.stack.slots.iter_mut() {
                if s.is_spill() {
                    f(&mut s.spilled);
                }
            }
        }
    }

    /// The registers of the current frame as the kernel's log prints them
    /// (`R1=ctx() R10=fp0 fp-8=mmmmmmmm`).
    pub fn describe(&self) -> String {
        let mut out = String::new();
        for (i, fr) in self.frames.iter().enumerate() {
            if self.frames.len() > 1 {
                let _ = write!(out, "frame{i}: ");
            }
            for (r, reg) in fr.regs.iter().enumerate() {
                if reg.typ != RegType::NotInit {
                    let _ = write!(out, "R{r}={reg} ");
                }
            }
            for (s, slot) in fr.stack.slots.iter().enumerate() {
                if slot.bytes.iter().all(|&b| b == Byte::Invalid) {
                    continue;
                }
                let off = -8 * (s as i64 + 1);
                if slot.is_spill() {
                    let _ = write!(out, "fp{off}={} ", slot.spilled);
                } else {
                    let letters: String = slot.bytes.iter().map(|b| b.letter()).collect();
                    let _ = write!(out, "fp{off}={letters} ");
                }
            }
        }
        out.trim_end().to_string()
    }
}

/// Which scalars of a stored state the rest of the program's safety depends on (the
/// kernel's precision marks): registers of the innermost frame and stack slots of every
/// frame. Other scalars are compared only by type when pruning. `all`: every scalar.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Precise {
    pub all: bool,
    pub regs: u16,
    /// Slot bit sets by frame.
    pub slots: Vec<u64>,
}

impl Precise {
    pub fn everything() -> Precise {
        Precise { all: true, ..Default::default() }
    }
    pub fn is_empty(&self) -> bool {
        !self.all && self.regs == 0 && self.slots.iter().all(|&s| s == 0)
    }
    pub fn reg(&self, r: usize) -> bool {
        self.all || self.regs & (1 << r) != 0
    }
    pub fn slot(&self, frame: usize, spi: usize) -> bool {
        self.all || self.slots.get(frame).is_some_and(|s| spi < 64 && s & (1 << spi) != 0)
    }
    pub fn add_slot(&mut self, frame: usize, spi: usize) {
        if spi >= 64 {
            self.all = true;
            return;
        }
        if self.slots.len() <= frame {
            self.slots.resize(frame + 1, 0);
        }
        self.slots[frame] |= 1 << spi;
    }
    pub fn remove_slot(&mut self, frame: usize, spi: usize) {
        if let Some(s) = self.slots.get_mut(frame)
            && spi < 64
        {
            *s &= !(1 << spi);
        }
    }
    /// Adds `other`; returns whether anything was new.
    pub fn merge(&mut self, other: &Precise) -> bool {
        let before = self.clone();
        self.all |= other.all;
        self.regs |= other.regs;
        for (f, &s) in other.slots.iter().enumerate() {
            if self.slots.len() <= f {
                self.slots.resize(f + 1, 0);
            }
            self.slots[f] |= s;
        }
        *self != before && !(before.all)
    }
}

/// Consistent renaming of ids between a stored state and the current one (the kernel's
/// `check_ids`): each old id maps to one current id and back.
#[derive(Default)]
pub struct IdMap {
    pairs: Vec<(u32, u32)>,
}

impl IdMap {
    pub fn check(&mut self, old: u32, cur: u32) -> bool {
        if old == 0 && cur == 0 {
            return true;
        }
        if old == 0 || cur == 0 {
            return false;
        }
        for &(o, c) in &self.pairs {
            if o == old || c == cur {
                return o == old && c == cur;
            }
        }
        self.pairs.push((old, cur));
        true
    }
}

/// How two states are compared.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The stored state covers the current one.
    Subsumes,
    /// The states are the same (a loop made no progress).
    Exact,
}

fn reg_safe(old: &Reg, cur: &Reg, ids: &mut IdMap, mode: Mode, privileged: bool, precise: bool) -> bool {
    if mode == Mode::Subsumes && !precise && old.typ == RegType::Scalar && cur.typ == RegType::Scalar {
        // Nothing later depends on this value's range.
        return true;
    }
    if mode == Mode::Exact {
        return old.typ == cur.typ
            && (old.typ == RegType::NotInit
                || (old.off == cur.off
                    && old.val == cur.val
                    && old.map == cur.map
                    && old.mem_size == cur.mem_size
                    && old.frame == cur.frame))
            && ids.check(old.id, cur.id)
            && ids.check(old.ref_obj_id, cur.ref_obj_id);
    }
    match old.typ {
        // Whatever the current register holds, the old path never read it.
        RegType::NotInit => true,
        RegType::Scalar => {
            if cur.typ != RegType::Scalar {
                // A pointer where an unknown scalar was explored: as root a pointer read
                // as a number is allowed, so the unknown scalar covers it.
                return privileged && old.val.is_unknown() && old.id == 0 && cur.typ != RegType::NotInit;
            }
            old.val.contains(&cur.val) && (old.id == 0 || ids.check(old.id, cur.id))
        }
        t => {
            cur.typ == t
                && old.off == cur.off
                && old.map == cur.map
                && old.mem_size == cur.mem_size
                && old.frame == cur.frame
                && old.val.contains(&cur.val)
                && ids.check(old.id, cur.id)
                && ids.check(old.ref_obj_id, cur.ref_obj_id)
        }
    }
}

fn stack_safe(
    old: &Stack,
    cur: &Stack,
    ids: &mut IdMap,
    mode: Mode,
    privileged: bool,
    precise: &dyn Fn(usize) -> bool,
) -> bool {
    let n = old.slots.len().max(cur.slots.len());
    for i in 0..n {
        let (o, c) = (old.slot_ref(i), cur.slot_ref(i));
        if o.narrow.is_some() && o.narrow != c.narrow {
            return false;
        }
        // Equal data (no spilled register, whose ids need mapping) is covered in every mode.
        if o.bytes == c.bytes && o.bytes[0] != Byte::Spill && o.narrow == c.narrow {
            continue;
        }
        if mode == Mode::Exact {
            if o.bytes != c.bytes {
                return false;
            }
            if o.is_spill() && !reg_safe(&o.spilled, &c.spilled, ids, mode, privileged, true) {
                return false;
            }
            continue;
        }
        if o.is_spill() {
            if c.is_spill() {
                if !reg_safe(&o.spilled, &c.spilled, ids, mode, privileged, precise(i)) {
                    return false;
                }
                continue;
            }
            // An unknown (or imprecise) scalar spill covers unknown bytes.
            let all_data =
                c.bytes.iter().all(|&b| matches!(b, Byte::Misc | Byte::Zero) || (b == Byte::Invalid && privileged));
            if o.spilled.typ == RegType::Scalar
                && ((o.spilled.val.is_unknown() && o.spilled.id == 0) || !precise(i))
                && all_data
            {
                continue;
            }
            return false;
        }
        for b in 0..8 {
            let ok = match o.bytes[b] {
                Byte::Invalid => true,
                Byte::Misc => match c.bytes[b] {
                    Byte::Misc | Byte::Zero => true,
                    Byte::Invalid => privileged,
                    Byte::Spill => c.spilled.typ == RegType::Scalar,
                },
                Byte::Zero => c.bytes[b] == Byte::Zero || (c.bytes[b] == Byte::Spill && c.spilled.is_null()),
                Byte::Spill => unreachable!("partial spills are converted to data"),
            };
            if !ok {
                return false;
            }
        }
    }
    true
}

/// Whether `old` (stored at a prune point) covers `cur` (arriving there), looking only at
/// registers in `live` for the current frame and `caller_live[i]` for caller frame `i`.
pub fn covers(
    old: &State,
    precise: &Precise,
    cur: &State,
    live: RegSet,
    caller_live: &dyn Fn(usize) -> RegSet,
    mode: Mode,
    privileged: bool,
) -> bool {
    if old.frames.len() != cur.frames.len() || old.refs.len() != cur.refs.len() {
        return false;
    }
    let mut ids = IdMap::default();
    let last = old.frames.len() - 1;
    for (i, (of, cf)) in old.frames.iter().zip(&cur.frames).enumerate() {
        if of.callsite != cf.callsite || of.callback != cf.callback {
            return false;
        }
        let mask = if i == last { live } else { caller_live(cur.frames[i + 1].callsite) };
        for r in 0..10 {
            // Registers of caller frames are always compared fully.
            let p = i != last || precise.reg(r);
            if mask & (1 << r) != 0 && !reg_safe(&of.regs[r], &cf.regs[r], &mut ids, mode, privileged, p) {
                return false;
            }
        }
        if !stack_safe(&of.stack, &cf.stack, &mut ids, mode, privileged, &|spi| precise.slot(i, spi)) {
            return false;
        }
    }
    old.refs.iter().zip(&cur.refs).all(|(o, c)| ids.check(o.id, c.id))
}
