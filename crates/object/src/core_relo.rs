//! CO-RE ("compile once, run everywhere") relocations from `.BTF.ext`, resolved as libbpf
//! resolves them (`relo_core.c`):
//!
//! 1. The access string (`"0:1:2"`) is parsed against the local (object) type into a spec: the
//!    named fields and array indices it goes through, and the bit offset it reaches.
//! 2. Candidate target types are the target BTF's types whose name equals the local root type's
//!    name once `___flavor` suffixes are dropped, with a compatible kind (same kind; any two
//!    enums). Without a target BTF the only candidate is the local type itself (identity).
//! 3. Each candidate is matched: fields by name (looking through anonymous members), arrays by
//!    index within bounds, field types checked for compatibility. All matching candidates must
//!    agree on the result, otherwise the relocation is refused as ambiguous.
//! 4. The instruction is patched (ALU immediate, load/store offset and size, or `lddw` value),
//!    after checking it holds the value computed for the local type. When nothing matched,
//!    existence relocations give 0 and the others poison the instruction into
//!    `call 0xbad2310`, as libbpf does, so that only code actually reached fails.

use crate::btf::ext::{CoreRelo, CoreReloKind};
use crate::btf::{BTF_INT_SIGNED, Btf, TypeKind, essential_name};
use std::collections::HashMap;
use userbpf_isa::{
    BPF_ALU, BPF_ALU64, BPF_B, BPF_CALL, BPF_DW, BPF_H, BPF_JMP, BPF_K, BPF_LD, BPF_LDX, BPF_ST, BPF_STX, BPF_W, Insn,
};

/// Longest access string accepted (libbpf's `BPF_CORE_SPEC_MAX_LEN`).
pub const SPEC_MAX_LEN: usize = 64;
/// Recursion budget for type compatibility checks.
const MAX_LEVEL: i32 = 32;
/// Steps allowed to one compatibility check (bounds the work on hostile BTF).
const MAX_STEPS: u32 = 1 << 16;

fn step(budget: &mut u32) -> Result<(), String> {
    *budget = budget.checked_sub(1).ok_or("types too complex to compare")?;
    Ok(())
}

/// A field or array-element step of a spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accessor {
    /// The struct/union holding the field, or the array element type.
    pub type_id: u32,
    /// Field index or array index.
    pub idx: u32,
    /// Field (or enumerator) name; `None` for array accesses.
    pub name: Option<String>,
}

/// A parsed or matched relocation spec.
#[derive(Debug, Clone)]
pub struct Spec<'a> {
    pub btf: &'a Btf,
    pub root_type_id: u32,
    pub kind: CoreReloKind,
    pub spec: Vec<Accessor>,
    pub raw_spec: Vec<u32>,
    pub bit_offset: u64,
}

/// The computed patch for one relocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReloResult {
    pub orig_val: u64,
    pub new_val: u64,
    pub poison: bool,
    pub validate: bool,
    pub fail_memsz_adjust: bool,
    pub orig_sz: u32,
    pub new_sz: u32,
    pub orig_type_id: u32,
    pub new_type_id: u32,
}

enum Calc {
    Poison,
    Err(String),
}

impl From<crate::btf::BtfError> for Calc {
    fn from(e: crate::btf::BtfError) -> Self {
        Calc::Err(e.to_string())
    }
}

fn kind_compat(btf_a: &Btf, a: u32, btf_b: &Btf, b: u32) -> bool {
    match (btf_a.type_by_id(a), btf_b.type_by_id(b)) {
        (Some(x), Some(y)) => x.kind() == y.kind() || (x.is_any_enum() && y.is_any_enum()),
        _ => false,
    }
}

fn is_flex_arr(btf: &Btf, acc: Option<&Accessor>, nelems: u32) -> bool {
    let Some(acc) = acc else { return false };
    if acc.name.is_none() || nelems > 0 {
        return false;
    }
    btf.type_by_id(acc.type_id).map(|t| t.vlen()).is_some_and(|n| n > 0 && acc.idx as usize == n - 1)
}

/// Parses a relocation's access string against the local BTF (libbpf's `bpf_core_parse_spec`).
pub fn parse_spec<'a>(btf: &'a Btf, relo: &CoreRelo) -> Result<Spec<'a>, String> {
    let access = btf.str_at(relo.access_str_off).ok_or("bad access string offset")?;
    if access.is_empty() || access.starts_with(':') {
        return Err(format!("invalid access string `{access}`"));
    }
    let mut spec = Spec {
        btf,
        root_type_id: relo.type_id,
        kind: relo.kind,
        spec: Vec::new(),
        raw_spec: Vec::new(),
        bit_offset: 0,
    };
    if relo.kind.is_type_based() {
        if access != "0" {
            return Err(format!("type-based relocation with access string `{access}`"));
        }
        return Ok(spec);
    }
    for part in access.split(':') {
        let v: u32 = part.parse().map_err(|_| format!("invalid access string `{access}`"))?;
        if spec.raw_spec.len() == SPEC_MAX_LEN {
            return Err("access string too long".into());
        }
        spec.raw_spec.push(v);
    }
    let mut id = btf.skip_mods_and_typedefs(relo.type_id).map_err(|e| e.to_string())?;
    let t = btf.get(id).map_err(|e| e.to_string())?;
    let first = spec.raw_spec[0];
    if relo.kind.is_enumval_based() {
        let e = t.enum_type().ok_or("enum relocation on a type that is not an enum")?;
        if spec.raw_spec.len() > 1 || first as usize >= e.values.len() {
            return Err("enumerator index out of range".into());
        }
        let name = btf.name_of(e.values[first as usize].name_off).to_string();
        spec.spec.push(Accessor { type_id: id, idx: first, name: Some(name) });
        return Ok(spec);
    }
    if !relo.kind.is_field_based() {
        return Err("unknown relocation kind".into());
    }
    spec.spec.push(Accessor { type_id: id, idx: first, name: None });
    let sz = btf.resolve_size(id).map_err(|e| e.to_string())?;
    spec.bit_offset = (first as u64).saturating_mul(sz).saturating_mul(8);
    for i in 1..spec.raw_spec.len() {
        id = btf.skip_mods_and_typedefs(id).map_err(|e| e.to_string())?;
        let t = btf.get(id).map_err(|e| e.to_string())?;
        let idx = spec.raw_spec[i];
        if let Some(c) = t.composite() {
            let m = c.members.get(idx as usize).ok_or("member index out of range")?;
            spec.bit_offset = spec.bit_offset.saturating_add(m.bit_offset as u64);
            if m.name_off != 0 {
                let name = btf.name_of(m.name_off);
                if name.is_empty() {
                    return Err("member with empty name".into());
                }
                spec.spec.push(Accessor { type_id: id, idx, name: Some(name.to_string()) });
            }
            id = m.type_id;
        } else if let Some(a) = t.array() {
            let a = *a;
            let elem = btf.skip_mods_and_typedefs(a.elem_type).map_err(|e| e.to_string())?;
            let flex = is_flex_arr(btf, spec.spec.last(), a.nelems);
            if !flex && idx >= a.nelems {
                return Err(format!("array index {idx} out of bounds ({} elements)", a.nelems));
            }
            spec.spec.push(Accessor { type_id: elem, idx, name: None });
            let esz = btf.resolve_size(elem).map_err(|e| e.to_string())?;
            spec.bit_offset = spec.bit_offset.saturating_add((idx as u64).saturating_mul(esz).saturating_mul(8));
            id = elem;
        } else {
            return Err(format!("access at step {i} goes through a {}, not a struct, union or array", t.kind()));
        }
    }
    Ok(spec)
}

/// C-like rendering of a spec for messages: `struct foo.a[3].b (0:1:3:0 @ offset 12)`.
pub fn format_spec(spec: &Spec<'_>) -> String {
    let mut s = spec.btf.type_name(spec.root_type_id);
    if spec.kind.is_field_based() {
        for (i, a) in spec.spec.iter().enumerate() {
            match &a.name {
                Some(n) => {
                    s.push('.');
                    s.push_str(n);
                }
                None if i > 0 || a.idx > 0 => s.push_str(&format!("[{}]", a.idx)),
                None => {}
            }
        }
        let raw: Vec<String> = spec.raw_spec.iter().map(|v| v.to_string()).collect();
        s.push_str(&format!(" ({} @ offset {}", raw.join(":"), spec.bit_offset / 8));
        if !spec.bit_offset.is_multiple_of(8) {
            s.push_str(&format!(".{}", spec.bit_offset % 8));
        }
        s.push(')');
    } else if spec.kind.is_enumval_based()
        && let Some(n) = spec.spec.first().and_then(|a| a.name.as_ref())
    {
        s.push_str("::");
        s.push_str(n);
    }
    s
}

fn fields_compat(lb: &Btf, mut lid: u32, tb: &Btf, mut tid: u32) -> Result<bool, String> {
    for _ in 0..MAX_LEVEL {
        lid = lb.skip_mods_and_typedefs(lid).map_err(|e| e.to_string())?;
        tid = tb.skip_mods_and_typedefs(tid).map_err(|e| e.to_string())?;
        let lt = lb.get(lid).map_err(|e| e.to_string())?;
        let tt = tb.get(tid).map_err(|e| e.to_string())?;
        if lt.is_composite() && tt.is_composite() {
            return Ok(true);
        }
        if !kind_compat(lb, lid, tb, tid) {
            return Ok(false);
        }
        match (&lt.kind, &tt.kind) {
            (TypeKind::Ptr(_), _) | (TypeKind::Float { .. }, _) => return Ok(true),
            (TypeKind::Fwd { .. } | TypeKind::Enum(_) | TypeKind::Enum64(_), _) => {
                let ln = essential_name(lb.name_of(lt.name_off));
                let tn = essential_name(tb.name_of(tt.name_off));
                return Ok(ln.is_empty() || tn.is_empty() || ln == tn);
            }
            (TypeKind::Int(a), TypeKind::Int(b)) => return Ok(a.offset == 0 && b.offset == 0),
            (TypeKind::Array(a), TypeKind::Array(b)) => {
                lid = a.elem_type;
                tid = b.elem_type;
            }
            _ => return Ok(false),
        }
    }
    Err("type nesting too deep".into())
}

/// libbpf's `bpf_core_types_are_compat` (names of the roots are assumed to match).
pub fn types_are_compat(lb: &Btf, lid: u32, tb: &Btf, tid: u32) -> Result<bool, String> {
    let mut budget = MAX_STEPS;
    types_are_compat_level(lb, lid, tb, tid, MAX_LEVEL, &mut budget)
}

fn types_are_compat_level(
    lb: &Btf,
    mut lid: u32,
    tb: &Btf,
    mut tid: u32,
    level: i32,
    budget: &mut u32,
) -> Result<bool, String> {
    if !kind_compat(lb, lid, tb, tid) {
        return Ok(false);
    }
    for _ in 0..MAX_LEVEL {
        step(budget)?;
        lid = lb.skip_mods_and_typedefs(lid).map_err(|e| e.to_string())?;
        tid = tb.skip_mods_and_typedefs(tid).map_err(|e| e.to_string())?;
        if !kind_compat(lb, lid, tb, tid) {
            return Ok(false);
        }
        let lt = lb.get(lid).map_err(|e| e.to_string())?;
        let tt = tb.get(tid).map_err(|e| e.to_string())?;
        match (&lt.kind, &tt.kind) {
            (
                TypeKind::Void
                | TypeKind::Struct(_)
                | TypeKind::Union(_)
                | TypeKind::Enum(_)
                | TypeKind::Enum64(_)
                | TypeKind::Fwd { .. },
                _,
            ) => return Ok(true),
            (TypeKind::Int(a), TypeKind::Int(b)) => return Ok(a.offset == 0 && b.offset == 0),
            (TypeKind::Ptr(a), TypeKind::Ptr(b)) => {
                lid = *a;
                tid = *b;
            }
            (TypeKind::Array(a), TypeKind::Array(b)) => {
                lid = a.elem_type;
                tid = b.elem_type;
            }
            (TypeKind::FuncProto(a), TypeKind::FuncProto(b)) => {
                if a.params.len() != b.params.len() {
                    return Ok(false);
                }
                for (pa, pb) in a.params.iter().zip(&b.params) {
                    if level <= 0 {
                        return Err("type nesting too deep".into());
                    }
                    let la = lb.skip_mods_and_typedefs(pa.type_id).map_err(|e| e.to_string())?;
                    let tb2 = tb.skip_mods_and_typedefs(pb.type_id).map_err(|e| e.to_string())?;
                    if !types_are_compat_level(lb, la, tb, tb2, level - 1, budget)? {
                        return Ok(false);
                    }
                }
                lid = a.ret_type;
                tid = b.ret_type;
            }
            _ => return Ok(false),
        }
    }
    Err("type nesting too deep".into())
}

fn names_match(lb: &Btf, loff: u32, tb: &Btf, toff: u32) -> bool {
    let ln = lb.name_of(loff);
    let tn = tb.name_of(toff);
    if tn.is_empty() {
        return ln.is_empty();
    }
    essential_name(ln) == essential_name(tn)
}

/// libbpf's `bpf_core_types_match` (the `TYPE_MATCHES` relation).
pub fn types_match(lb: &Btf, lid: u32, tb: &Btf, tid: u32) -> Result<bool, String> {
    let mut budget = MAX_STEPS;
    types_match_level(lb, lid, tb, tid, false, MAX_LEVEL, &mut budget)
}

fn types_match_level(
    lb: &Btf,
    mut lid: u32,
    tb: &Btf,
    mut tid: u32,
    mut behind_ptr: bool,
    level: i32,
    budget: &mut u32,
) -> Result<bool, String> {
    if level <= 0 {
        return Err("type nesting too deep".into());
    }
    for _ in 0..MAX_LEVEL {
        step(budget)?;
        lid = lb.skip_mods_and_typedefs(lid).map_err(|e| e.to_string())?;
        tid = tb.skip_mods_and_typedefs(tid).map_err(|e| e.to_string())?;
        let lt = lb.get(lid).map_err(|e| e.to_string())?;
        let tt = tb.get(tid).map_err(|e| e.to_string())?;
        if !names_match(lb, lt.name_off, tb, tt.name_off) {
            return Ok(false);
        }
        let (lk, tk) = (lt.kind(), tt.kind());
        match &lt.kind {
            TypeKind::Void => return Ok(lk == tk),
            TypeKind::Fwd { is_union: lf } => {
                if behind_ptr {
                    return Ok(match &tt.kind {
                        TypeKind::Fwd { is_union: tf } => lf == tf,
                        TypeKind::Struct(_) => !lf,
                        TypeKind::Union(_) => *lf,
                        _ => false,
                    });
                }
                return Ok(matches!(&tt.kind, TypeKind::Fwd { is_union: tf } if tf == lf));
            }
            TypeKind::Enum(le) | TypeKind::Enum64(le) => {
                let Some(te) = tt.enum_type() else { return Ok(false) };
                if le.size != te.size || le.values.len() > te.values.len() {
                    return Ok(false);
                }
                let all =
                    le.values.iter().all(|lv| te.values.iter().any(|tv| names_match(lb, lv.name_off, tb, tv.name_off)));
                return Ok(all);
            }
            TypeKind::Struct(lc) | TypeKind::Union(lc) => {
                if behind_ptr {
                    if lk == tk {
                        return Ok(true);
                    }
                    return Ok(
                        matches!(&tt.kind, TypeKind::Fwd { is_union } if *is_union == (lk == crate::btf::Kind::Union)),
                    );
                }
                if lk != tk {
                    return Ok(false);
                }
                let Some(tc) = tt.composite() else { return Ok(false) };
                if lc.members.len() > tc.members.len() {
                    return Ok(false);
                }
                for lm in &lc.members {
                    let mut matched = false;
                    for tm in &tc.members {
                        if !names_match(lb, lm.name_off, tb, tm.name_off) {
                            continue;
                        }
                        if types_match_level(lb, lm.type_id, tb, tm.type_id, behind_ptr, level - 1, budget)? {
                            matched = true;
                            break;
                        }
                    }
                    if !matched {
                        return Ok(false);
                    }
                }
                return Ok(true);
            }
            TypeKind::Int(li) => {
                let TypeKind::Int(ti) = &tt.kind else { return Ok(false) };
                return Ok(li.size == ti.size && (li.encoding & BTF_INT_SIGNED) == (ti.encoding & BTF_INT_SIGNED));
            }
            TypeKind::Ptr(lp) => {
                let TypeKind::Ptr(tp) = &tt.kind else { return Ok(false) };
                behind_ptr = true;
                lid = *lp;
                tid = *tp;
            }
            TypeKind::Array(la) => {
                let TypeKind::Array(ta) = &tt.kind else { return Ok(false) };
                if la.nelems != ta.nelems {
                    return Ok(false);
                }
                lid = la.elem_type;
                tid = ta.elem_type;
            }
            TypeKind::FuncProto(lp) => {
                let TypeKind::FuncProto(tp) = &tt.kind else { return Ok(false) };
                if lp.params.len() != tp.params.len() {
                    return Ok(false);
                }
                for (a, b) in lp.params.iter().zip(&tp.params) {
                    if !types_match_level(lb, a.type_id, tb, b.type_id, behind_ptr, level - 1, budget)? {
                        return Ok(false);
                    }
                }
                lid = lp.ret_type;
                tid = tp.ret_type;
            }
            _ => return Ok(false),
        }
    }
    Err("type nesting too deep".into())
}

/// Finds the target field matching `local_acc` inside target composite `targ_id`, descending
/// into anonymous members; extends `spec` and returns the field's type on success.
fn match_member(
    lb: &Btf,
    local_acc: &Accessor,
    tb: &Btf,
    targ_id: u32,
    spec: &mut Spec<'_>,
    depth: usize,
    seen: &mut std::collections::HashSet<u32>,
) -> Result<Option<u32>, String> {
    if depth > SPEC_MAX_LEN {
        return Err("struct nesting too deep".into());
    }
    let targ_id = tb.skip_mods_and_typedefs(targ_id).map_err(|e| e.to_string())?;
    // An anonymous member type already searched cannot hold the field (keeps hostile BTF
    // linear; real types never repeat one).
    if !seen.insert(targ_id) {
        return Ok(None);
    }
    let tt = tb.get(targ_id).map_err(|e| e.to_string())?;
    let Some(tc) = tt.composite() else { return Ok(None) };
    let local_member = lb
        .get(local_acc.type_id)
        .ok()
        .and_then(|t| t.composite())
        .and_then(|c| c.members.get(local_acc.idx as usize))
        .copied()
        .ok_or("bad local accessor")?;
    let local_name = lb.name_of(local_member.name_off);
    for (i, m) in tc.members.iter().enumerate() {
        if spec.raw_spec.len() == SPEC_MAX_LEN {
            return Err("struct/union/array nesting too deep".into());
        }
        spec.bit_offset = spec.bit_offset.wrapping_add(m.bit_offset as u64);
        spec.raw_spec.push(i as u32);
        let tname = tb.name_of(m.name_off);
        if tname.is_empty() {
            if let Some(found) = match_member(lb, local_acc, tb, m.type_id, spec, depth + 1, seen)? {
                return Ok(Some(found));
            }
        } else if tname == local_name {
            spec.spec.push(Accessor { type_id: targ_id, idx: i as u32, name: Some(tname.to_string()) });
            if fields_compat(lb, local_member.type_id, tb, m.type_id)? {
                return Ok(Some(m.type_id));
            }
            spec.spec.pop();
            // libbpf stops at the first field of that name, compatible or not.
            spec.bit_offset = spec.bit_offset.wrapping_sub(m.bit_offset as u64);
            spec.raw_spec.pop();
            return Ok(None);
        }
        spec.bit_offset = spec.bit_offset.wrapping_sub(m.bit_offset as u64);
        spec.raw_spec.pop();
    }
    Ok(None)
}

/// Matches a local spec against one candidate target type (libbpf's `bpf_core_spec_match`).
pub fn spec_match<'a>(local: &Spec<'_>, tb: &'a Btf, cand: u32) -> Result<Option<Spec<'a>>, String> {
    let mut ts =
        Spec { btf: tb, root_type_id: cand, kind: local.kind, spec: Vec::new(), raw_spec: Vec::new(), bit_offset: 0 };
    let lb = local.btf;
    if local.kind.is_type_based() {
        let ok = if local.kind == CoreReloKind::TypeMatches {
            types_match(lb, local.root_type_id, tb, cand)?
        } else {
            types_are_compat(lb, local.root_type_id, tb, cand)?
        };
        return Ok(ok.then_some(ts));
    }
    if local.kind.is_enumval_based() {
        let tid = tb.skip_mods_and_typedefs(cand).map_err(|e| e.to_string())?;
        let Some(te) = tb.get(tid).ok().and_then(|t| t.enum_type()) else { return Ok(None) };
        let lname = local.spec.first().and_then(|a| a.name.as_deref()).unwrap_or("");
        let lname = essential_name(lname);
        for (i, v) in te.values.iter().enumerate() {
            let tn = tb.name_of(v.name_off);
            if essential_name(tn) == lname {
                ts.spec.push(Accessor { type_id: tid, idx: i as u32, name: Some(tn.to_string()) });
                ts.raw_spec.push(i as u32);
                return Ok(Some(ts));
            }
        }
        return Ok(None);
    }
    let mut targ_id = cand;
    for (i, lacc) in local.spec.iter().enumerate() {
        targ_id = tb.skip_mods_and_typedefs(targ_id).map_err(|e| e.to_string())?;
        if lacc.name.is_some() {
            match match_member(lb, lacc, tb, targ_id, &mut ts, 0, &mut std::collections::HashSet::new())? {
                Some(next) => targ_id = next,
                None => return Ok(None),
            }
        } else {
            if i > 0 {
                let Some(a) = tb.get(targ_id).ok().and_then(|t| t.array()).copied() else { return Ok(None) };
                let flex = is_flex_arr(tb, ts.spec.last(), a.nelems);
                if !flex && lacc.idx >= a.nelems {
                    return Ok(None);
                }
                targ_id = tb.skip_mods_and_typedefs(a.elem_type).map_err(|e| e.to_string())?;
            }
            if ts.raw_spec.len() == SPEC_MAX_LEN {
                return Err("struct/union/array nesting too deep".into());
            }
            ts.spec.push(Accessor { type_id: targ_id, idx: lacc.idx, name: None });
            ts.raw_spec.push(lacc.idx);
            let sz = tb.resolve_size(targ_id).map_err(|e| e.to_string())?;
            ts.bit_offset = ts.bit_offset.saturating_add((lacc.idx as u64).saturating_mul(sz).saturating_mul(8));
        }
    }
    Ok(Some(ts))
}

struct FieldRes {
    val: u64,
    field_sz: u32,
    type_id: u32,
    validate: bool,
}

fn calc_field(kind: CoreReloKind, spec: Option<&Spec<'_>>) -> Result<FieldRes, Calc> {
    let mut r = FieldRes { val: 0, field_sz: 0, type_id: 0, validate: true };
    if kind == CoreReloKind::FieldExists {
        r.val = spec.is_some() as u64;
        return Ok(r);
    }
    let Some(spec) = spec else { return Err(Calc::Poison) };
    let btf = spec.btf;
    let acc = spec.spec.last().ok_or_else(|| Calc::Err("empty spec".into()))?;
    if acc.name.is_none() {
        let sz = btf.resolve_size(acc.type_id)?;
        match kind {
            CoreReloKind::FieldByteOffset => {
                r.val = spec.bit_offset / 8;
                r.field_sz = sz as u32;
                r.type_id = acc.type_id;
            }
            CoreReloKind::FieldByteSize => r.val = sz,
            _ => return Err(Calc::Err("relocation can't be applied to an array access".into())),
        }
        return Ok(r);
    }
    let m = btf
        .get(acc.type_id)
        .ok()
        .and_then(|t| t.composite())
        .and_then(|c| c.members.get(acc.idx as usize))
        .copied()
        .ok_or_else(|| Calc::Err("bad accessor".into()))?;
    let field_type_id = btf.skip_mods_and_typedefs(m.type_id)?;
    let mt = btf.get(field_type_id)?;
    let bit_off = spec.bit_offset;
    let mut bit_sz = m.bitfield_size as u64;
    let bitfield = bit_sz > 0;
    let (byte_off, byte_sz);
    if bitfield {
        let mut sz = btf.resolve_size(field_type_id)?;
        if sz == 0 {
            return Err(Calc::Err("bitfield of a zero-sized type".into()));
        }
        let mut off = bit_off / 8 / sz * sz;
        while bit_off.saturating_add(bit_sz) - off * 8 > sz.saturating_mul(8) {
            if sz >= 8 {
                return Err(Calc::Err("bitfield can't be read with a 64-bit load".into()));
            }
            sz *= 2;
            off = bit_off / 8 / sz * sz;
        }
        byte_off = off;
        byte_sz = sz;
    } else {
        byte_sz = btf.resolve_size(field_type_id)?;
        byte_off = bit_off / 8;
        bit_sz = byte_sz.saturating_mul(8);
    }
    r.validate = !bitfield;
    match kind {
        CoreReloKind::FieldByteOffset => {
            r.val = byte_off;
            if !bitfield {
                r.field_sz = byte_sz as u32;
                r.type_id = field_type_id;
            }
        }
        CoreReloKind::FieldByteSize => r.val = byte_sz,
        CoreReloKind::FieldSigned => {
            r.val = match &mt.kind {
                TypeKind::Enum(e) | TypeKind::Enum64(e) => e.signed as u64,
                TypeKind::Int(i) => i.is_signed() as u64,
                _ => 0,
            };
            r.validate = true;
        }
        CoreReloKind::FieldLshiftU64 => {
            r.val = 64u64.wrapping_sub(bit_off.wrapping_add(bit_sz).wrapping_sub(byte_off * 8));
        }
        CoreReloKind::FieldRshiftU64 => {
            r.val = 64u64.wrapping_sub(bit_sz);
            r.validate = true;
        }
        _ => return Err(Calc::Err("unsupported relocation kind".into())),
    }
    Ok(r)
}

fn calc_type(kind: CoreReloKind, spec: Option<&Spec<'_>>) -> Result<(u64, bool), Calc> {
    let Some(spec) = spec else { return Ok((0, true)) };
    Ok(match kind {
        CoreReloKind::TypeIdTarget => (spec.root_type_id as u64, false),
        CoreReloKind::TypeExists | CoreReloKind::TypeMatches => (1, true),
        CoreReloKind::TypeSize => (spec.btf.resolve_size(spec.root_type_id)?, true),
        _ => return Err(Calc::Err("unsupported relocation kind".into())),
    })
}

fn calc_enumval(kind: CoreReloKind, spec: Option<&Spec<'_>>) -> Result<u64, Calc> {
    match kind {
        CoreReloKind::EnumvalExists => Ok(spec.is_some() as u64),
        CoreReloKind::EnumvalValue => {
            let Some(spec) = spec else { return Err(Calc::Poison) };
            let acc = spec.spec.first().ok_or_else(|| Calc::Err("empty spec".into()))?;
            let t = spec.btf.get(acc.type_id)?;
            let v = t
                .enum_type()
                .and_then(|e| e.values.get(acc.idx as usize))
                .ok_or_else(|| Calc::Err("bad enumerator".into()))?;
            // A 32-bit ENUM's value is an s32 in libbpf, sign-extended to 64 bits.
            Ok(match t.kind {
                TypeKind::Enum(_) => v.value as u32 as i32 as i64 as u64,
                _ => v.value,
            })
        }
        _ => Err(Calc::Err("unsupported relocation kind".into())),
    }
}

fn calc_relo(kind: CoreReloKind, local: &Spec<'_>, targ: Option<&Spec<'_>>) -> Result<ReloResult, String> {
    let mut res = ReloResult { validate: true, ..Default::default() };
    let outcome: Result<(), Calc> = (|| {
        if kind.is_field_based() {
            let l = calc_field(kind, Some(local))?;
            res.orig_val = l.val;
            res.orig_sz = l.field_sz;
            res.orig_type_id = l.type_id;
            res.validate = l.validate;
            let t = calc_field(kind, targ)?;
            res.new_val = t.val;
            res.new_sz = t.field_sz;
            res.new_type_id = t.type_id;
            if res.orig_sz != res.new_sz {
                let ot = local.btf.get(res.orig_type_id)?;
                let nt = match targ {
                    Some(t) => t.btf.get(res.new_type_id)?,
                    None => ot,
                };
                let both_ptr = matches!(ot.kind, TypeKind::Ptr(_)) && matches!(nt.kind, TypeKind::Ptr(_));
                let both_unsigned = matches!((&ot.kind, &nt.kind), (TypeKind::Int(a), TypeKind::Int(b))
                    if a.encoding != BTF_INT_SIGNED && b.encoding != BTF_INT_SIGNED);
                res.fail_memsz_adjust = !(both_ptr || both_unsigned);
            }
        } else if kind.is_type_based() {
            let (o, v) = calc_type(kind, Some(local))?;
            res.orig_val = o;
            res.validate = v;
            res.new_val = calc_type(kind, targ)?.0;
        } else {
            res.orig_val = calc_enumval(kind, Some(local))?;
            res.new_val = calc_enumval(kind, targ)?;
        }
        Ok(())
    })();
    match outcome {
        Ok(()) => Ok(res),
        Err(Calc::Poison) => {
            res.poison = true;
            Ok(res)
        }
        Err(Calc::Err(m)) => Err(m),
    }
}

/// Resolves relocations against a target BTF, caching candidate lists per local root type.
pub struct CoreResolver<'a> {
    local: &'a Btf,
    /// `None`: identity (the local type is the only candidate).
    target: Option<&'a Btf>,
    cands: HashMap<u32, Vec<u32>>,
}

impl<'a> CoreResolver<'a> {
    pub fn new(local: &'a Btf, target: Option<&'a Btf>) -> Self {
        CoreResolver { local, target, cands: HashMap::new() }
    }

    fn target_btf(&self) -> &'a Btf {
        self.target.unwrap_or(self.local)
    }

    fn find_cands(&self, local_id: u32) -> Vec<u32> {
        let Some(tb) = self.target else { return vec![local_id] };
        let lname = essential_name(self.local.name(local_id));
        tb.types()
            .filter(|(id, t)| {
                kind_compat(self.local, local_id, tb, *id) && {
                    let n = tb.name_of(t.name_off);
                    !n.is_empty() && essential_name(n) == lname
                }
            })
            .map(|(id, _)| id)
            .collect()
    }

    /// Computes the patch for one relocation (libbpf's `bpf_core_calc_relo_insn`).
    pub fn resolve(&mut self, relo: &CoreRelo) -> Result<ReloResult, String> {
        let local_spec = parse_spec(self.local, relo).map_err(|e| format!("parsing the access failed: {e}"))?;
        if relo.kind == CoreReloKind::TypeIdLocal {
            return Ok(ReloResult {
                orig_val: relo.type_id as u64,
                new_val: relo.type_id as u64,
                validate: false,
                ..Default::default()
            });
        }
        if self.local.name(relo.type_id).is_empty() {
            return Err("relocations against anonymous types are not supported".into());
        }
        let tb = self.target_btf();
        let cands = match self.cands.get(&relo.type_id) {
            Some(c) => c.clone(),
            None => {
                let c = self.find_cands(relo.type_id);
                self.cands.insert(relo.type_id, c.clone());
                c
            }
        };
        let mut chosen: Option<(ReloResult, u64)> = None;
        let mut kept = Vec::new();
        for &cand in &cands {
            let Some(cs) =
                spec_match(&local_spec, tb, cand).map_err(|e| format!("matching candidate [{cand}]: {e}"))?
            else {
                continue;
            };
            let res = calc_relo(relo.kind, &local_spec, Some(&cs))?;
            match &chosen {
                None => chosen = Some((res, cs.bit_offset)),
                Some((prev, off)) => {
                    if cs.bit_offset != *off {
                        return Err(format!(
                            "field offset ambiguity: {} != {} between candidates ({})",
                            cs.bit_offset,
                            off,
                            format_spec(&cs)
                        ));
                    }
                    if res.poison != prev.poison || res.new_val != prev.new_val {
                        return Err(format!(
                            "relocation decision ambiguity: {} {} != {} {}",
                            if res.poison { "failure" } else { "success" },
                            res.new_val,
                            if prev.poison { "failure" } else { "success" },
                            prev.new_val
                        ));
                    }
                }
            }
            kept.push(cand);
        }
        if !kept.is_empty() {
            self.cands.insert(relo.type_id, kept);
        }
        match chosen {
            Some((res, _)) => Ok(res),
            None => calc_relo(relo.kind, &local_spec, None),
        }
    }
}

/// `call 0xbad2310`: libbpf's poisoned instruction.
fn poison(insn: &mut Insn) {
    *insn = Insn::new(BPF_JMP | BPF_CALL, 0, 0, 0, crate::CORE_POISON_HELPER);
}

fn size_code(bytes: u32) -> Option<u8> {
    Some(match bytes {
        1 => BPF_B,
        2 => BPF_H,
        4 => BPF_W,
        8 => BPF_DW,
        _ => return None,
    })
}

/// Patches instruction `idx` of `insns` with a computed result (libbpf's `bpf_core_patch_insn`).
pub fn patch_insn(insns: &mut [Insn], idx: usize, res: &ReloResult) -> Result<(), String> {
    let insn = *insns.get(idx).ok_or("instruction index out of range")?;
    let class = insn.class();
    let do_poison = |insns: &mut [Insn]| {
        if insns[idx].is_lddw()
            && let Some(next) = insns.get_mut(idx + 1)
        {
            poison(next);
        }
        poison(&mut insns[idx]);
    };
    if res.poison {
        do_poison(insns);
        return Ok(());
    }
    let (orig, new) = (res.orig_val, res.new_val);
    match class {
        BPF_ALU | BPF_ALU64 => {
            if insn.source() != BPF_K {
                return Err("ALU instruction does not take an immediate".into());
            }
            if res.validate && insn.imm as i64 as u64 != orig {
                return Err(format!("unexpected ALU immediate: got {}, expected {orig} -> {new}", insn.imm));
            }
            insns[idx].imm = new as i32;
        }
        BPF_LDX | BPF_ST | BPF_STX => {
            if res.validate && insn.off as i64 as u64 != orig {
                return Err(format!("unexpected load/store offset: got {}, expected {orig} -> {new}", insn.off));
            }
            if new > i16::MAX as u64 {
                return Err(format!("load/store offset {new} is too big"));
            }
            if res.fail_memsz_adjust {
                // Accessing a field whose size changed in a way that loses meaning.
                do_poison(insns);
                return Ok(());
            }
            insns[idx].off = new as i16;
            if res.new_sz != res.orig_sz {
                if insn.size_bytes() as u32 != res.orig_sz {
                    return Err(format!("unexpected memory size: got {}, expected {}", insn.size_bytes(), res.orig_sz));
                }
                let sz = size_code(res.new_sz).ok_or_else(|| format!("invalid new memory size {}", res.new_sz))?;
                insns[idx].op = insn.mode() | sz | class;
            }
        }
        BPF_LD => {
            let next = insns.get(idx + 1).copied();
            let ok = insn.is_lddw()
                && insn.src == 0
                && insn.off == 0
                && matches!(next, Some(n) if n.op == 0 && n.dst == 0 && n.src == 0 && n.off == 0);
            let Some(next) = next.filter(|_| ok) else {
                return Err("64-bit load has unexpected form".into());
            };
            let imm = insn.wide_imm(next);
            if res.validate && imm != orig {
                return Err(format!("unexpected 64-bit immediate: got {imm}, expected {orig} -> {new}"));
            }
            insns[idx].imm = new as u32 as i32;
            insns[idx + 1].imm = (new >> 32) as u32 as i32;
        }
        _ => return Err(format!("cannot relocate instruction with opcode {:#04x}", insn.op)),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::btf::{BTF_INT_SIGNED, CompositeType, IntType, Member, TypeKind};

    fn int(b: &mut Btf, name: &str, size: u32, signed: bool) -> u32 {
        let encoding = if signed { BTF_INT_SIGNED } else { 0 };
        b.add_type(name, TypeKind::Int(IntType { size, encoding, offset: 0, bits: (size * 8) as u8 }))
    }

    fn strukt(b: &mut Btf, name: &str, members: &[(&str, u32, u32)], size: u32) -> u32 {
        let members = members
            .iter()
            .map(|(n, t, off)| Member { name_off: b.add_string(n), type_id: *t, bit_offset: *off, bitfield_size: 0 })
            .collect();
        b.add_type(name, TypeKind::Struct(CompositeType { size, members }))
    }

    #[test]
    fn type_matches_relation() {
        let mut l = Btf::empty();
        let li = int(&mut l, "int", 4, true);
        let ls = strukt(&mut l, "s", &[("a", li, 0)], 4);
        let lp = l.add_type("", TypeKind::Ptr(ls));
        let lw = strukt(&mut l, "w___v1", &[("p", lp, 0)], 8);

        // Target: more members is fine, a different int size is not.
        let mut t = Btf::empty();
        let ti = int(&mut t, "int", 4, true);
        let tl = int(&mut t, "long", 8, true);
        let ts = strukt(&mut t, "s", &[("a", ti, 0), ("b", tl, 64)], 16);
        let tbad = strukt(&mut t, "s", &[("a", tl, 0)], 8);
        let tfwd = t.add_type("s", TypeKind::Fwd { is_union: false });
        let tp = t.add_type("", TypeKind::Ptr(tfwd));
        let tw = strukt(&mut t, "w", &[("p", tp, 0)], 8);
        assert!(types_match(&l, ls, &t, ts).unwrap());
        assert!(!types_match(&l, ls, &t, tbad).unwrap());
        // Behind a pointer a struct matches a forward declaration of the same name.
        assert!(types_match(&l, lw, &t, tw).unwrap());
        // Compatibility is looser: any struct is compatible with any struct.
        assert!(types_are_compat(&l, ls, &t, tbad).unwrap());
        assert!(!types_are_compat(&l, li, &t, ts).unwrap());
    }

    #[test]
    fn enum64_values_relocate() {
        use crate::btf::{EnumType, EnumValue};
        let mut l = Btf::empty();
        let e = EnumType {
            size: 8,
            signed: false,
            values: vec![EnumValue { name_off: l.add_string("BIG"), value: 1 << 40 }],
        };
        let le = l.add_type("e", TypeKind::Enum64(e));
        let access = l.add_string("0");
        let mut t = Btf::empty();
        let e = EnumType {
            size: 8,
            signed: false,
            values: vec![
                EnumValue { name_off: t.add_string("OTHER"), value: 3 },
                EnumValue { name_off: t.add_string("BIG___renamed"), value: 1 << 41 },
            ],
        };
        t.add_type("e___new", TypeKind::Enum64(e));
        let relo = CoreRelo { insn_off: 0, type_id: le, access_str_off: access, kind: CoreReloKind::EnumvalValue };
        let mut r = CoreResolver::new(&l, Some(&t));
        let res = r.resolve(&relo).unwrap();
        assert_eq!((res.orig_val, res.new_val, res.poison), (1 << 40, 1 << 41, false));
        let mut insns = vec![Insn::new(userbpf_isa::OP_LDDW, 1, 0, 0, 0), Insn::new(0, 0, 0, 0, 1 << 8)];
        patch_insn(&mut insns, 0, &res).unwrap();
        assert_eq!(insns[0].wide_imm(insns[1]), 1 << 41);
        // The instruction must hold the local value first.
        let mut wrong = vec![Insn::new(userbpf_isa::OP_LDDW, 1, 0, 0, 5), Insn::new(0, 0, 0, 0, 0)];
        assert!(patch_insn(&mut wrong, 0, &res).unwrap_err().contains("unexpected 64-bit immediate"));
    }
}
