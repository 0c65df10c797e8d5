//! CO-RE relocations: identity resolution, a different target layout, the running kernel's
//! BTF, poisoning and ambiguity.

mod common;

use common::compile;
use std::collections::HashMap;
use userbpf_isa::*;
use userbpf_object::btf::ext::{BtfExt, CoreRelo};
use userbpf_object::btf::{Btf, Kind};
use userbpf_object::elf::Elf;
use userbpf_object::*;

struct Relocs {
    btf: Btf,
    /// (section, relocation) for every CO-RE record.
    relos: Vec<(String, CoreRelo)>,
    /// Original instructions per section.
    code: HashMap<String, Vec<Insn>>,
}

fn relocs(obj: &[u8]) -> Relocs {
    let elf = Elf::parse(obj).unwrap();
    let btf = Btf::parse(elf.section_by_name(".BTF").unwrap().data).unwrap();
    let ext = BtfExt::parse(elf.section_by_name(".BTF.ext").unwrap().data).unwrap();
    let mut relos = Vec::new();
    let mut code = HashMap::new();
    for g in &ext.core_relos {
        let sec = btf.name_of(g.sec_name_off).to_string();
        code.insert(sec.clone(), decode(elf.section_by_name(&sec).unwrap().data).unwrap());
        for r in &g.records {
            relos.push((sec.clone(), *r));
        }
    }
    Relocs { btf, relos, code }
}

/// The value a relocated instruction carries, or None when it was poisoned.
fn value(insns: &[Insn], i: usize) -> Option<u64> {
    let insn = insns[i];
    if insn.op == OP_CALL && insn.imm == CORE_POISON_HELPER {
        return None;
    }
    Some(match insn.class() {
        BPF_ALU | BPF_ALU64 => insn.imm as i64 as u64,
        BPF_LDX | BPF_ST | BPF_STX => insn.off as i64 as u64,
        BPF_LD => insn.wide_imm(insns[i + 1]),
        c => panic!("unexpected relocated class {c}"),
    })
}

fn program_for_section<'a>(o: &'a Object, sec: &str) -> &'a ProgramSpec {
    // The test programs are alone in their sections, at offset 0.
    o.programs.iter().find(|p| p.section == sec).unwrap()
}

fn key(r: &Relocs, relo: &CoreRelo) -> (String, String, String) {
    (
        relo.kind.name().to_string(),
        r.btf.type_name(relo.type_id),
        r.btf.str_at(relo.access_str_off).unwrap().to_string(),
    )
}

#[test]
fn identity_keeps_compiled_values() {
    let obj = compile("core.bpf.c");
    let r = relocs(&obj);
    assert!(r.relos.len() >= 15, "only {} relocations", r.relos.len());
    let o = Object::parse(&obj, "core.bpf.o").unwrap();
    for (sec, relo) in &r.relos {
        let p = program_for_section(&o, sec);
        let i = (relo.insn_off / 8) as usize;
        let (kind, _, access) = key(&r, relo);
        if access == "0:3" && kind == "byte_sz" {
            // Bitfield bf2: libbpf (and so this loader) picks the smallest load holding the
            // field (4 bytes) where clang chose 8; values read are the same.
            assert_eq!(value(&p.insns, i), Some(4));
            continue;
        }
        assert_eq!(p.insns[i], r.code[sec][i], "relocation {:?} changed the instruction", key(&r, relo));
    }
}

#[test]
fn target_layout() {
    let obj = compile("core.bpf.c");
    let target = {
        let t = compile("core_target.bpf.c");
        let elf = Elf::parse(&t).unwrap();
        Btf::parse(elf.section_by_name(".BTF").unwrap().data).unwrap()
    };
    let r = relocs(&obj);
    let local_sample = r.btf.find_by_name_kind("sample", Kind::Struct).unwrap() as u64;
    let o = Object::parse_with(&obj, "core.bpf.o", Some(&target)).unwrap();
    let p = o.program("core_reads").unwrap();
    let mut seen = 0;
    for (_, relo) in &r.relos {
        let (kind, ty, access) = key(&r, relo);
        let want: Option<u64> = match (kind.as_str(), ty.as_str(), access.as_str()) {
            ("byte_off", "struct sample", "0:4") => Some(0), // b moved to the front
            ("byte_off", "struct sample___flavor", "0:1") => Some(0), // flavor resolves to sample
            ("field_exists", "struct sample___flavor", "0:2") => Some(0),
            ("byte_off", "struct sample___flavor", "0:2") => None, // guarded read: poisoned
            ("byte_off", "struct sample", "0:3") => Some(12),      // bf2: bit 96, in a u32 at 12
            ("byte_sz", "struct sample", "0:3") => Some(4),
            ("lshift_u64", "struct sample", "0:3") => Some(64 - 9),
            ("rshift_u64", "struct sample", "0:3") => Some(64 - 9),
            ("signed", "struct sample", "0:3") => Some(0),
            ("byte_sz", "struct sample", "0:5") => Some(32), // int[8]
            ("type_exists", "struct sample___flavor", "0") => Some(1),
            ("type_size", "struct sample", "0") => Some(56),
            ("enumval_value", "enum kind", "1") => Some(7),
            ("enumval_exists", "enum kind", "1") => Some(1),
            ("local_type_id", "struct sample", "0") => Some(local_sample),
            ("byte_off", "struct sample", "0:5:2") => Some(16 + 8),
            ("signed", "struct sample", "0:0") => Some(1),
            ("byte_off", "struct sample", "0:0") => Some(8),
            ("byte_off", "struct sample", "0:6") => Some(48),
            other => panic!("unexpected relocation {other:?}"),
        };
        let got = value(&p.insns, (relo.insn_off / 8) as usize);
        assert_eq!(got, want, "relocation {kind} {ty} {access}");
        seen += 1;
    }
    assert!(seen >= 15);
}

#[test]
fn missing_target_types_poison_or_report_absence() {
    let obj = compile("core.bpf.c");
    // A target without `struct sample` or `enum kind` at all.
    let target = {
        let t = compile("globals.bpf.c");
        Btf::parse(Elf::parse(&t).unwrap().section_by_name(".BTF").unwrap().data).unwrap()
    };
    let r = relocs(&obj);
    let o = Object::parse_with(&obj, "core.bpf.o", Some(&target)).unwrap();
    let p = o.program("core_reads").unwrap();
    for (_, relo) in &r.relos {
        let (kind, ty, access) = key(&r, relo);
        let got = value(&p.insns, (relo.insn_off / 8) as usize);
        let want = match kind.as_str() {
            "field_exists" | "type_exists" | "enumval_exists" | "type_size" => Some(0),
            "local_type_id" => got,
            _ => None,
        };
        assert_eq!(got, want, "relocation {kind} {ty} {access}");
    }
}

#[test]
fn ambiguous_candidates_are_refused() {
    let obj = compile("core.bpf.c");
    let target = {
        let t = compile("core_ambiguous.bpf.c");
        Btf::parse(Elf::parse(&t).unwrap().section_by_name(".BTF").unwrap().data).unwrap()
    };
    let e = Object::parse_with(&obj, "core.bpf.o", Some(&target)).unwrap_err();
    let msg = e.to_string();
    assert!(msg.starts_with("core.bpf.o: section uprobe: CO-RE relocation #"), "{msg}");
    assert!(msg.contains("at instruction"), "{msg}");
    assert!(msg.contains("for struct sample access `0:4`") || msg.contains("access `0:"), "{msg}");
    assert!(msg.contains("ambiguity"), "{msg}");
}

#[test]
fn kernel_types_against_vmlinux() {
    let obj = compile("core_ptregs.bpf.c");
    let o = Object::parse(&obj, "core_ptregs.bpf.o").unwrap();
    let r = relocs(&obj);
    let ldx_offsets = |o: &Object, name: &str| -> Vec<i16> {
        let p = o.program(name).unwrap();
        let sec = &p.section;
        r.relos
            .iter()
            .filter(|(s, _)| s == sec)
            .map(|(_, relo)| value(&p.insns, (relo.insn_off / 8) as usize).unwrap() as i16)
            .collect()
    };
    // Identity: the offsets of the local definitions.
    assert_eq!(ldx_offsets(&o, "regs"), [112, 104]);
    assert_eq!(ldx_offsets(&o, "task"), [4]);
    let path = std::path::Path::new("/sys/kernel/btf/vmlinux");
    if !userbpf_testutil::require(
        path.exists() && cfg!(target_arch = "x86_64"),
        "an x86-64 kernel's BTF (/sys/kernel/btf/vmlinux) for the kernel part",
    ) {
        return;
    }
    let vmlinux = Btf::parse_file(path).unwrap().unwrap();
    let o = Object::parse_with(&obj, "core_ptregs.bpf.o", Some(&vmlinux)).unwrap();
    assert_eq!(ldx_offsets(&o, "regs"), [112, 104]);
    let task = vmlinux.find_by_name_kind("task_struct", Kind::Struct).unwrap();
    let tgid = (vmlinux.find_member(task, "tgid").unwrap().1 / 8) as i16;
    assert_ne!(tgid, 4);
    assert_eq!(ldx_offsets(&o, "task"), [tgid]);
}

/// libbpf-tools style: an object built against a vmlinux.h generated from the running kernel,
/// resolved against the kernel's BTF and against itself.
#[test]
fn libbpf_tools_style_object() {
    let vmlinux = std::path::Path::new("/sys/kernel/btf/vmlinux");
    if !userbpf_testutil::require(
        vmlinux.exists() && cfg!(target_arch = "x86_64"),
        "an x86-64 kernel's BTF (/sys/kernel/btf/vmlinux)",
    ) {
        return;
    }
    let dir = common::out_dir().join(format!("vmlinux-h-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let header = match std::process::Command::new("bpftool")
        .args(["btf", "dump", "file", "/sys/kernel/btf/vmlinux", "format", "c"])
        .output()
    {
        Ok(o) if o.status.success() => o.stdout,
        other => {
            userbpf_testutil::require(false, &format!("bpftool generating vmlinux.h ({other:?})"));
            return;
        }
    };
    std::fs::write(dir.join("vmlinux.h"), header).unwrap();
    let inc = format!("-I{}", dir.display());
    let obj = common::compile_args("tools_like.bpf.c", &["-target", "bpf", "-g", "-D__TARGET_ARCH_x86", &inc]);
    let _ = std::fs::remove_dir_all(&dir);
    let kernel = Btf::parse_file(vmlinux).unwrap().unwrap();
    let r = relocs(&obj);
    assert!(r.relos.len() >= 5, "{} relocations", r.relos.len());
    for target in [None, Some(&kernel)] {
        let o = Object::parse_with(&obj, "tools_like.bpf.o", target).unwrap();
        assert_eq!(o.programs.len(), 3);
        for (sec, relo) in &r.relos {
            let p = program_for_section(&o, sec);
            let i = (relo.insn_off / 8) as usize;
            // The header came from this kernel: every relocation resolves to the compiled value.
            assert_eq!(
                p.insns[i],
                r.code[sec][i],
                "{:?} against {}",
                key(&r, relo),
                if target.is_some() { "vmlinux" } else { "itself" }
            );
        }
        for p in &o.programs {
            assert!(!p.insns.iter().any(|i| i.op == OP_CALL && i.imm == CORE_POISON_HELPER), "{} poisoned", p.name);
        }
        let (_, rodata) = o.map("tools_li.rodata").unwrap();
        assert!(rodata.is_readonly());
        assert_eq!(o.map("events").unwrap().1.max_entries, 256 * 1024);
    }
    assert_eq!(
        o_kind(&obj, "tp_openat"),
        ProgramKind::Tracepoint { category: "syscalls".into(), name: "sys_enter_openat".into() }
    );
}

fn o_kind(obj: &[u8], name: &str) -> ProgramKind {
    Object::parse(obj, "x.o").unwrap().program(name).unwrap().kind.clone()
}
