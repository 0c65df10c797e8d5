//! Register state: the type of what a register holds (its pointer provenance) and, for
//! scalars and the variable part of pointer offsets, a [`Scalar`].

use std::fmt;

use crate::scalar::Scalar;

/// What a register holds, as the kernel's `enum bpf_reg_type` (the subset userbpf's
/// program types and helpers produce).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum RegType {
    /// Never written (reading it is an error).
    NotInit,
    Scalar,
    /// The program's context (`r1` on entry).
    Ctx,
    /// A pointer into the stack of frame [`Reg::frame`] (`fp` plus an offset).
    Stack,
    /// A pointer into a map value of map [`Reg::map`].
    MapValue,
    /// A map lookup's result before its null check.
    MapValueOrNull,
    /// A pointer to a map key (callbacks of `for_each_map_elem`).
    MapKey,
    /// The map itself (`lddw` with a map reference).
    MapPtr,
    /// A lookup's result in a map of maps before its null check: an inner map.
    MapPtrOrNull,
    /// A ring buffer record from `bpf_ringbuf_reserve` (a reference to release).
    RingbufMem,
    RingbufMemOrNull,
    /// Memory a helper returned, [`Reg::mem_size`] bytes.
    Mem,
    MemOrNull,
    /// The address of a subprogram (`lddw` with `BPF_PSEUDO_FUNC`), for callbacks.
    Func,
}

impl RegType {
    /// The kernel's `reg_type_str`.
    pub fn name(self) -> &'static str {
        match self {
            RegType::NotInit => "?",
            RegType::Scalar => "scalar",
            RegType::Ctx => "ctx",
            RegType::Stack => "fp",
            RegType::MapValue => "map_value",
            RegType::MapValueOrNull => "map_value_or_null",
            RegType::MapKey => "map_key",
            RegType::MapPtr => "map_ptr",
            RegType::MapPtrOrNull => "map_ptr_or_null",
            RegType::RingbufMem => "ringbuf_mem",
            RegType::RingbufMemOrNull => "ringbuf_mem_or_null",
            RegType::Mem => "mem",
            RegType::MemOrNull => "mem_or_null",
            RegType::Func => "func",
        }
    }

    pub fn is_pointer(self) -> bool {
        !matches!(self, RegType::NotInit | RegType::Scalar)
    }

    pub fn maybe_null(self) -> bool {
        matches!(self, RegType::MapValueOrNull | RegType::RingbufMemOrNull | RegType::MemOrNull | RegType::MapPtrOrNull)
    }

    /// The type once a null check proved the pointer non-null.
    pub fn non_null(self) -> RegType {
        match self {
            RegType::MapValueOrNull => RegType::MapValue,
            RegType::RingbufMemOrNull => RegType::RingbufMem,
            RegType::MemOrNull => RegType::Mem,
            RegType::MapPtrOrNull => RegType::MapPtr,
            t => t,
        }
    }
}

/// One register.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Reg {
    pub typ: RegType,
    /// Fixed offset of a pointer from the start of its region.
    pub off: i32,
    /// A scalar's value, or the variable part of a pointer's offset.
    pub val: Scalar,
    /// Shared by copies of one map lookup result (so that a null check on one refines them
    /// all) and by copies of one unknown scalar (so that a bounds check refines them all);
    /// 0 for none.
    pub id: u32,
    /// The reference (ring buffer record) this pointer holds; 0 for none.
    pub ref_obj_id: u32,
    /// The map a map pointer or map value pointer belongs to (its key in
    /// [`Options::maps`](crate::Options::maps)).
    pub map: u32,
    /// Size of a [`RegType::Mem`] or ring buffer record region.
    pub mem_size: u32,
    /// Frame a stack pointer points into (0 = the entry function's).
    pub frame: u8,
}

impl Reg {
    pub const NOT_INIT: Reg = Reg {
        typ: RegType::NotInit,
        off: 0,
        val: Scalar::UNKNOWN,
        id: 0,
        ref_obj_id: 0,
        map: 0,
        mem_size: 0,
        frame: 0,
    };

    pub fn scalar(val: Scalar) -> Reg {
        Reg { typ: RegType::Scalar, val, ..Reg::NOT_INIT }
    }

    pub fn unknown() -> Reg {
        Reg::scalar(Scalar::UNKNOWN)
    }

    pub fn constant(v: u64) -> Reg {
        Reg::scalar(Scalar::constant(v))
    }

    /// A pointer of `typ` at fixed offset 0 with no variable part.
    pub fn pointer(typ: RegType) -> Reg {
        Reg { typ, val: Scalar::constant(0), ..Reg::NOT_INIT }
    }

    pub fn is_scalar(&self) -> bool {
        self.typ == RegType::Scalar
    }

    pub fn is_pointer(&self) -> bool {
        self.typ.is_pointer()
    }

    /// A scalar known to be zero (NULL as an argument).
    pub fn is_null(&self) -> bool {
        self.is_scalar() && self.val.const_value() == Some(0)
    }
}

impl fmt::Display for Reg {
    /// As the kernel's verifier log prints a register: `ctx()`, `fp-8`, `scalar(umax=255)`,
    /// `map_value(map=1,ks=4,vs=8,off=8)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.typ {
            RegType::NotInit => write!(f, "?"),
            RegType::Scalar => {
                write!(f, "{}", self.val)?;
                if self.id != 0 && !self.val.is_const() {
                    write!(f, "[id={}]", self.id)?;
                }
                Ok(())
            }
            RegType::Stack if self.val.is_const() => write!(f, "fp{}", self.off as i64 + self.val.var.value as i64),
            t => {
                let mut parts = Vec::new();
                if self.id != 0 {
                    parts.push(format!("id={}", self.id));
                }
                if self.ref_obj_id != 0 {
                    parts.push(format!("ref_obj_id={}", self.ref_obj_id));
                }
                if matches!(
                    t,
                    RegType::MapValue
                        | RegType::MapValueOrNull
                        | RegType::MapPtr
                        | RegType::MapPtrOrNull
                        | RegType::MapKey
                ) {
                    parts.push(format!("map={}", self.map));
                }
                if matches!(t, RegType::Mem | RegType::MemOrNull | RegType::RingbufMem | RegType::RingbufMemOrNull) {
                    parts.push(format!("sz={}", self.mem_size));
                }
                if self.off != 0 {
                    parts.push(format!("off={}", self.off));
                }
                if !self.val.is_const() || self.val.var.value != 0 {
                    parts.push(format!("var={}", self.val));
                }
                write!(f, "{}({})", t.name(), parts.join(","))
            }
        }
    }
}
