//! The disassembler against LLVM 14's `llvm-objdump -d`: instructions covering every opcode
//! LLVM 14 decodes, with varied registers, offsets and immediates, plus random slots (unused
//! fields set, unknown opcodes, registers above r10), are wrapped in a BPF ELF object and
//! every line of llvm-objdump's listing is compared with ours. llvm-objdump 14 is required
//! (see `userbpf_testutil::require`).
//!
//! Left out, because LLVM 14 does not decode them and we print newer LLVM's syntax (the unit
//! tests of `disasm` cover them): mod, jset, gotol, callx, bswap, sign-extending loads, store
//! immediate, sdiv/smod and movsx (an offset on div, mod or mov, which LLVM 14 ignores). The
//! 32-bit atomics other than the plain add are compared with `llvm-objdump --mattr=+alu32`.

use std::fs;
use std::path::PathBuf;
use std::process::Command;

use userbpf_isa::disasm::disassemble;
use userbpf_isa::*;

/// llvm-objdump of LLVM 14, if installed.
fn llvm_objdump() -> Option<&'static str> {
    for tool in ["llvm-objdump-14", "llvm-objdump"] {
        let Ok(out) = Command::new(tool).arg("--version").output() else { continue };
        if String::from_utf8_lossy(&out.stdout).contains("LLVM version 14.") {
            return Some(tool);
        }
        eprintln!("notice: {tool} is not LLVM 14's");
    }
    userbpf_testutil::require(false, "llvm-objdump of LLVM 14 (Debian's llvm package) for the disassembler comparison");
    None
}

/// A relocatable little-endian BPF ELF object whose `.text` holds `code`, with no symbols.
fn elf(code: &[u8]) -> Vec<u8> {
    const SHSTRTAB: &[u8] = b"\0.text\0.shstrtab\0";
    let text_off = 64;
    let strtab_off = text_off + code.len();
    let sh_off = (strtab_off + SHSTRTAB.len()).next_multiple_of(8);
    let mut f = Vec::new();
    f.extend_from_slice(b"\x7fELF\x02\x01\x01");
    f.resize(16, 0);
    f.extend(1u16.to_le_bytes()); // ET_REL
    f.extend(247u16.to_le_bytes()); // EM_BPF
    f.extend(1u32.to_le_bytes()); // EV_CURRENT
    f.extend(0u64.to_le_bytes()); // entry
    f.extend(0u64.to_le_bytes()); // program headers
    f.extend((sh_off as u64).to_le_bytes());
    f.extend(0u32.to_le_bytes()); // flags
    for half in [64u16, 0, 0, 64, 3, 2] {
        // header size, program header size and count, section header size and count, .shstrtab
        f.extend(half.to_le_bytes());
    }
    f.extend_from_slice(code);
    f.extend_from_slice(SHSTRTAB);
    f.resize(sh_off, 0);
    let section = |f: &mut Vec<u8>, name: u32, kind: u32, flags: u64, off: usize, size: usize, align: u64| {
        f.extend(name.to_le_bytes());
        f.extend(kind.to_le_bytes());
        f.extend(flags.to_le_bytes());
        f.extend(0u64.to_le_bytes()); // address
        f.extend((off as u64).to_le_bytes());
        f.extend((size as u64).to_le_bytes());
        f.extend(0u32.to_le_bytes()); // link
        f.extend(0u32.to_le_bytes()); // info
        f.extend(align.to_le_bytes());
        f.extend(0u64.to_le_bytes()); // entry size
    };
    section(&mut f, 0, 0, 0, 0, 0, 0);
    section(&mut f, 1, 1, 6, text_off, code.len(), 8); // .text: PROGBITS, ALLOC | EXECINSTR
    section(&mut f, 7, 3, 0, strtab_off, SHSTRTAB.len(), 1); // .shstrtab: STRTAB
    f
}

/// llvm-objdump's listing of `insns`: the lines after the `<.text>:` label, with the
/// ` <.text+0x..>` annotation of branch targets removed.
fn objdump(tool: &str, insns: &[Insn], alu32: bool, tag: &str) -> Vec<String> {
    let path: PathBuf = std::env::temp_dir().join(format!("userbpf-isa-{}-{tag}.o", std::process::id()));
    fs::write(&path, elf(&encode(insns))).expect("object file writes");
    let mut cmd = Command::new(tool);
    cmd.arg("-d");
    if alu32 {
        cmd.arg("--mattr=+alu32");
    }
    let out = cmd.arg(&path).output().expect("llvm-objdump runs");
    // Best effort: a leftover temporary file is harmless.
    let _ = fs::remove_file(&path);
    assert!(out.status.success(), "llvm-objdump failed: {}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let body = stdout.split_once("<.text>:\n").map_or("", |(_, body)| body);
    body.lines()
        .map(|line| match line.rsplit_once(" <") {
            Some((head, _)) if line.contains("goto") && line.ends_with('>') => head.to_string(),
            _ => line.to_string(),
        })
        .collect()
}

/// Compares our listing of `insns` with llvm-objdump's, line by line.
fn compare(tool: &str, insns: &[Insn], alu32: bool, tag: &str) {
    let theirs = objdump(tool, insns, alu32, tag);
    assert!(!theirs.is_empty(), "{tag}: llvm-objdump printed no listing");
    println!("{tag}: {} lines compared", theirs.len());
    let ours = disassemble(insns);
    let ours: Vec<&str> = ours.lines().collect();
    let mut diffs = Vec::new();
    for i in 0..theirs.len().max(ours.len()) {
        let (t, o) = (theirs.get(i).map(String::as_str), ours.get(i).copied());
        if t != o {
            diffs.push(format!("llvm: {}\nours: {}", t.unwrap_or("(none)"), o.unwrap_or("(none)")));
        }
    }
    let shown: Vec<&String> = diffs.iter().take(40).collect();
    assert!(
        diffs.is_empty(),
        "{tag}: {} of {} lines differ:\n{}",
        diffs.len(),
        theirs.len(),
        shown.iter().map(|d| d.as_str()).collect::<Vec<_>>().join("\n")
    );
}

use userbpf_testutil::Rng;

/// Operands drawn to hit edge cases of the encodings.
trait Operands {
    fn reg(&mut self) -> u8;
    fn imm(&mut self) -> i32;
    fn off(&mut self) -> i16;
}

impl Operands for Rng {
    fn reg(&mut self) -> u8 {
        (self.next_u64() % 11) as u8
    }
    fn imm(&mut self) -> i32 {
        let v = self.next_u64();
        match v % 4 {
            0 => self.pick(&[0, 1, -1, 7, -42, 4096, i32::MAX, i32::MIN, 0x7fff_0001]),
            1 => (v >> 32) as i32,
            2 => ((v >> 32) % 1000) as i32 - 500,
            _ => (v >> 40) as i32,
        }
    }
    fn off(&mut self) -> i16 {
        let v = self.next_u64();
        match v % 3 {
            0 => self.pick(&[0, 1, -1, 8, -8, i16::MAX, i16::MIN, 512, -512]),
            1 => (v >> 48) as i16,
            _ => ((v >> 32) % 64) as i16 - 32,
        }
    }
}

/// Instructions of every kind LLVM 14 decodes, with valid encodings.
fn known_to_llvm14(rng: &mut Rng) -> Vec<Insn> {
    let mut v = Vec::new();
    let alu_codes = [BPF_ADD, BPF_SUB, BPF_MUL, BPF_DIV, BPF_OR, BPF_AND, BPF_LSH, BPF_RSH, BPF_XOR, BPF_MOV, BPF_ARSH];
    let jmp_codes = [BPF_JEQ, BPF_JGT, BPF_JGE, BPF_JNE, BPF_JSGT, BPF_JSGE, BPF_JLT, BPF_JLE, BPF_JSLT, BPF_JSLE];
    for _ in 0..4 {
        for class in [BPF_ALU, BPF_ALU64] {
            for code in alu_codes {
                v.push(Insn::new(class | code | BPF_K, rng.reg(), 0, 0, rng.imm()));
                v.push(Insn::new(class | code | BPF_X, rng.reg(), rng.reg(), 0, 0));
            }
            v.push(Insn::new(class | BPF_NEG, rng.reg(), 0, 0, 0));
        }
        for op in [BPF_ALU | BPF_END | BPF_TO_LE, BPF_ALU | BPF_END | BPF_TO_BE] {
            for width in [16, 32, 64] {
                v.push(Insn::new(op, rng.reg(), 0, 0, width));
            }
        }
        for size in [BPF_B, BPF_H, BPF_W, BPF_DW] {
            v.push(Insn::new(BPF_LDX | BPF_MEM | size, rng.reg(), rng.reg(), rng.off(), 0));
            v.push(Insn::new(BPF_STX | BPF_MEM | size, rng.reg(), rng.reg(), rng.off(), 0));
        }
        for size in [BPF_B, BPF_H, BPF_W] {
            v.push(Insn::new(BPF_LD | BPF_ABS | size, 0, 0, 0, rng.imm()));
            v.push(Insn::new(BPF_LD | BPF_IND | size, 0, rng.reg(), 0, rng.imm()));
        }
        for class in [BPF_JMP, BPF_JMP32] {
            for code in jmp_codes {
                v.push(Insn::new(class | code | BPF_K, rng.reg(), 0, rng.off(), rng.imm()));
                v.push(Insn::new(class | code | BPF_X, rng.reg(), rng.reg(), rng.off(), 0));
            }
        }
        v.push(Insn::new(OP_JA, 0, 0, rng.off(), 0));
        v.push(Insn::new(OP_CALL, 0, 0, 0, rng.imm()));
        v.push(Insn::new(OP_CALL, 0, BPF_PSEUDO_CALL, 0, rng.imm()));
        v.push(Insn::new(OP_EXIT, 0, 0, 0, 0));
        for imm in [0x00, 0x01, 0x40, 0x41, 0x50, 0x51, 0xa0, 0xa1, BPF_XCHG, BPF_CMPXCHG] {
            v.push(Insn::new(BPF_STX | BPF_ATOMIC | BPF_DW, rng.reg(), rng.reg(), rng.off(), imm));
        }
        v.push(Insn::new(BPF_STX | BPF_ATOMIC | BPF_W, rng.reg(), rng.reg(), rng.off(), 0));
        let wide = [0, 1, u64::MAX, 0x1122_3344_5566_7788, 1 << 63, u32::MAX as u64, 1 << 32, rng.next_u64()];
        for value in wide {
            v.push(Insn::new(OP_LDDW, rng.reg(), 0, 0, value as u32 as i32));
            v.push(Insn::new(0, 0, 0, 0, (value >> 32) as u32 as i32));
        }
        for src in 1..=6 {
            v.push(Insn::new(OP_LDDW, rng.reg(), src, 0, rng.imm()));
            v.push(Insn::new(0, 0, 0, 0, rng.imm()));
        }
    }
    v
}

/// True for slots we deliberately print otherwise than LLVM 14 (see the file's comment).
fn differs_from_llvm14(insn: Insn) -> bool {
    const NEWER: [u8; 17] = [
        0x94, 0x97, 0x9c, 0x9f, // mod
        0x45, 0x4d, 0x46, 0x4e, // jset
        0x06, 0x8d, 0xd7, // gotol, callx, bswap
        0x81, 0x89, 0x91, // sign-extending loads
        0x62, 0x6a, 0x72, // store immediate (and 0x7a below)
    ];
    let div_or_mov = matches!(insn.op & !BPF_X, 0x34 | 0x37 | 0xb4 | 0xb7);
    NEWER.contains(&insn.op)
        || insn.op == 0x7a
        || (div_or_mov && insn.off != 0)
        || (insn.op == 0xc3 && ((insn.imm >> 4) & 0xf != 0 || insn.imm & 0xf == BPF_FETCH))
}

/// Random slots: any opcode but 0 (which would start a zero run) and those of
/// [`differs_from_llvm14`], any registers (up to 15), offsets and immediates.
fn random_slots(rng: &mut Rng, n: usize) -> Vec<Insn> {
    let mut v = Vec::new();
    while v.len() < n {
        let r = rng.next_u64();
        let insn = Insn::new(
            (r & 0xff) as u8,
            ((r >> 8) & 0xf) as u8,
            ((r >> 12) & 0xf) as u8,
            if r >> 63 == 0 { rng.off() } else { 0 },
            if (r >> 62) & 1 == 0 { rng.imm() } else { 0 },
        );
        let insn = if (r >> 61) & 1 == 0 { Insn { dst: insn.dst % 11, src: insn.src % 11, ..insn } } else { insn };
        if insn.op != 0 && !differs_from_llvm14(insn) {
            v.push(insn);
        }
    }
    // The second slot of an lddw could be any of the above; a trailing one is compared too.
    v
}

#[test]
fn matches_llvm_objdump_14() {
    let Some(tool) = llvm_objdump() else { return };
    let mut rng = Rng::new(0x9e37_79b9_7f4a_7c15);
    let known = known_to_llvm14(&mut rng);
    assert!(known.iter().all(|&i| !differs_from_llvm14(i)));
    compare(tool, &known, false, "known");
    compare(tool, &random_slots(&mut rng, 4000), false, "random");
}

#[test]
fn atomics32_match_llvm_objdump_14_alu32() {
    let Some(tool) = llvm_objdump() else { return };
    let mut rng = Rng::new(0x2545_f491_4f6c_dd1d);
    let mut insns = Vec::new();
    for imm in [0x01, 0x40, 0x41, 0x50, 0x51, 0xa0, 0xa1, BPF_XCHG, BPF_CMPXCHG, 0x1a1, 0x44, 0x30, 0xe0, 0xf0] {
        for _ in 0..3 {
            insns.push(Insn::new(BPF_STX | BPF_ATOMIC | BPF_W, rng.reg(), rng.reg(), rng.off(), imm));
        }
    }
    compare(tool, &insns, true, "alu32");
}

#[test]
fn zero_runs_and_truncation_match_llvm_objdump_14() {
    let Some(tool) = llvm_objdump() else { return };
    let mov = Insn::new(0xb7, 1, 0, 0, 1);
    let zero = Insn::default();
    let lddw = Insn::new(OP_LDDW, 1, 0, 0, 5);
    let cases: [&[Insn]; 7] = [
        &[mov, zero, mov],
        &[zero, zero, Insn::new(OP_EXIT, 0, 0, 0, 0)],
        &[mov, zero, Insn::new(0, 0, 0, 0, 0x0500_0000), mov],
        &[mov, zero],
        &[mov, lddw],
        &[mov, Insn::new(OP_LDDW, 0, 0, 0, 0)],
        &[lddw, zero, mov, Insn::new(0, 0, 0, 0, 5)],
    ];
    for (i, insns) in cases.iter().enumerate() {
        compare(tool, insns, false, &format!("zeros{i}"));
    }
}
