//! Scalar values as the kernel tracks them: a [`Tnum`] plus signed and unsigned bounds of the
//! full 64-bit value and of its low 32 bits (the subregister). Every transfer function is
//! sound: each concrete result of the operation on concrete operands inside the inputs lies
//! inside the output (unit tests check it by brute force). [`Scalar::sync`] tightens the five
//! views against each other, as the kernel's `reg_bounds_sync`.

use std::fmt;

use crate::tnum::Tnum;

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Scalar {
    pub var: Tnum,
    pub smin: i64,
    pub smax: i64,
    pub umin: u64,
    pub umax: u64,
    pub s32min: i32,
    pub s32max: i32,
    pub u32min: u32,
    pub u32max: u32,
}

/// A comparison a conditional jump makes, as a relation that holds between its operands on
/// one side of the branch.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Rel {
    Eq,
    Ne,
    Ugt,
    Uge,
    Ult,
    Ule,
    Sgt,
    Sge,
    Slt,
    Sle,
    /// `a & b != 0`.
    Set,
    /// `a & b == 0`.
    NotSet,
}

impl Rel {
    /// The relation that holds on the other side of the branch.
    pub fn negate(self) -> Rel {
        use Rel::*;
        match self {
            Eq => Ne,
            Ne => Eq,
            Ugt => Ule,
            Uge => Ult,
            Ult => Uge,
            Ule => Ugt,
            Sgt => Sle,
            Sge => Slt,
            Slt => Sge,
            Sle => Sgt,
            Set => NotSet,
            NotSet => Set,
        }
    }
    /// The same relation with its operands swapped (`a < b` is `b > a`).
    fn swap(self) -> Rel {
        use Rel::*;
        match self {
            Ugt => Ult,
            Uge => Ule,
            Ult => Ugt,
            Ule => Uge,
            Sgt => Slt,
            Sge => Sle,
            Slt => Sgt,
            Sle => Sge,
            r => r,
        }
    }
}

/// Bounds of one width (64 or 32 bits) in a common form: unsigned and signed ranges held in
/// i128 so that sums and products cannot overflow while they are computed.
#[derive(Clone, Copy, Debug)]
struct Bounds {
    umin: i128,
    umax: i128,
    smin: i128,
    smax: i128,
    bits: u32,
}

impl Bounds {
    fn umax_of(bits: u32) -> i128 {
        (1i128 << bits) - 1
    }
    fn smin_of(bits: u32) -> i128 {
        -(1i128 << (bits - 1))
    }
    fn smax_of(bits: u32) -> i128 {
        (1i128 << (bits - 1)) - 1
    }
    fn full_u(&mut self) {
        self.umin = 0;
        self.umax = Self::umax_of(self.bits);
    }
    fn full_s(&mut self) {
        self.smin = Self::smin_of(self.bits);
        self.smax = Self::smax_of(self.bits);
    }
    /// Keeps `[lo, hi]` as the unsigned range if it fits, else the full range.
    fn set_u(&mut self, lo: i128, hi: i128) {
        if lo < 0 || hi > Self::umax_of(self.bits) || lo > hi {
            self.full_u();
        } else {
            self.umin = lo;
            self.umax = hi;
        }
    }
    fn set_s(&mut self, lo: i128, hi: i128) {
        if lo < Self::smin_of(self.bits) || hi > Self::smax_of(self.bits) || lo > hi {
            self.full_s();
        } else {
            self.smin = lo;
            self.smax = hi;
        }
    }
}

/// The ALU operations whose ranges are computed (others give unknown values).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum AluOp {
    Add,
    Sub,
    Mul,
    And,
    Or,
    Xor,
    Lsh,
    Rsh,
    Arsh,
}

impl Scalar {
    pub const UNKNOWN: Scalar = Scalar {
        var: Tnum::UNKNOWN,
        smin: i64::MIN,
        smax: i64::MAX,
        umin: 0,
        umax: u64::MAX,
        s32min: i32::MIN,
        s32max: i32::MAX,
        u32min: 0,
        u32max: u32::MAX,
    };

    pub fn constant(v: u64) -> Scalar {
        Scalar {
            var: Tnum::constant(v),
            smin: v as i64,
            smax: v as i64,
            umin: v,
            umax: v,
            s32min: v as u32 as i32,
            s32max: v as u32 as i32,
            u32min: v as u32,
            u32max: v as u32,
        }
    }

    /// An unknown value of `bytes` bytes, zero-extended (a narrow load).
    pub fn unknown_bytes(bytes: u32) -> Scalar {
        if bytes >= 8 {
            return Scalar::UNKNOWN;
        }
        let mut s = Scalar::UNKNOWN;
        s.var = Tnum::UNKNOWN.cast(bytes);
        s.sync();
        s
    }

    /// An unknown value of `bytes` bytes, sign-extended to 64 bits (`BPF_MEMSX`, `movsx`).
    pub fn unknown_signed(bytes: u32) -> Scalar {
        let bits = bytes * 8;
        let mut s = Scalar::UNKNOWN;
        s.smin = -(1i64 << (bits - 1));
        s.smax = (1i64 << (bits - 1)) - 1;
        s.sync();
        s
    }

    pub fn is_const(&self) -> bool {
        self.var.is_const()
    }

    /// The value, when known.
    pub fn const_value(&self) -> Option<u64> {
        self.var.is_const().then_some(self.var.value)
    }

    pub fn is_unknown(&self) -> bool {
        *self == Scalar::UNKNOWN
    }

    /// Whether the concrete value `v` is a value of `self`.
    pub fn contains_value(&self, v: u64) -> bool {
        self.var.contains_value(v)
            && (self.umin..=self.umax).contains(&v)
            && (self.smin..=self.smax).contains(&(v as i64))
            && (self.u32min..=self.u32max).contains(&(v as u32))
            && (self.s32min..=self.s32max).contains(&(v as u32 as i32))
    }

    /// Whether every value of `other` is a value of `self` (the kernel's `range_within` plus
    /// `tnum_in`).
    pub fn contains(&self, other: &Scalar) -> bool {
        self.umin <= other.umin
            && self.umax >= other.umax
            && self.smin <= other.smin
            && self.smax >= other.smax
            && self.u32min <= other.u32min
            && self.u32max >= other.u32max
            && self.s32min <= other.s32min
            && self.s32max >= other.s32max
            && self.var.contains(other.var)
    }

    fn bounds(&self, bits: u32) -> Bounds {
        if bits == 64 {
            Bounds {
                umin: self.umin as i128,
                umax: self.umax as i128,
                smin: self.smin as i128,
                smax: self.smax as i128,
                bits,
            }
        } else {
            Bounds {
                umin: self.u32min as i128,
                umax: self.u32max as i128,
                smin: self.s32min as i128,
                smax: self.s32max as i128,
                bits,
            }
        }
    }

    fn set_bounds(&mut self, b: Bounds) {
        if b.bits == 64 {
            self.umin = b.umin as u64;
            self.umax = b.umax as u64;
            self.smin = b.smin as i64;
            self.smax = b.smax as i64;
        } else {
            self.u32min = b.umin as u32;
            self.u32max = b.umax as u32;
            self.s32min = b.smin as i32;
            self.s32max = b.smax as i32;
        }
    }

    /// Tightens the tnum and the four ranges against each other. Returns false when they
    /// have no value in common (an impossible state: a branch that cannot be taken).
    pub fn sync(&mut self) -> bool {
        for _ in 0..2 {
            if !self.sync_once() {
                return false;
            }
        }
        true
    }

    fn empty(&self) -> bool {
        self.umin > self.umax || self.smin > self.smax || self.u32min > self.u32max || self.s32min > self.s32max
    }

    fn sync_once(&mut self) -> bool {
        // Bounds from the tnum.
        let t = self.var;
        self.umin = self.umin.max(t.umin());
        self.umax = self.umax.min(t.umax());
        self.smin = self.smin.max(t.smin());
        self.smax = self.smax.min(t.smax());
        let t32 = t.subreg();
        self.u32min = self.u32min.max(t32.value as u32);
        self.u32max = self.u32max.min((t32.value | t32.mask) as u32);
        self.s32min = self.s32min.max((t32.value | (t32.mask & 0x8000_0000)) as u32 as i32);
        self.s32max = self.s32max.min((t32.value | (t32.mask & 0x7fff_ffff)) as u32 as i32);
        if self.empty() {
            return false;
        }
        // Signed and unsigned views of one width agree when the range does not cross the
        // sign boundary.
        if (self.umin as i64) <= (self.umax as i64) {
            self.smin = self.smin.max(self.umin as i64);
            self.smax = self.smax.min(self.umax as i64);
        }
        if (self.smin as u64) <= (self.smax as u64) {
            self.umin = self.umin.max(self.smin as u64);
            self.umax = self.umax.min(self.smax as u64);
        }
        if (self.u32min as i32) <= (self.u32max as i32) {
            self.s32min = self.s32min.max(self.u32min as i32);
            self.s32max = self.s32max.min(self.u32max as i32);
        }
        if (self.s32min as u32) <= (self.s32max as u32) {
            self.u32min = self.u32min.max(self.s32min as u32);
            self.u32max = self.u32max.min(self.s32max as u32);
        }
        if self.empty() {
            return false;
        }
        // 64 -> 32: when the upper halves of the bounds agree, the low halves bound the
        // subregister.
        if self.umin >> 32 == self.umax >> 32 {
            self.u32min = self.u32min.max(self.umin as u32);
            self.u32max = self.u32max.min(self.umax as u32);
            if (self.umin as u32 as i32) <= (self.umax as u32 as i32) {
                self.s32min = self.s32min.max(self.umin as u32 as i32);
                self.s32max = self.s32max.min(self.umax as u32 as i32);
            }
        }
        if self.smin >> 32 == self.smax >> 32 {
            self.u32min = self.u32min.max(self.smin as u32);
            self.u32max = self.u32max.min(self.smax as u32);
            if (self.smin as u32 as i32) <= (self.smax as u32 as i32) {
                self.s32min = self.s32min.max(self.smin as u32 as i32);
                self.s32max = self.s32max.min(self.smax as u32 as i32);
            }
        }
        if self.empty() {
            return false;
        }
        // 32 -> 64: a value at least `umin` whose low half is at least `u32min` is at least
        // umin's upper half joined to `u32min` (likewise for the maximum and signed bounds).
        const HI: u64 = !0xffff_ffff;
        self.umin = self.umin.max((self.umin & HI) | self.u32min as u64);
        self.umax = self.umax.min((self.umax & HI) | self.u32max as u64);
        self.smin = self.smin.max(((self.smin as u64 & HI) | self.u32min as u64) as i64);
        self.smax = self.smax.min(((self.smax as u64 & HI) | self.u32max as u64) as i64);
        if self.empty() {
            return false;
        }
        // The tnum from the bounds.
        let from_u = Tnum::range(self.umin, self.umax);
        if !overlap(self.var, from_u) {
            return false;
        }
        self.var = self.var.intersect(from_u);
        let from_u32 = Tnum::range(self.u32min as u64, self.u32max as u64);
        if !overlap(self.var.subreg(), from_u32) {
            return false;
        }
        self.var = self.var.with_subreg(self.var.subreg().intersect(from_u32));
        true
    }

    /// The low 32 bits, zero-extended: the result of every 32-bit ALU operation.
    pub fn zext32(&self) -> Scalar {
        let mut s = Scalar::UNKNOWN;
        s.var = self.var.subreg();
        s.u32min = self.u32min;
        s.u32max = self.u32max;
        s.s32min = self.s32min;
        s.s32max = self.s32max;
        s.umin = self.u32min as u64;
        s.umax = self.u32max as u64;
        s.sync();
        s
    }

    /// `self op b` on 64 bits (`alu64`) or on the low 32 bits, zero-extended (`alu32`).
    /// Shifts must have a constant amount below the width (the caller checks; others give
    /// an unknown value).
    pub fn alu(&self, op: AluOp, b: &Scalar, alu64: bool) -> Scalar {
        let mut r = Scalar::UNKNOWN;
        let bits: u32 = if alu64 { 64 } else { 32 };
        let shift = b.const_value().filter(|&s| s < bits as u64).map(|s| s as u32);
        if matches!(op, AluOp::Lsh | AluOp::Rsh | AluOp::Arsh) && shift.is_none() {
            return if alu64 { Scalar::UNKNOWN } else { Scalar::UNKNOWN.zext32() };
        }
        // The tnum.
        let (ta, tb) = if alu64 { (self.var, b.var) } else { (self.var.subreg(), b.var.subreg()) };
        let t = match op {
            AluOp::Add => ta.add(tb),
            AluOp::Sub => ta.sub(tb),
            AluOp::Mul => ta.mul(tb),
            AluOp::And => ta.and(tb),
            AluOp::Or => ta.or(tb),
            AluOp::Xor => ta.xor(tb),
            AluOp::Lsh => ta.lshift(shift.unwrap_or(0)),
            AluOp::Rsh => ta.rshift(shift.unwrap_or(0)),
            AluOp::Arsh => ta.arshift(shift.unwrap_or(0), bits),
        };
        r.var = if alu64 { t } else { t.subreg() };
        // The ranges: those of the operation's width, and for 64-bit operations whose low
        // half depends on the low halves only, the 32-bit ranges as well.
        let widths: &[u32] = match (alu64, op) {
            (false, _) => &[32],
            (true, AluOp::Rsh | AluOp::Arsh) => &[64],
            (true, _) => &[64, 32],
        };
        for &w in widths {
            let x = self.bounds(w);
            let y = b.bounds(w);
            let tw = if w == 64 { r.var } else { r.var.subreg() };
            let mut o = x;
            o.full_u();
            o.full_s();
            match op {
                AluOp::Add => {
                    o.set_u(x.umin + y.umin, x.umax + y.umax);
                    o.set_s(x.smin + y.smin, x.smax + y.smax);
                }
                AluOp::Sub => {
                    o.set_u(x.umin - y.umax, x.umax - y.umin);
                    o.set_s(x.smin - y.smax, x.smax - y.smin);
                }
                AluOp::Mul => {
                    o.set_u(x.umin * y.umin, x.umax * y.umax);
                    let p = [x.smin * y.smin, x.smin * y.smax, x.smax * y.smin, x.smax * y.smax];
                    o.set_s(*p.iter().min().unwrap_or(&0), *p.iter().max().unwrap_or(&0));
                }
                AluOp::And => {
                    o.set_u(tw.value as i128, x.umax.min(y.umax));
                    match (x.smin >= 0, y.smin >= 0) {
                        (true, true) => o.set_s(0, x.smax.min(y.smax)),
                        (true, false) => o.set_s(0, x.smax),
                        (false, true) => o.set_s(0, y.smax),
                        _ => {}
                    }
                }
                AluOp::Or => {
                    o.set_u(x.umin.max(y.umin), (tw.value | tw.mask) as i128);
                    if x.smin >= 0 && y.smin >= 0 {
                        o.set_s(x.smin.max(y.smin), (tw.value | tw.mask) as i128);
                    }
                }
                AluOp::Xor => {
                    o.set_u(tw.value as i128, (tw.value | tw.mask) as i128);
                    if x.smin >= 0 && y.smin >= 0 {
                        o.set_s(0, (tw.value | tw.mask) as i128);
                    }
                }
                AluOp::Lsh => {
                    let s = shift.unwrap_or(0);
                    o.set_u(x.umin << s, x.umax << s);
                }
                AluOp::Rsh => {
                    let s = shift.unwrap_or(0);
                    o.set_u(x.umin >> s, x.umax >> s);
                }
                AluOp::Arsh => {
                    let s = shift.unwrap_or(0);
                    o.set_s(x.smin >> s, x.smax >> s);
                }
            }
            r.set_bounds(o);
        }
        if alu64 {
            r.sync();
            r
        } else {
            // Bounds of the 64-bit view come from the zero-extended subregister.
            r.sync();
            r.zext32()
        }
    }

    /// Sign extension of the low `bytes` bytes (`movsx`, `ldxs`).
    pub fn sign_extend(&self, bytes: u32) -> Scalar {
        let bits = bytes * 8;
        let lo = -(1i64 << (bits - 1));
        let hi = (1i64 << (bits - 1)) - 1;
        if self.smin >= lo && self.smax <= hi {
            return *self;
        }
        Scalar::unknown_signed(bytes)
    }

    /// Refines `a` and `b` with the knowledge that `a rel b` holds, on the full values or on
    /// their low 32 bits (`jmp32`). Returns false when it cannot hold.
    pub fn refine(a: &mut Scalar, b: &mut Scalar, rel: Rel, is32: bool) -> bool {
        let w = if is32 { 32 } else { 64 };
        let (mut x, mut y) = (a.bounds(w), b.bounds(w));
        let (ta, tb) = if is32 { (a.var.subreg(), b.var.subreg()) } else { (a.var, b.var) };
        let (mut nta, mut ntb) = (ta, tb);
        let swapped = matches!(rel, Rel::Ult | Rel::Ule | Rel::Slt | Rel::Sle);
        if swapped {
            std::mem::swap(&mut x, &mut y);
        }
        match if swapped { rel.swap() } else { rel } {
            Rel::Eq => {
                if !overlap(ta, tb) {
                    return false;
                }
                let t = ta.intersect(tb);
                nta = t;
                ntb = t;
                let (lo, hi) = (x.umin.max(y.umin), x.umax.min(y.umax));
                let (slo, shi) = (x.smin.max(y.smin), x.smax.min(y.smax));
                if lo > hi || slo > shi {
                    return false;
                }
                x.umin = lo;
                x.umax = hi;
                x.smin = slo;
                x.smax = shi;
                y = x;
            }
            Rel::Ne => {
                if let (Some(c), Some(d)) = (const_of(ta), const_of(tb))
                    && c == d
                {
                    return false;
                }
                let (ox, oy) = (x, y);
                ne_adjust(&mut x, &oy);
                ne_adjust(&mut y, &ox);
            }
            Rel::Ugt => {
                x.umin = x.umin.max(y.umin + 1);
                y.umax = y.umax.min(x.umax - 1);
            }
            Rel::Uge => {
                x.umin = x.umin.max(y.umin);
                y.umax = y.umax.min(x.umax);
            }
            Rel::Sgt => {
                x.smin = x.smin.max(y.smin + 1);
                y.smax = y.smax.min(x.smax - 1);
            }
            Rel::Sge => {
                x.smin = x.smin.max(y.smin);
                y.smax = y.smax.min(x.smax);
            }
            Rel::Set => {
                if let Some(c) = const_of(tb) {
                    if ta.and(Tnum::constant(c)).umax() == 0 {
                        return false;
                    }
                    if c.is_power_of_two() {
                        nta = ta.or(Tnum::constant(c));
                    }
                }
            }
            Rel::NotSet => {
                if let Some(c) = const_of(tb) {
                    if ta.value & c != 0 {
                        return false;
                    }
                    nta = ta.and(Tnum::constant(!c));
                }
            }
            Rel::Ult | Rel::Ule | Rel::Slt | Rel::Sle => unreachable!("swapped above"),
        }
        if swapped {
            std::mem::swap(&mut x, &mut y);
        }
        if x.umin > x.umax || x.smin > x.smax || y.umin > y.umax || y.smin > y.smax {
            return false;
        }
        for (s, bnd, t) in [(&mut *a, x, nta), (&mut *b, y, ntb)] {
            s.set_bounds(bnd);
            s.var = if is32 { s.var.with_subreg(t) } else { t };
            if !s.sync() {
                return false;
            }
        }
        true
    }

    /// Whether the branch `a rel b` is always taken (`Some(true)`), never (`Some(false)`) or
    /// either way (`None`).
    pub fn branch_taken(a: &Scalar, b: &Scalar, rel: Rel, is32: bool) -> Option<bool> {
        let can = |r: Rel| {
            let (mut x, mut y) = (*a, *b);
            Scalar::refine(&mut x, &mut y, r, is32)
        };
        match (can(rel), can(rel.negate())) {
            (true, false) => Some(true),
            (false, true) => Some(false),
            _ => None,
        }
    }
}

/// `p != q` with `q` a constant: a bound of `p` equal to it moves by one.
fn ne_adjust(p: &mut Bounds, q: &Bounds) {
    if q.umin == q.umax {
        if p.umin == q.umin {
            p.umin += 1;
        }
        if p.umax == q.umin {
            p.umax -= 1;
        }
    }
    if q.smin == q.smax {
        if p.smin == q.smin {
            p.smin += 1;
        }
        if p.smax == q.smin {
            p.smax -= 1;
        }
    }
}

fn const_of(t: Tnum) -> Option<u64> {
    t.is_const().then_some(t.value)
}

/// Whether two tnums have a value in common (their known bits agree).
fn overlap(a: Tnum, b: Tnum) -> bool {
    (a.value ^ b.value) & !(a.mask | b.mask) == 0
}

impl fmt::Display for Scalar {
    /// As the kernel's log: the constant, `scalar()` when nothing is known, else the
    /// non-trivial bounds and the tnum.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(v) = self.const_value() {
            return write!(f, "{}", v as i64);
        }
        let mut parts = Vec::new();
        if self.smin != i64::MIN {
            parts.push(format!("smin={}", self.smin));
        }
        if self.smax != i64::MAX {
            parts.push(format!("smax={}", self.smax));
        }
        if self.umin != 0 {
            parts.push(format!("umin={}", self.umin));
        }
        if self.umax != u64::MAX {
            parts.push(format!("umax={}", self.umax));
        }
        if self.s32min != i32::MIN {
            parts.push(format!("smin32={}", self.s32min));
        }
        if self.s32max != i32::MAX {
            parts.push(format!("smax32={}", self.s32max));
        }
        if self.u32min != 0 {
            parts.push(format!("umin32={}", self.u32min));
        }
        if self.u32max != u32::MAX {
            parts.push(format!("umax32={}", self.u32max));
        }
        if !self.var.is_unknown() {
            parts.push(format!("var_off={}", self.var));
        }
        write!(f, "scalar({})", parts.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small pseudo-random generator (xorshift) for reproducible tests.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        /// Values near the interesting edges: small, near 2^32, near 2^63, near 2^64.
        fn value(&mut self) -> u64 {
            let base = [0u64, 1 << 31, 1 << 32, 1 << 63, 0u64.wrapping_sub(64), 0xffff_ffff_0000_0000]
                [(self.next() % 6) as usize];
            base.wrapping_add(self.next() % 64).wrapping_sub(16)
        }
    }

    /// An abstract value built from a few concrete values (joined), with those values.
    fn sample(rng: &mut Rng) -> (Scalar, Vec<u64>) {
        let n = 1 + rng.next() % 4;
        let vals: Vec<u64> = (0..n).map(|_| rng.value()).collect();
        let mut s = Scalar::constant(vals[0]);
        for &v in &vals[1..] {
            s = join(&s, &Scalar::constant(v));
        }
        (s, vals)
    }

    fn join(a: &Scalar, b: &Scalar) -> Scalar {
        let mut s = Scalar {
            var: {
                let mu = a.var.mask | b.var.mask | (a.var.value ^ b.var.value);
                Tnum::new(a.var.value, mu)
            },
            smin: a.smin.min(b.smin),
            smax: a.smax.max(b.smax),
            umin: a.umin.min(b.umin),
            umax: a.umax.max(b.umax),
            s32min: a.s32min.min(b.s32min),
            s32max: a.s32max.max(b.s32max),
            u32min: a.u32min.min(b.u32min),
            u32max: a.u32max.max(b.u32max),
        };
        assert!(s.sync());
        s
    }

    fn concrete(op: AluOp, a: u64, b: u64, alu64: bool) -> u64 {
        if alu64 {
            match op {
                AluOp::Add => a.wrapping_add(b),
                AluOp::Sub => a.wrapping_sub(b),
                AluOp::Mul => a.wrapping_mul(b),
                AluOp::And => a & b,
                AluOp::Or => a | b,
                AluOp::Xor => a ^ b,
                AluOp::Lsh => a << (b & 63),
                AluOp::Rsh => a >> (b & 63),
                AluOp::Arsh => ((a as i64) >> (b & 63)) as u64,
            }
        } else {
            let (a, b) = (a as u32, b as u32);
            (match op {
                AluOp::Add => a.wrapping_add(b),
                AluOp::Sub => a.wrapping_sub(b),
                AluOp::Mul => a.wrapping_mul(b),
                AluOp::And => a & b,
                AluOp::Or => a | b,
                AluOp::Xor => a ^ b,
                AluOp::Lsh => a << (b & 31),
                AluOp::Rsh => a >> (b & 31),
                AluOp::Arsh => ((a as i32) >> (b & 31)) as u32,
            }) as u64
        }
    }

    #[test]
    fn alu_is_sound() {
        let mut rng = Rng(0x1234_5678_9abc_def1);
        let ops = [
            AluOp::Add,
            AluOp::Sub,
            AluOp::Mul,
            AluOp::And,
            AluOp::Or,
            AluOp::Xor,
            AluOp::Lsh,
            AluOp::Rsh,
            AluOp::Arsh,
        ];
        for _ in 0..20000 {
            let (a, av) = sample(&mut rng);
            let op = ops[(rng.next() % ops.len() as u64) as usize];
            let alu64 = rng.next().is_multiple_of(2);
            let (b, bv) = if matches!(op, AluOp::Lsh | AluOp::Rsh | AluOp::Arsh) {
                let s = rng.next() % if alu64 { 64 } else { 32 };
                (Scalar::constant(s), vec![s])
            } else {
                sample(&mut rng)
            };
            let r = a.alu(op, &b, alu64);
            for &x in &av {
                for &y in &bv {
                    let c = concrete(op, x, y, alu64);
                    assert!(
                        r.contains_value(c),
                        "{op:?} alu64={alu64}: {a} op {b} = {r} misses {x:#x} op {y:#x} = {c:#x}"
                    );
                }
            }
        }
    }

    #[test]
    fn refine_is_sound() {
        let mut rng = Rng(0xdead_beef_cafe_f00d);
        let rels = [
            Rel::Eq,
            Rel::Ne,
            Rel::Ugt,
            Rel::Uge,
            Rel::Ult,
            Rel::Ule,
            Rel::Sgt,
            Rel::Sge,
            Rel::Slt,
            Rel::Sle,
            Rel::Set,
            Rel::NotSet,
        ];
        for _ in 0..20000 {
            let (a, av) = sample(&mut rng);
            let (b, bv) = if rng.next().is_multiple_of(2) {
                sample(&mut rng)
            } else {
                let v = rng.value();
                (Scalar::constant(v), vec![v])
            };
            let rel = rels[(rng.next() % rels.len() as u64) as usize];
            let is32 = rng.next().is_multiple_of(3);
            let (mut ra, mut rb) = (a, b);
            let ok = Scalar::refine(&mut ra, &mut rb, rel, is32);
            for &x in &av {
                for &y in &bv {
                    let (cx, cy) = if is32 { (x as u32 as u64, y as u32 as u64) } else { (x, y) };
                    let (sx, sy) =
                        if is32 { (cx as u32 as i32 as i64, cy as u32 as i32 as i64) } else { (cx as i64, cy as i64) };
                    let holds = match rel {
                        Rel::Eq => cx == cy,
                        Rel::Ne => cx != cy,
                        Rel::Ugt => cx > cy,
                        Rel::Uge => cx >= cy,
                        Rel::Ult => cx < cy,
                        Rel::Ule => cx <= cy,
                        Rel::Sgt => sx > sy,
                        Rel::Sge => sx >= sy,
                        Rel::Slt => sx < sy,
                        Rel::Sle => sx <= sy,
                        Rel::Set => cx & cy != 0,
                        Rel::NotSet => cx & cy == 0,
                    };
                    if holds {
                        assert!(ok, "{rel:?} is32={is32}: {a} vs {b} said impossible, but {x:#x} {y:#x}");
                        assert!(
                            ra.contains_value(x) && rb.contains_value(y),
                            "{rel:?} is32={is32}: {a} vs {b} -> {ra} / {rb} lost {x:#x} {y:#x}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn bounds_transfer_examples() {
        let c = Scalar::constant;
        assert_eq!(c(3).alu(AluOp::Add, &c(4), true), c(7));
        let byte = Scalar::unknown_bytes(1);
        assert_eq!((byte.umin, byte.umax), (0, 255));
        let shifted = byte.alu(AluOp::Lsh, &c(3), true);
        assert_eq!((shifted.umin, shifted.umax, shifted.var), (0, 255 << 3, Tnum::new(0, 0x7f8)));
        let masked = Scalar::UNKNOWN.alu(AluOp::And, &c(0x3f), true);
        assert_eq!((masked.smin, masked.umax), (0, 0x3f));
        // Unsigned comparison bounds both sides.
        let (mut x, mut k) = (Scalar::UNKNOWN, c(16));
        assert!(Scalar::refine(&mut x, &mut k, Rel::Ult, false));
        assert_eq!((x.umin, x.umax, x.smin, x.smax), (0, 15, 0, 15));
        // A signed check alone leaves the unsigned range open on the negative side.
        let (mut y, mut k) = (Scalar::UNKNOWN, c(16));
        assert!(Scalar::refine(&mut y, &mut k, Rel::Slt, false));
        assert_eq!(y.smax, 15);
        assert_eq!(y.smin, i64::MIN);
        assert_eq!(Scalar::branch_taken(&x, &c(16), Rel::Ult, false), Some(true));
        assert_eq!(Scalar::branch_taken(&x, &c(3), Rel::Ult, false), None);
        // 32-bit alu zero-extends.
        let w = Scalar::UNKNOWN.alu(AluOp::Add, &c(1), false);
        assert_eq!((w.umin, w.umax), (0, u32::MAX as u64));
    }
}
