//! Tristate numbers: a 64-bit value where each bit is known 0, known 1 or unknown, as the
//! kernel's `tnum` (kernel/bpf/tnum.c). A bit set in `mask` is unknown; a bit clear in `mask`
//! has the value of the same bit of `value`. `value & mask` is always 0.

use std::fmt;

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Tnum {
    pub value: u64,
    pub mask: u64,
}

// `add`, `sub`, `mul` are the kernel's tnum operations (sets of values), not the arithmetic
// the std::ops traits promise.
#[allow(clippy::should_implement_trait)]
impl Tnum {
    /// Every bit unknown.
    pub const UNKNOWN: Tnum = Tnum { value: 0, mask: u64::MAX };

    pub const fn new(value: u64, mask: u64) -> Tnum {
        Tnum { value: value & !mask, mask }
    }

    /// A known constant.
    pub const fn constant(v: u64) -> Tnum {
        Tnum { value: v, mask: 0 }
    }

    /// The smallest tnum holding every value of `[min, max]` (unsigned).
    pub fn range(min: u64, max: u64) -> Tnum {
        let chi = min ^ max;
        let bits = 64 - chi.leading_zeros();
        if bits > 63 {
            return Tnum::UNKNOWN;
        }
        let delta = (1u64 << bits) - 1;
        Tnum::new(min & !delta, delta)
    }

    pub const fn is_const(self) -> bool {
        self.mask == 0
    }

    pub const fn is_unknown(self) -> bool {
        self.mask == u64::MAX
    }

    /// Whether every value of `other` is a value of `self` (the kernel's `tnum_in`).
    pub const fn contains(self, other: Tnum) -> bool {
        if other.mask & !self.mask != 0 {
            return false;
        }
        self.value == other.value & !self.mask
    }

    /// Whether the concrete value `v` is one of `self`'s values.
    pub const fn contains_value(self, v: u64) -> bool {
        v & !self.mask == self.value
    }

    /// Smallest and largest unsigned values.
    pub const fn umin(self) -> u64 {
        self.value
    }
    pub const fn umax(self) -> u64 {
        self.value | self.mask
    }
    /// Smallest and largest signed values.
    pub const fn smin(self) -> i64 {
        (self.value | (self.mask & (1 << 63))) as i64
    }
    pub const fn smax(self) -> i64 {
        (self.value | (self.mask & !(1 << 63))) as i64
    }

    pub fn add(self, b: Tnum) -> Tnum {
        let sm = self.mask.wrapping_add(b.mask);
        let sv = self.value.wrapping_add(b.value);
        let sigma = sm.wrapping_add(sv);
        let chi = sigma ^ sv;
        let mu = chi | self.mask | b.mask;
        Tnum::new(sv & !mu, mu)
    }

    pub fn sub(self, b: Tnum) -> Tnum {
        let dv = self.value.wrapping_sub(b.value);
        let alpha = dv.wrapping_add(self.mask);
        let beta = dv.wrapping_sub(b.mask);
        let chi = alpha ^ beta;
        let mu = chi | self.mask | b.mask;
        Tnum::new(dv & !mu, mu)
    }

    pub fn and(self, b: Tnum) -> Tnum {
        let alpha = self.value | self.mask;
        let beta = b.value | b.mask;
        let v = self.value & b.value;
        Tnum::new(v, alpha & beta & !v)
    }

    pub fn or(self, b: Tnum) -> Tnum {
        let v = self.value | b.value;
        let mu = self.mask | b.mask;
        Tnum::new(v, mu & !v)
    }

    pub fn xor(self, b: Tnum) -> Tnum {
        let v = self.value ^ b.value;
        let mu = self.mask | b.mask;
        Tnum::new(v & !mu, mu)
    }

    /// Multiplication: partial products of the known bits plus the uncertainty each unknown
    /// bit of `self` brings (shift-and-add).
    pub fn mul(self, b: Tnum) -> Tnum {
        let exact = Tnum::constant(self.value.wrapping_mul(b.value));
        let mut acc = Tnum::constant(0);
        let (mut a, mut b) = (self, b);
        while a.value != 0 || a.mask != 0 {
            if a.value & 1 != 0 {
                acc = acc.add(Tnum::new(0, b.mask));
            } else if a.mask & 1 != 0 {
                acc = acc.add(Tnum::new(0, b.value | b.mask));
            }
            a = a.rshift(1);
            b = b.lshift(1);
        }
        exact.add(acc)
    }

    pub const fn lshift(self, s: u32) -> Tnum {
        Tnum { value: self.value << s, mask: self.mask << s }
    }

    pub const fn rshift(self, s: u32) -> Tnum {
        Tnum { value: self.value >> s, mask: self.mask >> s }
    }

    /// Arithmetic right shift of the low `bits` (32 or 64) bits.
    pub const fn arshift(self, s: u32, bits: u32) -> Tnum {
        if bits == 32 {
            Tnum {
                value: ((self.value as u32 as i32) >> s) as u32 as u64,
                mask: ((self.mask as u32 as i32) >> s) as u32 as u64,
            }
        } else {
            Tnum { value: ((self.value as i64) >> s) as u64, mask: ((self.mask as i64) >> s) as u64 }
        }
    }

    /// Values in both (the caller knows they overlap).
    pub const fn intersect(self, b: Tnum) -> Tnum {
        let v = self.value | b.value;
        let mu = self.mask & b.mask;
        Tnum { value: v & !mu, mask: mu }
    }

    /// Truncation to `bytes` bytes (zero-extended).
    pub const fn cast(self, bytes: u32) -> Tnum {
        if bytes >= 8 {
            return self;
        }
        let m = (1u64 << (bytes * 8)) - 1;
        Tnum { value: self.value & m, mask: self.mask & m }
    }

    /// The low 32 bits.
    pub const fn subreg(self) -> Tnum {
        self.cast(4)
    }

    /// The high 32 bits kept, the low 32 bits replaced by those of `sub`.
    pub const fn with_subreg(self, sub: Tnum) -> Tnum {
        let hi = Tnum { value: self.value & !0xffff_ffff, mask: self.mask & !0xffff_ffff };
        let lo = sub.subreg();
        Tnum { value: hi.value | lo.value, mask: hi.mask | lo.mask }
    }

    /// Whether all values are multiples of `size` (a power of two).
    pub const fn is_aligned(self, size: u64) -> bool {
        if size == 0 {
            return true;
        }
        (self.value | self.mask) & (size - 1) == 0
    }
}

impl fmt::Display for Tnum {
    /// The kernel's `tnum_strn`: `(0x0; 0xff)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "({:#x}; {:#x})", self.value, self.mask)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every tnum of `w` bits (3^w of them), and its concrete values.
    fn all(w: u32) -> Vec<(Tnum, Vec<u64>)> {
        let mut out = Vec::new();
        let n = 3u64.pow(w);
        for code in 0..n {
            let (mut v, mut m, mut c) = (0u64, 0u64, code);
            for bit in 0..w {
                match c % 3 {
                    0 => {}
                    1 => v |= 1 << bit,
                    _ => m |= 1 << bit,
                }
                c /= 3;
            }
            let t = Tnum::new(v, m);
            let vals = (0..(1u64 << w)).filter(|&x| t.contains_value(x)).collect();
            out.push((t, vals));
        }
        out
    }

    /// Brute force on 4-bit tnums: the result holds every concrete result (low 4 bits for ops
    /// that carry out of them are checked on full values, which the tnum covers).
    fn check_binop(name: &str, op: impl Fn(Tnum, Tnum) -> Tnum, concrete: impl Fn(u64, u64) -> u64) {
        let ts = all(4);
        for (a, av) in &ts {
            for (b, bv) in &ts {
                let r = op(*a, *b);
                assert_eq!(r.value & r.mask, 0, "{name}: {a} {b} -> {r} not normalised");
                for &x in av {
                    for &y in bv {
                        let c = concrete(x, y);
                        assert!(r.contains_value(c), "{name}: {a} {b} -> {r} misses {x} op {y} = {c:#x}");
                    }
                }
            }
        }
    }

    #[test]
    fn binary_ops_are_sound() {
        check_binop("add", Tnum::add, u64::wrapping_add);
        check_binop("sub", Tnum::sub, u64::wrapping_sub);
        check_binop("and", Tnum::and, |a, b| a & b);
        check_binop("or", Tnum::or, |a, b| a | b);
        check_binop("xor", Tnum::xor, |a, b| a ^ b);
        check_binop("mul", Tnum::mul, u64::wrapping_mul);
    }

    #[test]
    fn add_and_logic_are_exact_on_constants() {
        let c = Tnum::constant;
        assert_eq!(c(5).add(c(7)), c(12));
        assert_eq!(c(5).sub(c(7)), c(5u64.wrapping_sub(7)));
        assert_eq!(c(6).mul(c(7)), c(42));
        assert_eq!(c(0b1100).and(c(0b1010)), c(0b1000));
    }

    #[test]
    fn shifts_casts_and_ranges() {
        for (t, vals) in all(5) {
            for s in 0..5 {
                let l = t.lshift(s);
                let r = t.rshift(s);
                let a32 = Tnum::new(t.value << 27, t.mask << 27).arshift(s, 32);
                for &v in &vals {
                    assert!(l.contains_value(v << s));
                    assert!(r.contains_value(v >> s));
                    assert!(a32.contains_value((((v << 27) as u32 as i32) >> s) as u32 as u64));
                }
            }
        }
        for min in 0..40u64 {
            for max in min..40 {
                let t = Tnum::range(min, max);
                assert!((min..=max).all(|v| t.contains_value(v)), "range {min} {max} -> {t}");
            }
        }
        assert_eq!(Tnum::range(0, u64::MAX), Tnum::UNKNOWN);
        assert_eq!(Tnum::new(0x1_0000_00ff, 0xf00).cast(1), Tnum::new(0xff, 0));
        assert_eq!(Tnum::UNKNOWN.with_subreg(Tnum::constant(3)), Tnum::new(3, 0xffff_ffff_0000_0000));
    }

    #[test]
    fn contains_and_intersect() {
        for (a, av) in all(3) {
            for (b, bv) in all(3) {
                assert_eq!(a.contains(b), bv.iter().all(|v| av.contains(v)), "{a} in {b}");
                let common: Vec<_> = av.iter().filter(|v| bv.contains(v)).collect();
                if !common.is_empty() {
                    let i = a.intersect(b);
                    assert!(common.iter().all(|&&v| i.contains_value(v)));
                }
            }
        }
    }
}
