//! Building a program's self-contained instruction stream: the entry function, then every
//! function it reaches through calls or `BPF_PSEUDO_FUNC` loads, appended in the order they are
//! first met (as libbpf's `bpf_object__reloc_code` does), with call/function offsets and map
//! references rewritten.

use crate::btf::ext::{FuncInfo, LineInfo};
use crate::{ErrorKind, FunctionSpan};
use std::collections::HashMap;
use userbpf_isa::{
    BPF_PSEUDO_CALL, BPF_PSEUDO_FUNC, BPF_PSEUDO_KFUNC_CALL, BPF_PSEUDO_MAP_IDX, BPF_PSEUDO_MAP_IDX_VALUE, Insn,
    OP_CALL,
};

/// A function symbol in an executable section.
#[derive(Debug, Clone)]
pub(crate) struct Function {
    pub name: String,
    pub sec: usize,
    pub sec_name: String,
    /// First instruction slot within the section.
    pub start: usize,
    pub len: usize,
}

/// What a relocated instruction refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reloc {
    /// BPF-to-BPF call to instruction `insn` of section `sec`.
    Call { sec: usize, insn: i64 },
    /// `lddw` of the address of the function at instruction `insn` of section `sec`.
    FuncAddr { sec: usize, insn: i64 },
    /// `lddw` of a map (index into `Object::maps`).
    Map(usize),
    /// `lddw` of a global variable: map index and symbol offset in the section.
    Data { map: usize, off: u64 },
    /// `lddw` of a kconfig extern at `off` of the kconfig map.
    Kconfig { map: usize, off: u32 },
    /// `lddw` of a weak `__ksym` that resolves to 0.
    WeakKsym,
    /// Call of a weak kfunc (left as an unresolved kfunc call, as libbpf leaves it).
    WeakKfuncCall,
}

/// Everything shared by the programs of one object.
pub(crate) struct Linker<'a> {
    pub funcs: &'a [Function],
    /// (section, start instruction) -> index into `funcs`.
    pub func_at: &'a HashMap<(usize, usize), usize>,
    pub sec_insns: &'a HashMap<usize, Vec<Insn>>,
    pub relocs: &'a HashMap<(usize, usize), Reloc>,
    /// Per section: func_info and line_info with `insn_off` as section instruction index.
    pub ext_info: &'a HashMap<usize, (Vec<FuncInfo>, Vec<LineInfo>)>,
}

pub(crate) struct Linked {
    pub insns: Vec<Insn>,
    pub functions: Vec<FunctionSpan>,
    pub func_info: Vec<FuncInfo>,
    pub line_info: Vec<LineInfo>,
}

impl Linker<'_> {
    fn target(&self, f: &Function, j: usize, sec: usize, insn: i64) -> Result<usize, ErrorKind> {
        let found = usize::try_from(insn).ok().and_then(|i| self.func_at.get(&(sec, i)).copied());
        found.ok_or_else(|| ErrorKind::Section {
            section: f.sec_name.clone(),
            msg: format!(
                "instruction {} (in `{}`) refers to instruction {insn} of section {}, which is not the start of a function",
                f.start + j,
                f.name,
                self.funcs.iter().find(|g| g.sec == sec).map(|g| g.sec_name.as_str()).unwrap_or("?")
            ),
        })
    }

    pub fn link(&self, entry: usize) -> Result<Linked, ErrorKind> {
        let mut insns: Vec<Insn> = Vec::new();
        let mut placed: HashMap<usize, usize> = HashMap::new();
        let mut order: Vec<usize> = Vec::new();
        let place = |fi: usize, insns: &mut Vec<Insn>, placed: &mut HashMap<usize, usize>, order: &mut Vec<usize>| {
            let f = &self.funcs[fi];
            let start = insns.len();
            let code = self.sec_insns.get(&f.sec).and_then(|v| v.get(f.start..f.start + f.len)).ok_or_else(|| {
                ErrorKind::Section {
                    section: f.sec_name.clone(),
                    msg: format!("function `{}` lies outside its section", f.name),
                }
            })?;
            insns.extend_from_slice(code);
            placed.insert(fi, start);
            order.push(fi);
            Ok::<(), ErrorKind>(())
        };
        place(entry, &mut insns, &mut placed, &mut order)?;
        let mut k = 0;
        while k < order.len() {
            let fi = order[k];
            k += 1;
            let f = &self.funcs[fi];
            let base = placed[&fi];
            let mut j = 0;
            while j < f.len {
                let pos = base + j;
                let insn = insns[pos];
                let reloc = self.relocs.get(&(f.sec, f.start + j)).copied();
                let wide = insn.is_lddw();
                let bad = |msg: String| ErrorKind::Section {
                    section: f.sec_name.clone(),
                    msg: format!("instruction {} (in `{}`): {msg}", f.start + j, f.name),
                };
                if wide && j + 1 >= f.len {
                    return Err(bad("64-bit load has no second slot".into()));
                }
                match (reloc, insn.op == OP_CALL, wide) {
                    (Some(Reloc::Call { sec, insn: t }), true, _) => {
                        let ti = self.target(f, j, sec, t)?;
                        if !placed.contains_key(&ti) {
                            place(ti, &mut insns, &mut placed, &mut order)?;
                        }
                        insns[pos].imm = rel_offset(placed[&ti], pos).ok_or_else(|| bad("program too large".into()))?;
                    }
                    (None, true, _) if insn.src == BPF_PSEUDO_CALL => {
                        // Call to a static function of the same section: no relocation, the
                        // immediate is relative to the instruction's place in the section.
                        let t = (f.start + j) as i64 + insn.imm as i64 + 1;
                        let ti = self.target(f, j, f.sec, t)?;
                        if !placed.contains_key(&ti) {
                            place(ti, &mut insns, &mut placed, &mut order)?;
                        }
                        insns[pos].imm = rel_offset(placed[&ti], pos).ok_or_else(|| bad("program too large".into()))?;
                    }
                    (Some(Reloc::WeakKfuncCall), true, _) => {
                        insns[pos].src = BPF_PSEUDO_KFUNC_CALL;
                        insns[pos].imm = 0;
                        insns[pos].off = 0;
                    }
                    (Some(Reloc::FuncAddr { sec, insn: t }), _, true) => {
                        let ti = self.target(f, j, sec, t)?;
                        if !placed.contains_key(&ti) {
                            place(ti, &mut insns, &mut placed, &mut order)?;
                        }
                        insns[pos].src = BPF_PSEUDO_FUNC;
                        insns[pos].imm = rel_offset(placed[&ti], pos).ok_or_else(|| bad("program too large".into()))?;
                        insns[pos + 1].imm = 0;
                    }
                    (None, _, true) if insn.src == BPF_PSEUDO_FUNC => {
                        return Err(bad("function address load without a relocation".into()));
                    }
                    (Some(Reloc::Map(m)), _, true) => {
                        insns[pos].src = BPF_PSEUDO_MAP_IDX;
                        insns[pos].imm = m as i32;
                        insns[pos + 1].imm = 0;
                    }
                    (Some(Reloc::Data { map, off }), _, true) => {
                        let total = (off as i64).checked_add(insn.imm as i64).unwrap_or(i64::MAX);
                        insns[pos].src = BPF_PSEUDO_MAP_IDX_VALUE;
                        insns[pos].imm = map as i32;
                        insns[pos + 1].imm =
                            i32::try_from(total).map_err(|_| bad("variable offset too large".into()))?;
                    }
                    (Some(Reloc::Kconfig { map, off }), _, true) => {
                        insns[pos].src = BPF_PSEUDO_MAP_IDX_VALUE;
                        insns[pos].imm = map as i32;
                        insns[pos + 1].imm = off as i32;
                    }
                    (Some(Reloc::WeakKsym), _, true) => {
                        insns[pos].src = 0;
                        insns[pos].imm = 0;
                        insns[pos + 1].imm = 0;
                    }
                    (Some(r), _, _) => {
                        return Err(bad(format!("relocation {r:?} does not fit opcode {:#04x}", insn.op)));
                    }
                    _ => {}
                }
                j += if wide { 2 } else { 1 };
            }
        }
        let mut functions = Vec::with_capacity(order.len());
        let mut func_info = Vec::new();
        let mut line_info = Vec::new();
        for &fi in &order {
            let f = &self.funcs[fi];
            let p = placed[&fi];
            functions.push(FunctionSpan { name: f.name.clone(), section: f.sec_name.clone(), start: p, len: f.len });
            if let Some((fis, lis)) = self.ext_info.get(&f.sec) {
                let in_f = |off: u32| (off as usize) >= f.start && (off as usize) < f.start + f.len;
                for r in fis.iter().filter(|r| in_f(r.insn_off)) {
                    func_info
                        .push(FuncInfo { insn_off: (p + r.insn_off as usize - f.start) as u32, type_id: r.type_id });
                }
                for r in lis.iter().filter(|r| in_f(r.insn_off)) {
                    line_info.push(LineInfo { insn_off: (p + r.insn_off as usize - f.start) as u32, ..*r });
                }
            }
        }
        Ok(Linked { insns, functions, func_info, line_info })
    }
}

/// The call immediate reaching `target` from the instruction at `pos`.
fn rel_offset(target: usize, pos: usize) -> Option<i32> {
    i32::try_from(target as i64 - pos as i64 - 1).ok()
}
