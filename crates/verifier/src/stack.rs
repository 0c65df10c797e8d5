//! The stack of one frame: 512 bytes in 8-byte slots, each byte uninitialised, holding
//! unknown data, holding zero, or part of a spilled register (the kernel's `STACK_INVALID`,
//! `STACK_MISC`, `STACK_ZERO`, `STACK_SPILL`).

use crate::reg::{Reg, RegType};
use crate::scalar::Scalar;

/// The kernel's `MAX_BPF_STACK`.
pub const MAX_STACK: i64 = 512;
pub const SLOT: usize = 8;
pub const SLOTS: usize = MAX_STACK as usize / SLOT;

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Byte {
    Invalid,
    Misc,
    Zero,
    Spill,
}

impl Byte {
    /// The kernel's log letters: `?`, `m`, `0`, `r`.
    pub fn letter(self) -> char {
        match self {
            Byte::Invalid => '?',
            Byte::Misc => 'm',
            Byte::Zero => '0',
            Byte::Spill => 'r',
        }
    }
}

/// One 8-byte slot. `spilled` is meaningful when all bytes are [`Byte::Spill`]. `narrow`
/// records a constant of fewer than 8 bytes stored at the start of the slot (the kernel
/// keeps such narrow spills of scalars), so that reading it back gives the constant.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Slot {
    pub bytes: [Byte; SLOT],
    pub spilled: Reg,
    pub narrow: Option<(u8, u64)>,
}

impl Slot {
    pub const EMPTY: Slot = Slot { bytes: [Byte::Invalid; SLOT], spilled: Reg::NOT_INIT, narrow: None };

    pub fn is_spill(&self) -> bool {
        self.bytes.iter().all(|&b| b == Byte::Spill)
    }
}

/// Slots indexed from the top of the frame: slot `i` holds bytes `fp-8*(i+1) .. fp-8*i`.
/// Only slots used so far are stored.
#[derive(Clone, PartialEq, Eq, Hash, Debug, Default)]
pub struct Stack {
    pub slots: Vec<Slot>,
}

/// Slot index and byte index within the slot of the byte at `fp + off` (`off` in -512..0).
pub fn locate(off: i64) -> (usize, usize) {
    let pos = (-off - 1) as usize; // 0 for fp-1
    let slot = pos / SLOT;
    (slot, SLOT - 1 - pos % SLOT)
}

impl Stack {
    pub fn slot(&self, i: usize) -> Slot {
        self.slots.get(i).copied().unwrap_or(Slot::EMPTY)
    }

    /// The slot without copying it (state comparisons read every slot).
    pub fn slot_ref(&self, i: usize) -> &Slot {
        static EMPTY: Slot = Slot::EMPTY;
        self.slots.get(i).unwrap_or(&EMPTY)
    }

    pub fn slot_mut(&mut self, i: usize) -> &mut Slot {
        if self.slots.len() <= i {
            self.slots.resize(i + 1, Slot::EMPTY);
        }
        &mut self.slots[i]
    }

    pub fn byte(&self, off: i64) -> Byte {
        let (s, b) = locate(off);
        self.slot(s).bytes[b]
    }

    /// Writes `size` bytes at `fp + off` that are not a whole spilled register: a spill they
    /// overlap becomes unknown data.
    pub fn write_bytes(&mut self, off: i64, size: i64, kind: Byte) {
        for o in off..off + size {
            let (s, _) = locate(o);
            let slot = self.slot_mut(s);
            slot.narrow = None;
            if slot.is_spill() {
                // Breaking a spill: its other bytes become unknown data.
                let zero = slot.spilled.is_null();
                for b in slot.bytes.iter_mut() {
                    *b = if zero { Byte::Zero } else { Byte::Misc };
                }
                slot.spilled = Reg::NOT_INIT;
            }
        }
        for o in off..off + size {
            let (s, b) = locate(o);
            self.slot_mut(s).bytes[b] = kind;
        }
    }

    /// Spills a register to the aligned slot at `fp + off`.
    pub fn spill(&mut self, off: i64, reg: Reg) {
        let (s, _) = locate(off);
        let slot = self.slot_mut(s);
        slot.bytes = [Byte::Spill; SLOT];
        slot.spilled = reg;
        slot.narrow = None;
    }

    /// Stores a constant of `size` (< 8) bytes at the slot-aligned `fp + off`.
    pub fn store_narrow_const(&mut self, off: i64, size: i64, v: u64) {
        let v = v & ((1u64 << (size * 8)) - 1);
        self.write_bytes(off, size, if v == 0 { Byte::Zero } else { Byte::Misc });
        let (s, _) = locate(off);
        self.slot_mut(s).narrow = Some((size as u8, v));
    }

    /// Reads `size` bytes at `fp + off` (a fixed offset). `Ok(reg)` with the register value
    /// read; `Err(byte offset)` for the first uninitialised byte when those are refused.
    pub fn read(&self, off: i64, size: i64, allow_uninit: bool) -> Result<Reg, ReadError> {
        let (s, first) = locate(off);
        let slot = self.slot(s);
        if slot.is_spill() {
            if size == SLOT as i64 && first == 0 {
                return Ok(slot.spilled);
            }
            if slot.spilled.typ != RegType::Scalar {
                return Err(ReadError::PartialFill);
            }
            if let Some(v) = slot.spilled.val.const_value() {
                // A narrow read of a spilled constant (little endian).
                let shifted = v >> (first * 8);
                let m = if size >= 8 { u64::MAX } else { (1u64 << (size * 8)) - 1 };
                return Ok(Reg::constant(shifted & m));
            }
            return Ok(Reg::scalar(Scalar::unknown_bytes(size as u32)));
        }
        if let Some((n, v)) = slot.narrow
            && first == 0
            && n as i64 == size
        {
            return Ok(Reg::constant(v));
        }
        let mut all_zero = true;
        for o in off..off + size {
            match self.byte(o) {
                Byte::Zero => {}
                Byte::Invalid if !allow_uninit => return Err(ReadError::Uninit(o)),
                _ => all_zero = false,
            }
        }
        if all_zero { Ok(Reg::constant(0)) } else { Ok(Reg::scalar(Scalar::unknown_bytes(size as u32))) }
    }
}

#[derive(Debug, PartialEq, Eq)]
pub enum ReadError {
    /// The byte at this offset was never written.
    Uninit(i64),
    /// Part of a spilled pointer.
    PartialFill,
}
