//! Printing a value of a BTF type: map keys and values, global variables.
//!
//! Two renderings of the same walk:
//!
//! - [`format_value`]: one line of C-like text, the format `userbpf map dump` uses:
//!   - structs and unions: `{ .pid = 42, .comm = "bash", .inner = { .x = 1 } }` (`{}` when
//!     empty); members of anonymous struct/union members are shown inline in the parent, as C
//!     lets you name them; a union shows every member, as bpftool does;
//!   - arrays: `[1, 2, 3]`; a `char` array holding a NUL-terminated printable string (bpftool's
//!     rule: printable ASCII up to a NUL that lies inside the array) prints as `"bash"`;
//!   - integers in decimal, signed or unsigned as their type says (`char` is an integer);
//!     `bool` as `true`/`false`; 128-bit integers in hex (`0x...`);
//!   - enums by enumerator name, or the number when no enumerator matches;
//!   - bitfields by value (sign-extended when their type is signed, named for enum bitfields);
//!   - pointers in hex (`0x7ffd5000`, `0x0` for NULL);
//!   - floats with Rust's shortest round-trip form (`0.5`, `1e100`); `long double` in hex bytes;
//!   - a DATASEC (a whole `.data`/`.bss` map value) as `{ .var = value, ... }`.
//! - [`to_json`]: a `serde_json::Value` following bpftool's `-j` output (objects, arrays,
//!   numbers, strings for enum names and char arrays, pointers as numbers), except that
//!   bitfields are numbers (bpftool prints them as hex strings), anonymous members are inlined,
//!   and DATASECs are objects keyed by variable name.

use super::{Btf, BtfError, Kind, MAX_RESOLVE_DEPTH, TypeKind};
use serde_json::{Map, Number, Value as Json};
use thiserror::Error;

/// Deepest nesting of aggregates followed (protects against self-containing types).
const MAX_NESTING: usize = 64;

/// Errors printing a value.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum FormatError {
    #[error("value of type {type_name} needs {need} bytes, got {got}")]
    Size { type_name: String, need: u64, got: usize },
    #[error("type [{0}] cannot be printed: {1}")]
    Unprintable(u32, String),
    #[error(transparent)]
    Btf(#[from] BtfError),
}

/// A decoded value, before rendering.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Signed(i64),
    Unsigned(u64),
    /// A number too wide for 64 bits (`__int128`, wide bitfields): its hex digits.
    Wide(String),
    Bool(bool),
    F32(f32),
    F64(f64),
    /// `long double` and other unusual floats: raw bytes.
    RawFloat(Vec<u8>),
    Str(String),
    Enum(String),
    Ptr(u64),
    List(Vec<Value>),
    Fields(Vec<(String, Value)>),
}

/// Prints `data` as a value of `type_id`, on one line (see the module docs for the format).
pub fn format_value(btf: &Btf, type_id: u32, data: &[u8]) -> Result<String, FormatError> {
    let v = decode(btf, type_id, data)?;
    let mut s = String::new();
    render_text(&v, &mut s);
    Ok(s)
}

/// Decodes `data` as a value of `type_id` into JSON (see the module docs).
pub fn to_json(btf: &Btf, type_id: u32, data: &[u8]) -> Result<Json, FormatError> {
    Ok(render_json(&decode(btf, type_id, data)?))
}

/// Decodes `data` as a value of `type_id`. `data` must hold at least the type's size.
pub fn decode(btf: &Btf, type_id: u32, data: &[u8]) -> Result<Value, FormatError> {
    let need = btf.resolve_size(type_id)?;
    if (data.len() as u64) < need {
        return Err(FormatError::Size { type_name: btf.type_name(type_id), need, got: data.len() });
    }
    let budget = (data.len().saturating_mul(16)).max(1 << 16);
    Decoder { btf, budget: std::cell::Cell::new(budget) }.value(type_id, data, 0)
}

struct Decoder<'a> {
    btf: &'a Btf,
    /// Values left to decode: bounds the work on types whose members overlap (unions,
    /// hostile BTF) to a multiple of the data size.
    budget: std::cell::Cell<usize>,
}

fn slice_at(data: &[u8], off: u64, len: u64, id: u32) -> Result<&[u8], FormatError> {
    let end = off.checked_add(len).ok_or_else(|| FormatError::Unprintable(id, "offset overflows".into()))?;
    if end > data.len() as u64 {
        return Err(FormatError::Unprintable(
            id,
            format!("member at bytes {off}..{end} lies beyond the {} bytes of its container", data.len()),
        ));
    }
    Ok(&data[off as usize..end as usize])
}

/// Reads up to 16 little-endian bytes as an unsigned number.
fn le_uint(bytes: &[u8]) -> u128 {
    let mut v: u128 = 0;
    for (i, b) in bytes.iter().take(16).enumerate() {
        v |= (*b as u128) << (8 * i);
    }
    v
}

/// Extracts `bits` bits starting at `bit_off` (little-endian bit numbering) of `data`.
fn extract_bits(data: &[u8], bit_off: u64, bits: u32, id: u32) -> Result<u128, FormatError> {
    if bits == 0 || bits > 128 {
        return Err(FormatError::Unprintable(id, format!("bitfield of {bits} bits")));
    }
    let first = bit_off / 8;
    let shift = (bit_off % 8) as u32;
    let nbytes = (shift as u64 + bits as u64).div_ceil(8);
    let bytes = slice_at(data, first, nbytes, id)?;
    // Up to 17 bytes may be involved (shift + 128 bits); assemble with a u128 pair.
    let lo = le_uint(&bytes[..bytes.len().min(16)]);
    let hi = if bytes.len() > 16 { bytes[16] as u128 } else { 0 };
    let mut v = lo >> shift;
    if shift > 0 {
        v |= hi << (128 - shift);
    }
    if bits < 128 {
        v &= (1u128 << bits) - 1;
    }
    Ok(v)
}

fn int_value(v: u128, bits: u32, signed: bool) -> Value {
    if signed {
        let sv: i128 = if bits < 128 && v >> (bits - 1) & 1 == 1 { (v as i128) - (1i128 << bits) } else { v as i128 };
        match i64::try_from(sv) {
            Ok(x) => Value::Signed(x),
            Err(_) => Value::Wide(format!("{:x}", sv as u128)),
        }
    } else {
        match u64::try_from(v) {
            Ok(x) => Value::Unsigned(x),
            Err(_) => Value::Wide(format!("{v:x}")),
        }
    }
}

impl Decoder<'_> {
    fn spend(&self, id: u32) -> Result<(), FormatError> {
        match self.budget.get().checked_sub(1) {
            Some(b) => {
                self.budget.set(b);
                Ok(())
            }
            None => Err(FormatError::Unprintable(id, "value has too many parts to print".into())),
        }
    }

    fn value(&self, id: u32, data: &[u8], depth: usize) -> Result<Value, FormatError> {
        if depth > MAX_NESTING {
            return Err(FormatError::Unprintable(id, "nesting too deep".into()));
        }
        self.spend(id)?;
        let rid = self.btf.skip_mods_and_typedefs(id)?;
        let t = self.btf.get(rid)?;
        match &t.kind {
            TypeKind::Int(it) => {
                let size = it.size as u64;
                if it.offset != 0 || it.bits as u64 != size * 8 {
                    let v = extract_bits(data, it.offset as u64, it.bits as u32, rid)?;
                    return Ok(int_value(v, it.bits as u32, it.is_signed()));
                }
                let bytes = slice_at(data, 0, size, rid)?;
                let raw = le_uint(bytes);
                if it.is_bool() {
                    return Ok(Value::Bool(raw != 0));
                }
                Ok(int_value(raw, it.bits as u32, it.is_signed()))
            }
            TypeKind::Ptr(_) => {
                let bytes = slice_at(data, 0, 8, rid)?;
                Ok(Value::Ptr(le_uint(bytes) as u64))
            }
            TypeKind::Enum(e) | TypeKind::Enum64(e) => {
                let bytes = slice_at(data, 0, e.size as u64, rid)?;
                Ok(self.enum_value(rid, le_uint(bytes), e.size * 8))
            }
            TypeKind::Float { size } => {
                let bytes = slice_at(data, 0, *size as u64, rid)?;
                Ok(match *size {
                    4 => Value::F32(f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])),
                    8 => Value::F64(f64::from_le_bytes(bytes.try_into().unwrap_or([0; 8]))),
                    _ => Value::RawFloat(bytes.to_vec()),
                })
            }
            TypeKind::Array(a) => {
                let elem_size = self.btf.resolve_size(a.elem_type)?;
                if let Some(s) = self.str_array(a.elem_type, a.nelems, data)? {
                    return Ok(Value::Str(s));
                }
                if elem_size == 0 {
                    // Elements without bytes (arrays of empty structs) carry no value.
                    return Ok(Value::List(Vec::new()));
                }
                let mut items = Vec::with_capacity(a.nelems.min(1 << 16) as usize);
                for i in 0..a.nelems as u64 {
                    let off = i * elem_size;
                    let sub = slice_at(data, off, elem_size, rid)?;
                    items.push(self.value(a.elem_type, sub, depth + 1)?);
                }
                Ok(Value::List(items))
            }
            TypeKind::Struct(_) | TypeKind::Union(_) => {
                let mut fields = Vec::new();
                self.fields(rid, data, depth, &mut fields)?;
                Ok(Value::Fields(fields))
            }
            TypeKind::Datasec(d) => {
                let mut fields = Vec::with_capacity(d.vars.len());
                for v in &d.vars {
                    let sub = slice_at(data, v.offset as u64, v.size as u64, rid)?;
                    let name = self.btf.name(v.type_id).to_string();
                    let inner = match self.btf.get(v.type_id)?.kind {
                        TypeKind::Var { type_id, .. } => type_id,
                        _ => v.type_id,
                    };
                    fields.push((name, self.value(inner, sub, depth + 1)?));
                }
                Ok(Value::Fields(fields))
            }
            TypeKind::Var { type_id, .. } => self.value(*type_id, data, depth + 1),
            other => Err(FormatError::Unprintable(rid, format!("{} has no printable value", kind_of(other)))),
        }
    }

    fn enum_value(&self, id: u32, raw: u128, bits: u32) -> Value {
        let Some(e) = self.btf.type_by_id(id).and_then(|t| t.enum_type()) else {
            return Value::Unsigned(raw as u64);
        };
        let mask: u64 = if bits >= 64 { u64::MAX } else { (1u64 << bits) - 1 };
        for v in &e.values {
            if v.value & mask == (raw as u64) & mask {
                return Value::Enum(self.btf.name_of(v.name_off).to_string());
            }
        }
        int_value(raw, bits, e.signed)
    }

    /// bpftool's `is_str_array`: a char array whose bytes up to a NUL inside it are printable.
    fn str_array(&self, elem: u32, nelems: u32, data: &[u8]) -> Result<Option<String>, FormatError> {
        if nelems == 0 {
            return Ok(None);
        }
        // Modifiers are skipped, typedefs are not (a typedef of char is not a string).
        let eid = self.btf.skip_mods(elem)?;
        let et = self.btf.get(eid)?;
        let Some(it) = et.int() else { return Ok(None) };
        if it.size != 1 || !(it.is_char() || self.btf.name_of(et.name_off) == "char") {
            return Ok(None);
        }
        let bytes = &data[..data.len().min(nelems as usize)];
        for (i, &b) in bytes.iter().enumerate() {
            if b == 0 {
                return Ok(Some(String::from_utf8_lossy(&bytes[..i]).into_owned()));
            }
            if !(0x20..0x7f).contains(&b) {
                return Ok(None);
            }
        }
        Ok(None)
    }

    fn fields(&self, id: u32, data: &[u8], depth: usize, out: &mut Vec<(String, Value)>) -> Result<(), FormatError> {
        if depth > MAX_NESTING {
            return Err(FormatError::Unprintable(id, "nesting too deep".into()));
        }
        let t = self.btf.get(id)?;
        let Some(c) = t.composite() else { return Ok(()) };
        for m in &c.members {
            self.spend(id)?;
            let name = self.btf.name_of(m.name_off);
            if m.bitfield_size > 0 {
                let raw = extract_bits(data, m.bit_offset as u64, m.bitfield_size, id)?;
                let mt = self.btf.resolve(m.type_id)?;
                let v = match &mt.kind {
                    TypeKind::Int(it) if it.is_bool() => Value::Bool(raw != 0),
                    TypeKind::Int(it) => int_value(raw, m.bitfield_size, it.is_signed()),
                    TypeKind::Enum(_) | TypeKind::Enum64(_) => {
                        let rid = self.btf.skip_mods_and_typedefs(m.type_id)?;
                        self.enum_value(rid, raw, m.bitfield_size)
                    }
                    _ => int_value(raw, m.bitfield_size, false),
                };
                out.push((name.to_string(), v));
                continue;
            }
            if m.bit_offset % 8 != 0 {
                return Err(FormatError::Unprintable(id, format!("member `{name}` is not byte-aligned")));
            }
            let size = self.btf.resolve_size(m.type_id)?;
            let sub = slice_at(data, m.bit_offset as u64 / 8, size, id)?;
            let mid = self.btf.skip_mods_and_typedefs(m.type_id)?;
            if name.is_empty() && self.btf.get(mid)?.is_composite() {
                // Anonymous struct/union: its members read as members of this one.
                self.fields(mid, sub, depth + 1, out)?;
            } else {
                out.push((name.to_string(), self.value(m.type_id, sub, depth + 1)?));
            }
        }
        Ok(())
    }
}

fn kind_of(k: &TypeKind) -> Kind {
    super::BtfType { name_off: 0, kind: k.clone() }.kind()
}

fn escape_into(s: &str, out: &mut String) {
    out.push('"');
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

fn render_text(v: &Value, out: &mut String) {
    match v {
        Value::Signed(x) => out.push_str(&x.to_string()),
        Value::Unsigned(x) => out.push_str(&x.to_string()),
        Value::Wide(h) => {
            out.push_str("0x");
            out.push_str(h);
        }
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::F32(f) => out.push_str(&format!("{f:?}")),
        Value::F64(f) => out.push_str(&format!("{f:?}")),
        Value::RawFloat(b) => {
            out.push_str("0x");
            for byte in b.iter().rev() {
                out.push_str(&format!("{byte:02x}"));
            }
        }
        Value::Str(s) => escape_into(s, out),
        Value::Enum(n) => out.push_str(n),
        Value::Ptr(p) => out.push_str(&format!("{p:#x}")),
        Value::List(items) => {
            out.push('[');
            for (i, it) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                render_text(it, out);
            }
            out.push(']');
        }
        Value::Fields(fields) => {
            if fields.is_empty() {
                out.push_str("{}");
                return;
            }
            out.push_str("{ ");
            for (i, (name, it)) in fields.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                out.push('.');
                out.push_str(name);
                out.push_str(" = ");
                render_text(it, out);
            }
            out.push_str(" }");
        }
    }
}

fn render_json(v: &Value) -> Json {
    match v {
        Value::Signed(x) => Json::Number((*x).into()),
        Value::Unsigned(x) => Json::Number((*x).into()),
        Value::Wide(h) => Json::String(format!("0x{h}")),
        Value::Bool(b) => Json::Bool(*b),
        Value::F32(f) => Number::from_f64(*f as f64).map(Json::Number).unwrap_or_else(|| Json::String(f.to_string())),
        Value::F64(f) => Number::from_f64(*f).map(Json::Number).unwrap_or_else(|| Json::String(f.to_string())),
        Value::RawFloat(_) => {
            let mut s = String::new();
            render_text(v, &mut s);
            Json::String(s)
        }
        Value::Str(s) | Value::Enum(s) => Json::String(s.clone()),
        Value::Ptr(p) => Json::Number((*p).into()),
        Value::List(items) => Json::Array(items.iter().map(render_json).collect()),
        Value::Fields(fields) => {
            let mut m = Map::new();
            for (name, it) in fields {
                m.insert(name.clone(), render_json(it));
            }
            Json::Object(m)
        }
    }
}

// Keep the depth constant of the parent module in sight: aggregates nest deeper than typedef
// chains, so the printer uses its own bound.
const _: () = assert!(MAX_NESTING >= MAX_RESOLVE_DEPTH);
