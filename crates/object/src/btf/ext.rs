//! `.BTF.ext`: per-section function info, line info and CO-RE relocation records.
//!
//! Layout (all little-endian): a header `{ magic: u16 = 0xeb9f, version: u8 = 1, flags: u8,
//! hdr_len: u32, func_info_off, func_info_len, line_info_off, line_info_len: u32,
//! [core_relo_off, core_relo_len: u32] }`, offsets counted from the end of the header. Each info
//! block starts with a `u32` record size, followed by per-section groups
//! `{ sec_name_off: u32, num_info: u32, records... }`. Instruction offsets in the object file are
//! in bytes from the start of the ELF section.

use super::{BTF_MAGIC, BtfError, Reader};

/// `struct bpf_func_info`: the BTF `FUNC` describing the function starting at `insn_off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FuncInfo {
    /// Byte offset in the section (in the ELF file), or instruction index once relocated.
    pub insn_off: u32,
    pub type_id: u32,
}

/// `struct bpf_line_info`: source position of the instruction at `insn_off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LineInfo {
    pub insn_off: u32,
    pub file_name_off: u32,
    pub line_off: u32,
    /// `line << 10 | column`.
    pub line_col: u32,
}

impl LineInfo {
    pub fn line(&self) -> u32 {
        self.line_col >> 10
    }
    pub fn column(&self) -> u32 {
        self.line_col & 0x3ff
    }
}

/// `enum bpf_core_relo_kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum CoreReloKind {
    FieldByteOffset = 0,
    FieldByteSize = 1,
    FieldExists = 2,
    FieldSigned = 3,
    FieldLshiftU64 = 4,
    FieldRshiftU64 = 5,
    TypeIdLocal = 6,
    TypeIdTarget = 7,
    TypeExists = 8,
    TypeSize = 9,
    EnumvalExists = 10,
    EnumvalValue = 11,
    TypeMatches = 12,
}

impl CoreReloKind {
    pub fn from_u32(v: u32) -> Option<CoreReloKind> {
        use CoreReloKind::*;
        Some(match v {
            0 => FieldByteOffset,
            1 => FieldByteSize,
            2 => FieldExists,
            3 => FieldSigned,
            4 => FieldLshiftU64,
            5 => FieldRshiftU64,
            6 => TypeIdLocal,
            7 => TypeIdTarget,
            8 => TypeExists,
            9 => TypeSize,
            10 => EnumvalExists,
            11 => EnumvalValue,
            12 => TypeMatches,
            _ => return None,
        })
    }

    /// libbpf's short name (`byte_off`, `field_exists`, ...).
    pub fn name(self) -> &'static str {
        use CoreReloKind::*;
        match self {
            FieldByteOffset => "byte_off",
            FieldByteSize => "byte_sz",
            FieldExists => "field_exists",
            FieldSigned => "signed",
            FieldLshiftU64 => "lshift_u64",
            FieldRshiftU64 => "rshift_u64",
            TypeIdLocal => "local_type_id",
            TypeIdTarget => "target_type_id",
            TypeExists => "type_exists",
            TypeMatches => "type_matches",
            TypeSize => "type_size",
            EnumvalExists => "enumval_exists",
            EnumvalValue => "enumval_value",
        }
    }

    pub fn is_field_based(self) -> bool {
        (self as u32) <= 5
    }
    pub fn is_type_based(self) -> bool {
        matches!(
            self,
            CoreReloKind::TypeIdLocal
                | CoreReloKind::TypeIdTarget
                | CoreReloKind::TypeExists
                | CoreReloKind::TypeMatches
                | CoreReloKind::TypeSize
        )
    }
    pub fn is_enumval_based(self) -> bool {
        matches!(self, CoreReloKind::EnumvalExists | CoreReloKind::EnumvalValue)
    }
}

/// `struct bpf_core_relo`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoreRelo {
    /// Byte offset of the instruction in its ELF section.
    pub insn_off: u32,
    /// Local (object BTF) root type.
    pub type_id: u32,
    /// Offset of the access string ("0:1:2") in the object's BTF strings.
    pub access_str_off: u32,
    pub kind: CoreReloKind,
}

/// The records of one ELF section.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ExtSection<T> {
    /// Offset of the ELF section name in the object's BTF strings.
    pub sec_name_off: u32,
    pub records: Vec<T>,
}

/// Parsed `.BTF.ext`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BtfExt {
    pub func_info: Vec<ExtSection<FuncInfo>>,
    pub line_info: Vec<ExtSection<LineInfo>>,
    pub core_relos: Vec<ExtSection<CoreRelo>>,
}

impl BtfExt {
    /// Parses a `.BTF.ext` section.
    pub fn parse(data: &[u8]) -> Result<BtfExt, BtfError> {
        let bad = |m: String| BtfError::BadExt(m);
        let mut r = Reader::new(data);
        let magic = r.u16().ok_or_else(|| bad("truncated header".into()))?;
        if magic == BTF_MAGIC.swap_bytes() {
            return Err(BtfError::BigEndian);
        }
        if magic != BTF_MAGIC {
            return Err(bad(format!("bad magic {magic:#06x}")));
        }
        let version = r.u8().ok_or_else(|| bad("truncated header".into()))?;
        if version != 1 {
            return Err(bad(format!("unsupported version {version}")));
        }
        let _flags = r.u8().ok_or_else(|| bad("truncated header".into()))?;
        let hdr_len = r.u32().ok_or_else(|| bad("truncated header".into()))? as usize;
        if hdr_len < 24 || hdr_len > data.len() {
            return Err(bad(format!("header length {hdr_len} does not fit {} bytes", data.len())));
        }
        let mut fields = [0u32; 6];
        let nfields = if hdr_len >= 32 { 6 } else { 4 };
        for f in fields.iter_mut().take(nfields) {
            *f = r.u32().ok_or_else(|| bad("truncated header".into()))?;
        }
        let body = &data[hdr_len..];
        let block = |off: u32, len: u32, what: &str| -> Result<&[u8], BtfError> {
            let (off, len) = (off as usize, len as usize);
            let end = off.checked_add(len).ok_or_else(|| bad(format!("{what} overflows")))?;
            body.get(off..end).ok_or_else(|| bad(format!("{what} {off}..{end} beyond {} bytes", body.len())))
        };
        let mut ext = BtfExt::default();
        let fi = block(fields[0], fields[1], "func_info")?;
        ext.func_info = parse_block(fi, 8, "func_info", |r| Some(FuncInfo { insn_off: r.u32()?, type_id: r.u32()? }))?;
        let li = block(fields[2], fields[3], "line_info")?;
        ext.line_info = parse_block(li, 16, "line_info", |r| {
            Some(LineInfo { insn_off: r.u32()?, file_name_off: r.u32()?, line_off: r.u32()?, line_col: r.u32()? })
        })?;
        if nfields == 6 {
            let cr = block(fields[4], fields[5], "core_relo")?;
            let mut bad_kind = None;
            let relos = parse_block(cr, 16, "core_relo", |r| {
                let insn_off = r.u32()?;
                let type_id = r.u32()?;
                let access_str_off = r.u32()?;
                let kind_raw = r.u32()?;
                let kind = match CoreReloKind::from_u32(kind_raw) {
                    Some(k) => k,
                    None => {
                        bad_kind.get_or_insert(kind_raw);
                        CoreReloKind::FieldExists
                    }
                };
                Some(CoreRelo { insn_off, type_id, access_str_off, kind })
            })?;
            if let Some(k) = bad_kind {
                return Err(bad(format!("unknown CO-RE relocation kind {k}")));
            }
            ext.core_relos = relos;
        }
        Ok(ext)
    }
}

/// Parses one info block: a record size, then section groups. `min` is the smallest record size
/// understood; larger records keep their known prefix (as libbpf does).
fn parse_block<T>(
    data: &[u8],
    min: usize,
    what: &str,
    mut rec: impl FnMut(&mut Reader<'_>) -> Option<T>,
) -> Result<Vec<ExtSection<T>>, BtfError> {
    let bad = |m: String| BtfError::BadExt(format!("{what}: {m}"));
    if data.is_empty() {
        return Ok(Vec::new());
    }
    let mut r = Reader::new(data);
    let rec_size = r.u32().ok_or_else(|| bad("missing record size".into()))? as usize;
    if rec_size < min || !rec_size.is_multiple_of(4) {
        return Err(bad(format!("record size {rec_size} is invalid")));
    }
    let mut out = Vec::new();
    while r.remaining() > 0 {
        let sec_name_off = r.u32().ok_or_else(|| bad("truncated section header".into()))?;
        let num = r.u32().ok_or_else(|| bad("truncated section header".into()))? as usize;
        if num == 0 {
            return Err(bad("section with no records".into()));
        }
        let total = num.checked_mul(rec_size).ok_or_else(|| bad("record count overflows".into()))?;
        if total > r.remaining() {
            return Err(bad(format!("{num} records of {rec_size} bytes beyond the data")));
        }
        let mut records = Vec::with_capacity(num);
        for _ in 0..num {
            let start = r.pos();
            let bytes = r.bytes(rec_size).ok_or_else(|| bad("truncated record".into()))?;
            let mut rr = Reader::new(bytes);
            let v = rec(&mut rr).ok_or_else(|| bad(format!("truncated record at {start}")))?;
            records.push(v);
        }
        out.push(ExtSection { sec_name_off, records });
    }
    Ok(out)
}
