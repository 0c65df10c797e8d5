//! BTF, the BPF Type Format: a parser for `.BTF` sections and `/sys/kernel/btf/vmlinux`, with
//! safe accessors (type lookup, modifier/typedef resolution, sizes, alignments, member offsets).
//!
//! [`Btf::parse`] checks the whole blob once (header, every type record, every string offset and
//! every type reference), so the accessors below never index out of bounds; functions that follow
//! chains of types (`skip_mods`, `resolve_size`, ...) stop after [`MAX_RESOLVE_DEPTH`] steps and
//! report a loop instead of recursing forever.
//!
//! - [`ext`]: `.BTF.ext` (func_info, line_info, CO-RE relocations).
//! - [`format`](mod@format): printing a value of a BTF type (map keys and values).

pub mod ext;
pub mod format;

use std::fmt;
use thiserror::Error;

/// `BTF_MAGIC` as stored little-endian.
pub const BTF_MAGIC: u16 = 0xeb9f;
/// Longest chain of typedefs/modifiers/arrays followed before a type is declared looping.
pub const MAX_RESOLVE_DEPTH: usize = 32;
/// The largest number of types accepted (the kernel's `BTF_MAX_TYPE`).
pub const MAX_TYPES: usize = 0x000f_ffff;

// BTF_INT_ENCODING bits.
pub const BTF_INT_SIGNED: u8 = 1 << 0;
pub const BTF_INT_CHAR: u8 = 1 << 1;
pub const BTF_INT_BOOL: u8 = 1 << 2;

// BTF_VAR linkage.
pub const BTF_VAR_STATIC: u32 = 0;
pub const BTF_VAR_GLOBAL_ALLOCATED: u32 = 1;
pub const BTF_VAR_GLOBAL_EXTERN: u32 = 2;

// BTF_FUNC linkage.
pub const BTF_FUNC_STATIC: u16 = 0;
pub const BTF_FUNC_GLOBAL: u16 = 1;
pub const BTF_FUNC_EXTERN: u16 = 2;

/// Errors reading or walking BTF.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum BtfError {
    #[error("BTF data is truncated: {0}")]
    Truncated(String),
    #[error("bad BTF magic {0:#06x} (expected 0xeb9f)")]
    BadMagic(u16),
    #[error("BTF is big-endian; only little-endian BTF is supported")]
    BigEndian,
    #[error("unsupported BTF version {0}")]
    BadVersion(u8),
    #[error("bad BTF header: {0}")]
    BadHeader(String),
    #[error("BTF type [{id}]: {msg}")]
    BadType { id: u32, msg: String },
    #[error("BTF type [{0}] does not exist")]
    NoSuchType(u32),
    #[error("BTF string offset {0} is out of range or not terminated")]
    BadString(u32),
    #[error("BTF type [{0}]: chain of types is too long or loops")]
    Loop(u32),
    #[error("BTF type [{id}] ({kind}) has no size")]
    NoSize { id: u32, kind: Kind },
    #[error("BTF type [{0}]: size overflows")]
    Overflow(u32),
    #[error("bad .BTF.ext: {0}")]
    BadExt(String),
}

/// The kind of a BTF type (`BTF_KIND_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    Void = 0,
    Int = 1,
    Ptr = 2,
    Array = 3,
    Struct = 4,
    Union = 5,
    Enum = 6,
    Fwd = 7,
    Typedef = 8,
    Volatile = 9,
    Const = 10,
    Restrict = 11,
    Func = 12,
    FuncProto = 13,
    Var = 14,
    Datasec = 15,
    Float = 16,
    DeclTag = 17,
    TypeTag = 18,
    Enum64 = 19,
}

impl Kind {
    pub fn from_u8(v: u8) -> Option<Kind> {
        use Kind::*;
        Some(match v {
            0 => Void,
            1 => Int,
            2 => Ptr,
            3 => Array,
            4 => Struct,
            5 => Union,
            6 => Enum,
            7 => Fwd,
            8 => Typedef,
            9 => Volatile,
            10 => Const,
            11 => Restrict,
            12 => Func,
            13 => FuncProto,
            14 => Var,
            15 => Datasec,
            16 => Float,
            17 => DeclTag,
            18 => TypeTag,
            19 => Enum64,
            _ => return None,
        })
    }

    /// The name bpftool prints (`STRUCT`, `FUNC_PROTO`, ...).
    pub fn name(self) -> &'static str {
        use Kind::*;
        match self {
            Void => "UNKNOWN",
            Int => "INT",
            Ptr => "PTR",
            Array => "ARRAY",
            Struct => "STRUCT",
            Union => "UNION",
            Enum => "ENUM",
            Fwd => "FWD",
            Typedef => "TYPEDEF",
            Volatile => "VOLATILE",
            Const => "CONST",
            Restrict => "RESTRICT",
            Func => "FUNC",
            FuncProto => "FUNC_PROTO",
            Var => "VAR",
            Datasec => "DATASEC",
            Float => "FLOAT",
            DeclTag => "DECL_TAG",
            TypeTag => "TYPE_TAG",
            Enum64 => "ENUM64",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An `INT` type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IntType {
    /// Byte size of the storage (1, 2, 4, 8 or 16).
    pub size: u32,
    /// `BTF_INT_SIGNED` | `BTF_INT_CHAR` | `BTF_INT_BOOL`.
    pub encoding: u8,
    /// Bit offset of the value within the storage (deprecated bitfield-like ints).
    pub offset: u8,
    /// Number of value bits.
    pub bits: u8,
}

impl IntType {
    pub fn is_signed(&self) -> bool {
        self.encoding & BTF_INT_SIGNED != 0
    }
    pub fn is_bool(&self) -> bool {
        self.encoding & BTF_INT_BOOL != 0
    }
    pub fn is_char(&self) -> bool {
        self.encoding & BTF_INT_CHAR != 0
    }
}

/// An `ARRAY` type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArrayType {
    pub elem_type: u32,
    pub index_type: u32,
    pub nelems: u32,
}

/// A member of a `STRUCT` or `UNION`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Member {
    pub name_off: u32,
    pub type_id: u32,
    /// Offset from the start of the struct, in bits.
    pub bit_offset: u32,
    /// Width of a bitfield member, 0 when the member is not a bitfield.
    pub bitfield_size: u32,
}

/// A `STRUCT` or `UNION`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompositeType {
    pub size: u32,
    pub members: Vec<Member>,
}

/// One enumerator of an `ENUM` or `ENUM64`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EnumValue {
    pub name_off: u32,
    /// The raw value bits (sign-extended from 32 bits for a signed 32-bit `ENUM`).
    pub value: u64,
}

/// An `ENUM` or `ENUM64`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnumType {
    pub size: u32,
    pub signed: bool,
    pub values: Vec<EnumValue>,
}

/// A parameter of a `FUNC_PROTO`. `type_id == 0` with no name marks `...` (varargs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Param {
    pub name_off: u32,
    pub type_id: u32,
}

/// A `FUNC_PROTO`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FuncProtoType {
    pub ret_type: u32,
    pub params: Vec<Param>,
}

/// One variable placement in a `DATASEC`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VarSecinfo {
    pub type_id: u32,
    pub offset: u32,
    pub size: u32,
}

/// A `DATASEC`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatasecType {
    pub size: u32,
    pub vars: Vec<VarSecinfo>,
}

/// The kind-specific part of a BTF type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TypeKind {
    /// Type id 0.
    Void,
    Int(IntType),
    Ptr(u32),
    Array(ArrayType),
    Struct(CompositeType),
    Union(CompositeType),
    Enum(EnumType),
    Fwd {
        is_union: bool,
    },
    Typedef(u32),
    Volatile(u32),
    Const(u32),
    Restrict(u32),
    Func {
        proto: u32,
        linkage: u16,
    },
    FuncProto(FuncProtoType),
    Var {
        type_id: u32,
        linkage: u32,
    },
    Datasec(DatasecType),
    Float {
        size: u32,
    },
    DeclTag {
        type_id: u32,
        component_idx: i32,
    },
    TypeTag(u32),
    Enum64(EnumType),
}

/// One BTF type: its name (string offset) and its kind-specific data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BtfType {
    pub name_off: u32,
    pub kind: TypeKind,
}

impl BtfType {
    pub fn kind(&self) -> Kind {
        match &self.kind {
            TypeKind::Void => Kind::Void,
            TypeKind::Int(_) => Kind::Int,
            TypeKind::Ptr(_) => Kind::Ptr,
            TypeKind::Array(_) => Kind::Array,
            TypeKind::Struct(_) => Kind::Struct,
            TypeKind::Union(_) => Kind::Union,
            TypeKind::Enum(_) => Kind::Enum,
            TypeKind::Fwd { .. } => Kind::Fwd,
            TypeKind::Typedef(_) => Kind::Typedef,
            TypeKind::Volatile(_) => Kind::Volatile,
            TypeKind::Const(_) => Kind::Const,
            TypeKind::Restrict(_) => Kind::Restrict,
            TypeKind::Func { .. } => Kind::Func,
            TypeKind::FuncProto(_) => Kind::FuncProto,
            TypeKind::Var { .. } => Kind::Var,
            TypeKind::Datasec(_) => Kind::Datasec,
            TypeKind::Float { .. } => Kind::Float,
            TypeKind::DeclTag { .. } => Kind::DeclTag,
            TypeKind::TypeTag(_) => Kind::TypeTag,
            TypeKind::Enum64(_) => Kind::Enum64,
        }
    }

    /// The type this one refers to, for kinds that refer to exactly one other type
    /// (PTR, TYPEDEF, modifiers, TYPE_TAG, FUNC, VAR, DECL_TAG, ARRAY element).
    pub fn referenced_type(&self) -> Option<u32> {
        match &self.kind {
            TypeKind::Ptr(t)
            | TypeKind::Typedef(t)
            | TypeKind::Volatile(t)
            | TypeKind::Const(t)
            | TypeKind::Restrict(t)
            | TypeKind::TypeTag(t) => Some(*t),
            TypeKind::Func { proto, .. } => Some(*proto),
            TypeKind::Var { type_id, .. } | TypeKind::DeclTag { type_id, .. } => Some(*type_id),
            TypeKind::Array(a) => Some(a.elem_type),
            _ => None,
        }
    }

    /// CONST, VOLATILE, RESTRICT or TYPE_TAG.
    pub fn is_modifier(&self) -> bool {
        matches!(self.kind, TypeKind::Volatile(_) | TypeKind::Const(_) | TypeKind::Restrict(_) | TypeKind::TypeTag(_))
    }
    pub fn is_composite(&self) -> bool {
        matches!(self.kind, TypeKind::Struct(_) | TypeKind::Union(_))
    }
    pub fn is_any_enum(&self) -> bool {
        matches!(self.kind, TypeKind::Enum(_) | TypeKind::Enum64(_))
    }
    pub fn composite(&self) -> Option<&CompositeType> {
        match &self.kind {
            TypeKind::Struct(c) | TypeKind::Union(c) => Some(c),
            _ => None,
        }
    }
    pub fn enum_type(&self) -> Option<&EnumType> {
        match &self.kind {
            TypeKind::Enum(e) | TypeKind::Enum64(e) => Some(e),
            _ => None,
        }
    }
    pub fn int(&self) -> Option<&IntType> {
        match &self.kind {
            TypeKind::Int(i) => Some(i),
            _ => None,
        }
    }
    pub fn array(&self) -> Option<&ArrayType> {
        match &self.kind {
            TypeKind::Array(a) => Some(a),
            _ => None,
        }
    }
    /// Number of members/values/params/vars (BTF's `vlen`).
    pub fn vlen(&self) -> usize {
        match &self.kind {
            TypeKind::Struct(c) | TypeKind::Union(c) => c.members.len(),
            TypeKind::Enum(e) | TypeKind::Enum64(e) => e.values.len(),
            TypeKind::FuncProto(p) => p.params.len(),
            TypeKind::Datasec(d) => d.vars.len(),
            _ => 0,
        }
    }
}

/// Parsed BTF: the types (index = type id, id 0 is `void`) and the string section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Btf {
    types: Vec<BtfType>,
    strings: Vec<u8>,
}

/// Little-endian reader over a byte slice that reports truncation instead of panicking.
pub(crate) struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(data: &'a [u8]) -> Self {
        Reader { data, pos: 0 }
    }
    pub(crate) fn remaining(&self) -> usize {
        self.data.len().saturating_sub(self.pos)
    }
    pub(crate) fn pos(&self) -> usize {
        self.pos
    }
    pub(crate) fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let b = self.data.get(self.pos..end)?;
        self.pos = end;
        Some(b)
    }
    pub(crate) fn u8(&mut self) -> Option<u8> {
        self.bytes(1).map(|b| b[0])
    }
    pub(crate) fn u16(&mut self) -> Option<u16> {
        self.bytes(2).map(|b| u16::from_le_bytes([b[0], b[1]]))
    }
    pub(crate) fn u32(&mut self) -> Option<u32> {
        self.bytes(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
}

impl Btf {
    /// An empty BTF (only `void`), for building tests.
    pub fn empty() -> Btf {
        Btf { types: vec![BtfType { name_off: 0, kind: TypeKind::Void }], strings: vec![0] }
    }

    /// Parses raw BTF (a `.BTF` section or `/sys/kernel/btf/vmlinux`).
    pub fn parse(data: &[u8]) -> Result<Btf, BtfError> {
        let mut r = Reader::new(data);
        let magic = r.u16().ok_or_else(|| BtfError::Truncated("no header".into()))?;
        if magic == BTF_MAGIC.swap_bytes() {
            return Err(BtfError::BigEndian);
        }
        if magic != BTF_MAGIC {
            return Err(BtfError::BadMagic(magic));
        }
        let version = r.u8().ok_or_else(|| BtfError::Truncated("no header".into()))?;
        if version != 1 {
            return Err(BtfError::BadVersion(version));
        }
        let _flags = r.u8().ok_or_else(|| BtfError::Truncated("no header".into()))?;
        let hdr_len = r.u32().ok_or_else(|| BtfError::Truncated("no header".into()))? as usize;
        let mut fields = [0u32; 4];
        for f in fields.iter_mut() {
            *f = r.u32().ok_or_else(|| BtfError::Truncated("header shorter than 24 bytes".into()))?;
        }
        let [type_off, type_len, str_off, str_len] = fields.map(|v| v as usize);
        if hdr_len < 24 {
            return Err(BtfError::BadHeader(format!("header length {hdr_len} is below 24")));
        }
        if hdr_len > data.len() {
            return Err(BtfError::Truncated(format!("header length {hdr_len} beyond {} bytes", data.len())));
        }
        // Header bytes beyond the known fields must be zero (as the kernel requires).
        if data[24..hdr_len].iter().any(|&b| b != 0) {
            return Err(BtfError::BadHeader("unknown non-zero header fields".into()));
        }
        let body = &data[hdr_len..];
        let section = |off: usize, len: usize, what: &str| -> Result<&[u8], BtfError> {
            let end = off.checked_add(len).ok_or_else(|| BtfError::BadHeader(format!("{what} section overflows")))?;
            body.get(off..end)
                .ok_or_else(|| BtfError::Truncated(format!("{what} section {off}..{end} beyond {} bytes", body.len())))
        };
        let type_data = section(type_off, type_len, "type")?;
        let str_data = section(str_off, str_len, "string")?;
        if type_off % 4 != 0 {
            return Err(BtfError::BadHeader(format!("type section offset {type_off} is not 4-aligned")));
        }
        if !str_data.is_empty() && str_data[0] != 0 {
            return Err(BtfError::BadHeader("string section does not start with an empty string".into()));
        }
        if !str_data.is_empty() && str_data[str_data.len() - 1] != 0 {
            return Err(BtfError::BadHeader("string section is not NUL-terminated".into()));
        }
        let strings = if str_data.is_empty() { vec![0] } else { str_data.to_vec() };
        let mut btf = Btf { types: vec![BtfType { name_off: 0, kind: TypeKind::Void }], strings };
        btf.parse_types(type_data)?;
        btf.validate()?;
        Ok(btf)
    }

    /// Reads and parses a raw BTF file (e.g. `/sys/kernel/btf/vmlinux`).
    pub fn parse_file(path: impl AsRef<std::path::Path>) -> std::io::Result<Result<Btf, BtfError>> {
        let data = std::fs::read(path)?;
        Ok(Btf::parse(&data))
    }

    fn parse_types(&mut self, data: &[u8]) -> Result<(), BtfError> {
        let mut r = Reader::new(data);
        while r.remaining() > 0 {
            let id = self.types.len() as u32;
            if self.types.len() > MAX_TYPES {
                return Err(BtfError::BadType { id, msg: "too many types".into() });
            }
            let trunc = || BtfError::Truncated(format!("type [{id}] record"));
            let name_off = r.u32().ok_or_else(trunc)?;
            let info = r.u32().ok_or_else(trunc)?;
            let size_or_type = r.u32().ok_or_else(trunc)?;
            let vlen = (info & 0xffff) as usize;
            let kind_raw = ((info >> 24) & 0x1f) as u8;
            let kflag = info >> 31 != 0;
            let bad = |msg: String| BtfError::BadType { id, msg };
            let kind = Kind::from_u8(kind_raw).ok_or_else(|| bad(format!("unknown kind {kind_raw}")))?;
            // Refuse entry counts the data cannot hold before allocating for them (FUNC keeps
            // its linkage in vlen, and has no entries).
            let entry_size = match kind {
                Kind::Struct | Kind::Union | Kind::Enum64 | Kind::Datasec => 12,
                Kind::Enum | Kind::FuncProto => 8,
                _ => 0,
            };
            if vlen.saturating_mul(entry_size) > r.remaining() {
                return Err(BtfError::Truncated(format!("type [{id}] has {vlen} entries beyond the data")));
            }
            let t = match kind {
                Kind::Void => return Err(bad("kind UNKNOWN is not allowed".into())),
                Kind::Int => {
                    let v = r.u32().ok_or_else(trunc)?;
                    let it = IntType {
                        size: size_or_type,
                        encoding: ((v >> 24) & 0x0f) as u8,
                        offset: ((v >> 16) & 0xff) as u8,
                        bits: (v & 0xff) as u8,
                    };
                    if !matches!(it.size, 1 | 2 | 4 | 8 | 16) {
                        return Err(bad(format!("INT of size {}", it.size)));
                    }
                    if it.bits == 0 || it.bits as u32 + it.offset as u32 > it.size * 8 {
                        return Err(bad(format!(
                            "INT bits {} + offset {} do not fit {} bytes",
                            it.bits, it.offset, it.size
                        )));
                    }
                    if it.encoding.count_ones() > 1 {
                        return Err(bad(format!("INT encoding {:#x}", it.encoding)));
                    }
                    TypeKind::Int(it)
                }
                Kind::Ptr => TypeKind::Ptr(size_or_type),
                Kind::Array => {
                    let elem_type = r.u32().ok_or_else(trunc)?;
                    let index_type = r.u32().ok_or_else(trunc)?;
                    let nelems = r.u32().ok_or_else(trunc)?;
                    TypeKind::Array(ArrayType { elem_type, index_type, nelems })
                }
                Kind::Struct | Kind::Union => {
                    let mut members = Vec::with_capacity(vlen);
                    for _ in 0..vlen {
                        let name_off = r.u32().ok_or_else(trunc)?;
                        let type_id = r.u32().ok_or_else(trunc)?;
                        let off = r.u32().ok_or_else(trunc)?;
                        let (bit_offset, bitfield_size) = if kflag { (off & 0x00ff_ffff, off >> 24) } else { (off, 0) };
                        members.push(Member { name_off, type_id, bit_offset, bitfield_size });
                    }
                    let c = CompositeType { size: size_or_type, members };
                    if kind == Kind::Struct { TypeKind::Struct(c) } else { TypeKind::Union(c) }
                }
                Kind::Enum => {
                    let mut values = Vec::with_capacity(vlen);
                    for _ in 0..vlen {
                        let name_off = r.u32().ok_or_else(trunc)?;
                        let v = r.u32().ok_or_else(trunc)?;
                        // Keep the 32-bit pattern sign-extended when the enum is signed, so that
                        // `value as i64` is the C value either way.
                        let value = if kflag { v as i32 as i64 as u64 } else { v as u64 };
                        values.push(EnumValue { name_off, value });
                    }
                    if !matches!(size_or_type, 1 | 2 | 4 | 8) {
                        return Err(bad(format!("ENUM of size {size_or_type}")));
                    }
                    TypeKind::Enum(EnumType { size: size_or_type, signed: kflag, values })
                }
                Kind::Enum64 => {
                    let mut values = Vec::with_capacity(vlen);
                    for _ in 0..vlen {
                        let name_off = r.u32().ok_or_else(trunc)?;
                        let lo = r.u32().ok_or_else(trunc)?;
                        let hi = r.u32().ok_or_else(trunc)?;
                        values.push(EnumValue { name_off, value: (lo as u64) | ((hi as u64) << 32) });
                    }
                    if !matches!(size_or_type, 1 | 2 | 4 | 8) {
                        return Err(bad(format!("ENUM64 of size {size_or_type}")));
                    }
                    TypeKind::Enum64(EnumType { size: size_or_type, signed: kflag, values })
                }
                Kind::Fwd => TypeKind::Fwd { is_union: kflag },
                Kind::Typedef => TypeKind::Typedef(size_or_type),
                Kind::Volatile => TypeKind::Volatile(size_or_type),
                Kind::Const => TypeKind::Const(size_or_type),
                Kind::Restrict => TypeKind::Restrict(size_or_type),
                Kind::TypeTag => TypeKind::TypeTag(size_or_type),
                Kind::Func => TypeKind::Func { proto: size_or_type, linkage: vlen as u16 },
                Kind::FuncProto => {
                    let mut params = Vec::with_capacity(vlen);
                    for _ in 0..vlen {
                        let name_off = r.u32().ok_or_else(trunc)?;
                        let type_id = r.u32().ok_or_else(trunc)?;
                        params.push(Param { name_off, type_id });
                    }
                    TypeKind::FuncProto(FuncProtoType { ret_type: size_or_type, params })
                }
                Kind::Var => {
                    let linkage = r.u32().ok_or_else(trunc)?;
                    TypeKind::Var { type_id: size_or_type, linkage }
                }
                Kind::Datasec => {
                    let mut vars = Vec::with_capacity(vlen);
                    for _ in 0..vlen {
                        let type_id = r.u32().ok_or_else(trunc)?;
                        let offset = r.u32().ok_or_else(trunc)?;
                        let size = r.u32().ok_or_else(trunc)?;
                        vars.push(VarSecinfo { type_id, offset, size });
                    }
                    TypeKind::Datasec(DatasecType { size: size_or_type, vars })
                }
                Kind::Float => {
                    if !matches!(size_or_type, 2 | 4 | 8 | 12 | 16) {
                        return Err(bad(format!("FLOAT of size {size_or_type}")));
                    }
                    TypeKind::Float { size: size_or_type }
                }
                Kind::DeclTag => {
                    let component_idx = r.u32().ok_or_else(trunc)? as i32;
                    TypeKind::DeclTag { type_id: size_or_type, component_idx }
                }
            };
            self.types.push(BtfType { name_off, kind: t });
        }
        Ok(())
    }

    /// Checks every string offset and type reference, so accessors can rely on them.
    fn validate(&self) -> Result<(), BtfError> {
        let n = self.types.len() as u32;
        for (id, t) in self.types.iter().enumerate().skip(1) {
            let id = id as u32;
            let bad = |msg: String| BtfError::BadType { id, msg };
            let check_str = |off: u32| -> Result<(), BtfError> {
                if self.str_at(off).is_none() {
                    return Err(BtfError::BadType { id, msg: format!("bad name offset {off}") });
                }
                Ok(())
            };
            let check_ref = |r: u32| -> Result<(), BtfError> {
                if r >= n {
                    return Err(BtfError::BadType { id, msg: format!("refers to missing type [{r}]") });
                }
                Ok(())
            };
            check_str(t.name_off)?;
            match &t.kind {
                TypeKind::Void => return Err(bad("kind UNKNOWN is not allowed".into())),
                TypeKind::Int(_) | TypeKind::Fwd { .. } | TypeKind::Float { .. } => {}
                TypeKind::Ptr(r)
                | TypeKind::Typedef(r)
                | TypeKind::Volatile(r)
                | TypeKind::Const(r)
                | TypeKind::Restrict(r)
                | TypeKind::TypeTag(r) => check_ref(*r)?,
                TypeKind::Func { proto, .. } => {
                    check_ref(*proto)?;
                    if !matches!(self.types.get(*proto as usize).map(|t| &t.kind), Some(TypeKind::FuncProto(_))) {
                        return Err(bad(format!("FUNC refers to [{proto}], which is not a FUNC_PROTO")));
                    }
                }
                TypeKind::Var { type_id, .. } => check_ref(*type_id)?,
                TypeKind::DeclTag { type_id, .. } => check_ref(*type_id)?,
                TypeKind::Array(a) => {
                    check_ref(a.elem_type)?;
                    check_ref(a.index_type)?;
                }
                TypeKind::Struct(c) | TypeKind::Union(c) => {
                    for m in &c.members {
                        check_str(m.name_off)?;
                        check_ref(m.type_id)?;
                    }
                }
                TypeKind::Enum(e) | TypeKind::Enum64(e) => {
                    for v in &e.values {
                        check_str(v.name_off)?;
                    }
                }
                TypeKind::FuncProto(p) => {
                    check_ref(p.ret_type)?;
                    for prm in &p.params {
                        check_str(prm.name_off)?;
                        check_ref(prm.type_id)?;
                    }
                }
                TypeKind::Datasec(d) => {
                    for v in &d.vars {
                        check_ref(v.type_id)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Number of types including `void` (valid ids are `0..len()`).
    pub fn len(&self) -> usize {
        self.types.len()
    }
    /// True when there is no type but `void`.
    pub fn is_empty(&self) -> bool {
        self.types.len() <= 1
    }

    /// The type with this id (id 0 is `void`).
    pub fn type_by_id(&self, id: u32) -> Option<&BtfType> {
        self.types.get(id as usize)
    }

    /// Like [`type_by_id`](Self::type_by_id) but an error for a missing id.
    pub fn get(&self, id: u32) -> Result<&BtfType, BtfError> {
        self.type_by_id(id).ok_or(BtfError::NoSuchType(id))
    }

    pub(crate) fn type_mut(&mut self, id: u32) -> Option<&mut BtfType> {
        self.types.get_mut(id as usize)
    }

    /// Iterates `(id, type)` over every type but `void`.
    pub fn types(&self) -> impl Iterator<Item = (u32, &BtfType)> {
        self.types.iter().enumerate().skip(1).map(|(i, t)| (i as u32, t))
    }

    /// The NUL-terminated string at `off` of the string section; `None` when out of range,
    /// unterminated or not UTF-8.
    pub fn str_at(&self, off: u32) -> Option<&str> {
        let rest = self.strings.get(off as usize..)?;
        let end = rest.iter().position(|&b| b == 0)?;
        std::str::from_utf8(&rest[..end]).ok()
    }

    /// The name of a type ("" for anonymous types and for bad ids).
    pub fn name(&self, id: u32) -> &str {
        self.type_by_id(id).and_then(|t| self.str_at(t.name_off)).unwrap_or("")
    }

    /// A string by offset, "" when bad (offsets are validated at parse time).
    pub fn name_of(&self, off: u32) -> &str {
        self.str_at(off).unwrap_or("")
    }

    /// The first type with this name, of any kind.
    pub fn find_by_name(&self, name: &str) -> Option<u32> {
        self.types().find(|(_, t)| self.name_of(t.name_off) == name).map(|(id, _)| id)
    }

    /// The first type with this name and kind.
    pub fn find_by_name_kind(&self, name: &str, kind: Kind) -> Option<u32> {
        self.types().find(|(_, t)| t.kind() == kind && self.name_of(t.name_off) == name).map(|(id, _)| id)
    }

    /// Follows CONST/VOLATILE/RESTRICT/TYPE_TAG and TYPEDEF to the underlying type id.
    pub fn skip_mods_and_typedefs(&self, id: u32) -> Result<u32, BtfError> {
        let mut cur = id;
        for _ in 0..=MAX_RESOLVE_DEPTH {
            let t = self.get(cur)?;
            if t.is_modifier() || matches!(t.kind, TypeKind::Typedef(_)) {
                cur = t.referenced_type().unwrap_or(0);
            } else {
                return Ok(cur);
            }
        }
        Err(BtfError::Loop(id))
    }

    /// Follows CONST/VOLATILE/RESTRICT/TYPE_TAG only (keeps typedefs).
    pub fn skip_mods(&self, id: u32) -> Result<u32, BtfError> {
        let mut cur = id;
        for _ in 0..=MAX_RESOLVE_DEPTH {
            let t = self.get(cur)?;
            if t.is_modifier() {
                cur = t.referenced_type().unwrap_or(0);
            } else {
                return Ok(cur);
            }
        }
        Err(BtfError::Loop(id))
    }

    /// The underlying type after modifiers and typedefs.
    pub fn resolve(&self, id: u32) -> Result<&BtfType, BtfError> {
        let id = self.skip_mods_and_typedefs(id)?;
        self.get(id)
    }

    /// Byte size of a value of this type (libbpf's `btf__resolve_size`): follows typedefs,
    /// modifiers and VARs, multiplies out arrays. FUNC, FUNC_PROTO, FWD, void and DATASEC
    /// vars without size have none.
    pub fn resolve_size(&self, id: u32) -> Result<u64, BtfError> {
        let mut cur = id;
        let mut nelems: u64 = 1;
        for _ in 0..=MAX_RESOLVE_DEPTH {
            let t = self.get(cur)?;
            let size: u64 = match &t.kind {
                TypeKind::Int(i) => i.size as u64,
                TypeKind::Ptr(_) => 8,
                TypeKind::Struct(c) | TypeKind::Union(c) => c.size as u64,
                TypeKind::Enum(e) | TypeKind::Enum64(e) => e.size as u64,
                TypeKind::Float { size } => *size as u64,
                TypeKind::Datasec(d) => d.size as u64,
                TypeKind::Typedef(r)
                | TypeKind::Volatile(r)
                | TypeKind::Const(r)
                | TypeKind::Restrict(r)
                | TypeKind::TypeTag(r)
                | TypeKind::Var { type_id: r, .. } => {
                    cur = *r;
                    continue;
                }
                TypeKind::Array(a) => {
                    nelems = nelems.checked_mul(a.nelems as u64).ok_or(BtfError::Overflow(id))?;
                    cur = a.elem_type;
                    continue;
                }
                _ => return Err(BtfError::NoSize { id: cur, kind: t.kind() }),
            };
            let total = nelems.checked_mul(size).ok_or(BtfError::Overflow(id))?;
            if total > u32::MAX as u64 {
                return Err(BtfError::Overflow(id));
            }
            return Ok(total);
        }
        Err(BtfError::Loop(id))
    }

    /// Natural alignment of a type (libbpf's `btf__align_of`).
    pub fn align_of(&self, id: u32) -> Result<u64, BtfError> {
        self.align_of_memo(id, 0, &mut std::collections::HashMap::new())
    }

    fn align_of_memo(
        &self,
        id: u32,
        depth: usize,
        memo: &mut std::collections::HashMap<u32, u64>,
    ) -> Result<u64, BtfError> {
        if depth > MAX_RESOLVE_DEPTH {
            return Err(BtfError::Loop(id));
        }
        if let Some(&a) = memo.get(&id) {
            return Ok(a);
        }
        let t = self.get(id)?;
        let a = match &t.kind {
            TypeKind::Int(i) => (i.size as u64).min(8),
            TypeKind::Ptr(_) => 8,
            TypeKind::Enum(e) | TypeKind::Enum64(e) => (e.size as u64).min(8),
            TypeKind::Float { size } => (*size as u64).min(8),
            TypeKind::Typedef(r)
            | TypeKind::Volatile(r)
            | TypeKind::Const(r)
            | TypeKind::Restrict(r)
            | TypeKind::TypeTag(r)
            | TypeKind::Var { type_id: r, .. } => self.align_of_memo(*r, depth + 1, memo)?,
            TypeKind::Array(a) => self.align_of_memo(a.elem_type, depth + 1, memo)?,
            TypeKind::Struct(c) | TypeKind::Union(c) => {
                let mut max = 1;
                let mut packed = false;
                for m in &c.members {
                    let a = self.align_of_memo(m.type_id, depth + 1, memo)?;
                    // A member at an offset not multiple of its alignment means a packed struct.
                    if m.bitfield_size == 0 && a > 0 && !(m.bit_offset as u64).is_multiple_of(8 * a) {
                        packed = true;
                        break;
                    }
                    max = max.max(a);
                }
                if packed || (max > 0 && !(c.size as u64).is_multiple_of(max)) { 1 } else { max }
            }
            _ => return Err(BtfError::NoSize { id, kind: t.kind() }),
        };
        memo.insert(id, a);
        Ok(a)
    }

    /// Members of a struct or union (after typedefs/modifiers), empty for other kinds.
    pub fn members(&self, id: u32) -> &[Member] {
        match self.resolve(id).ok().and_then(|t| t.composite()) {
            Some(c) => &c.members,
            None => &[],
        }
    }

    /// Finds a member by name in a struct/union, descending into anonymous struct/union members.
    /// Returns the member and its bit offset from the start of the outer type.
    pub fn find_member(&self, id: u32, name: &str) -> Option<(Member, u32)> {
        self.find_member_in(id, name, 0, &mut std::collections::HashSet::new())
    }

    fn find_member_in(
        &self,
        id: u32,
        name: &str,
        depth: usize,
        seen: &mut std::collections::HashSet<u32>,
    ) -> Option<(Member, u32)> {
        // A type already searched cannot hold the member (keeps hostile BTF linear).
        if depth > MAX_RESOLVE_DEPTH || !seen.insert(id) {
            return None;
        }
        for m in self.members(id) {
            let mname = self.name_of(m.name_off);
            if mname == name {
                return Some((*m, m.bit_offset));
            }
            if mname.is_empty()
                && let Some((inner, off)) = self.find_member_in(m.type_id, name, depth + 1, seen)
            {
                return Some((inner, off.saturating_add(m.bit_offset)));
            }
        }
        None
    }

    /// A C-like spelling of a type: `struct foo`, `unsigned int`, `char[16]`, `int *`.
    pub fn type_name(&self, id: u32) -> String {
        self.type_name_depth(id, 0)
    }

    fn type_name_depth(&self, id: u32, depth: usize) -> String {
        if depth > MAX_RESOLVE_DEPTH {
            return "...".into();
        }
        let Some(t) = self.type_by_id(id) else {
            return format!("<bad type {id}>");
        };
        let name = self.name_of(t.name_off);
        let named = |prefix: &str| {
            if name.is_empty() { format!("{prefix} (anon)") } else { format!("{prefix} {name}") }
        };
        match &t.kind {
            TypeKind::Void => "void".into(),
            TypeKind::Int(_) | TypeKind::Float { .. } | TypeKind::Typedef(_) => name.to_string(),
            TypeKind::Ptr(r) => format!("{} *", self.type_name_depth(*r, depth + 1)),
            TypeKind::Array(a) => format!("{}[{}]", self.type_name_depth(a.elem_type, depth + 1), a.nelems),
            TypeKind::Struct(_) => named("struct"),
            TypeKind::Union(_) => named("union"),
            TypeKind::Enum(_) | TypeKind::Enum64(_) => named("enum"),
            TypeKind::Fwd { is_union } => named(if *is_union { "union" } else { "struct" }),
            TypeKind::Volatile(r) => format!("volatile {}", self.type_name_depth(*r, depth + 1)),
            TypeKind::Const(r) => format!("const {}", self.type_name_depth(*r, depth + 1)),
            TypeKind::Restrict(r) => format!("{} restrict", self.type_name_depth(*r, depth + 1)),
            TypeKind::TypeTag(r) => self.type_name_depth(*r, depth + 1),
            TypeKind::Func { .. } => format!("func {name}"),
            TypeKind::FuncProto(_) => "func_proto".into(),
            TypeKind::Var { .. } => format!("var {name}"),
            TypeKind::Datasec(_) => format!("datasec {name}"),
            TypeKind::DeclTag { .. } => format!("decl_tag {name}"),
        }
    }

    /// Serialises back to raw little-endian BTF (header, types, strings).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut types = Vec::new();
        let mut put = |v: u32| types.extend_from_slice(&v.to_le_bytes());
        for t in self.types.iter().skip(1) {
            let info = |kind: Kind, vlen: usize, kflag: bool| -> u32 {
                ((kflag as u32) << 31) | ((kind as u32) << 24) | (vlen as u32 & 0xffff)
            };
            put(t.name_off);
            match &t.kind {
                TypeKind::Void => {
                    put(0);
                    put(0);
                }
                TypeKind::Int(i) => {
                    put(info(Kind::Int, 0, false));
                    put(i.size);
                    put(((i.encoding as u32) << 24) | ((i.offset as u32) << 16) | i.bits as u32);
                }
                TypeKind::Ptr(r) => {
                    put(info(Kind::Ptr, 0, false));
                    put(*r);
                }
                TypeKind::Array(a) => {
                    put(info(Kind::Array, 0, false));
                    put(0);
                    put(a.elem_type);
                    put(a.index_type);
                    put(a.nelems);
                }
                TypeKind::Struct(c) | TypeKind::Union(c) => {
                    let kflag = c.members.iter().any(|m| m.bitfield_size != 0);
                    put(info(t.kind(), c.members.len(), kflag));
                    put(c.size);
                    for m in &c.members {
                        put(m.name_off);
                        put(m.type_id);
                        put(if kflag { (m.bitfield_size << 24) | (m.bit_offset & 0xff_ffff) } else { m.bit_offset });
                    }
                }
                TypeKind::Enum(e) => {
                    put(info(Kind::Enum, e.values.len(), e.signed));
                    put(e.size);
                    for v in &e.values {
                        put(v.name_off);
                        put(v.value as u32);
                    }
                }
                TypeKind::Enum64(e) => {
                    put(info(Kind::Enum64, e.values.len(), e.signed));
                    put(e.size);
                    for v in &e.values {
                        put(v.name_off);
                        put(v.value as u32);
                        put((v.value >> 32) as u32);
                    }
                }
                TypeKind::Fwd { is_union } => {
                    put(info(Kind::Fwd, 0, *is_union));
                    put(0);
                }
                TypeKind::Typedef(r)
                | TypeKind::Volatile(r)
                | TypeKind::Const(r)
                | TypeKind::Restrict(r)
                | TypeKind::TypeTag(r) => {
                    put(info(t.kind(), 0, false));
                    put(*r);
                }
                TypeKind::Func { proto, linkage } => {
                    put(info(Kind::Func, *linkage as usize, false));
                    put(*proto);
                }
                TypeKind::FuncProto(p) => {
                    put(info(Kind::FuncProto, p.params.len(), false));
                    put(p.ret_type);
                    for prm in &p.params {
                        put(prm.name_off);
                        put(prm.type_id);
                    }
                }
                TypeKind::Var { type_id, linkage } => {
                    put(info(Kind::Var, 0, false));
                    put(*type_id);
                    put(*linkage);
                }
                TypeKind::Datasec(d) => {
                    put(info(Kind::Datasec, d.vars.len(), false));
                    put(d.size);
                    for v in &d.vars {
                        put(v.type_id);
                        put(v.offset);
                        put(v.size);
                    }
                }
                TypeKind::Float { size } => {
                    put(info(Kind::Float, 0, false));
                    put(*size);
                }
                TypeKind::DeclTag { type_id, component_idx } => {
                    put(info(Kind::DeclTag, 0, false));
                    put(*type_id);
                    put(*component_idx as u32);
                }
            }
        }
        let mut out = Vec::with_capacity(24 + types.len() + self.strings.len());
        out.extend_from_slice(&BTF_MAGIC.to_le_bytes());
        out.push(1);
        out.push(0);
        for v in [24u32, 0, types.len() as u32, types.len() as u32, self.strings.len() as u32] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&types);
        out.extend_from_slice(&self.strings);
        out
    }

    /// Adds a string, returning its offset (for building BTF in tests and tools).
    pub fn add_string(&mut self, s: &str) -> u32 {
        let off = self.strings.len() as u32;
        self.strings.extend_from_slice(s.as_bytes());
        self.strings.push(0);
        off
    }

    /// Appends a type, returning its id (for building BTF in tests and tools). References are
    /// not checked here; [`Btf::parse`] of [`Btf::to_bytes`] checks them.
    pub fn add_type(&mut self, name: &str, kind: TypeKind) -> u32 {
        let name_off = if name.is_empty() { 0 } else { self.add_string(name) };
        self.types.push(BtfType { name_off, kind });
        (self.types.len() - 1) as u32
    }
}

/// The "essential" part of a CO-RE type or field name: everything before a `___flavor` suffix
/// (libbpf's `bpf_core_essential_name_len`): `task_struct___v2` -> `task_struct`.
pub fn essential_name(name: &str) -> &str {
    let b = name.as_bytes();
    let n = b.len();
    if n >= 5 {
        let mut i = n - 5;
        loop {
            if b[i] != b'_' && b[i + 1] == b'_' && b[i + 2] == b'_' && b[i + 3] == b'_' && b[i + 4] != b'_' {
                return &name[..i + 1];
            }
            if i == 0 {
                break;
            }
            i -= 1;
        }
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn essential_names() {
        assert_eq!(essential_name("task_struct___v2"), "task_struct");
        assert_eq!(essential_name("a___b___c"), "a___b");
        assert_eq!(essential_name("foo"), "foo");
        assert_eq!(essential_name("foo____x"), "foo____x");
        assert_eq!(essential_name("___x"), "___x");
        assert_eq!(essential_name(""), "");
    }

    #[test]
    fn roundtrip_and_sizes() {
        let mut b = Btf::empty();
        let int = b.add_type("int", TypeKind::Int(IntType { size: 4, encoding: BTF_INT_SIGNED, offset: 0, bits: 32 }));
        let arr = b.add_type("", TypeKind::Array(ArrayType { elem_type: int, index_type: int, nelems: 3 }));
        let td = b.add_type("arr_t", TypeKind::Typedef(arr));
        let cst = b.add_type("", TypeKind::Const(td));
        let bytes = b.to_bytes();
        let p = Btf::parse(&bytes).unwrap();
        assert_eq!(p, b);
        assert_eq!(p.resolve_size(cst).unwrap(), 12);
        assert_eq!(p.align_of(cst).unwrap(), 4);
        assert_eq!(p.skip_mods_and_typedefs(cst).unwrap(), arr);
        assert_eq!(p.type_name(cst), "const arr_t");
        assert_eq!(p.type_name(arr), "int[3]");
    }

    #[test]
    fn loops_are_reported() {
        let mut b = Btf::empty();
        // [1] typedef a -> [2], [2] typedef b -> [1]
        b.add_type("a", TypeKind::Typedef(2));
        b.add_type("b", TypeKind::Typedef(1));
        let p = Btf::parse(&b.to_bytes()).unwrap();
        assert_eq!(p.skip_mods_and_typedefs(1), Err(BtfError::Loop(1)));
        assert_eq!(p.resolve_size(1), Err(BtfError::Loop(1)));
        assert!(p.align_of(1).is_err());
        assert_eq!(p.type_name(1), "a");
    }

    #[test]
    fn rejects_bad_refs_and_truncation() {
        let mut b = Btf::empty();
        b.add_type("p", TypeKind::Ptr(7));
        assert!(matches!(Btf::parse(&b.to_bytes()), Err(BtfError::BadType { id: 1, .. })));
        let mut ok = Btf::empty();
        ok.add_type("int", TypeKind::Int(IntType { size: 4, encoding: 0, offset: 0, bits: 32 }));
        let bytes = ok.to_bytes();
        for n in 0..bytes.len() {
            assert!(Btf::parse(&bytes[..n]).is_err(), "prefix {n} accepted");
        }
        let mut be = bytes.clone();
        be.swap(0, 1);
        assert_eq!(Btf::parse(&be), Err(BtfError::BigEndian));
    }
}
