//! Bad objects are refused with a message naming the file and what is at fault; corrupted
//! objects (truncated, bit-flipped) never panic.

mod common;

use common::{compile, compile_args, obj_name};
use userbpf_object::btf::Btf;
use userbpf_object::btf::format::format_value;
use userbpf_object::elf::Elf;
use userbpf_object::{Object, ParseOptions};

fn refusal(bytes: &[u8], name: &str) -> String {
    match Object::parse(bytes, name) {
        Ok(_) => panic!("{name} was accepted"),
        Err(e) => e.to_string(),
    }
}

fn refused(src: &str) -> String {
    refusal(&compile(src), &obj_name(src))
}

fn assert_msg(msg: &str, want: &str) {
    assert!(msg.contains(want), "message {msg:?} lacks {want:?}");
}

#[test]
fn wrong_machine() {
    let host = compile_args("bad/host.c", &[]);
    let msg = refusal(&host, "host.o");
    assert_msg(&msg, "host.o: ELF machine is");
    assert_msg(&msg, "not BPF (247)");
    if cfg!(target_arch = "x86_64") {
        assert_eq!(msg, "host.o: ELF machine is 62 (x86-64), not BPF (247); compile with `clang -target bpf`");
    }
}

#[test]
fn big_endian() {
    let be = compile_args("globals.bpf.c", &["-target", "bpfeb", "-g"]);
    let msg = refusal(&be, "globals.bpf.o");
    assert_eq!(
        msg,
        "globals.bpf.o: big-endian ELF object; only little-endian BPF objects are supported (compile with `clang -target bpf`, not bpfeb)"
    );
}

#[test]
fn truncated() {
    let obj = compile("globals.bpf.c");
    assert_eq!(refusal(&obj[..2], "g.o"), "g.o: not an ELF file");
    assert_eq!(refusal(&obj[..40], "g.o"), "g.o: malformed ELF: truncated ELF header");
    assert_msg(
        &refusal(&obj[..obj.len() / 2], "g.o"),
        "g.o: malformed ELF: section header 0 lies beyond the end of the file",
    );
    assert_eq!(refusal(b"", "empty.o"), "empty.o: not an ELF file");
}

#[test]
fn missing_btf_for_btf_maps() {
    let obj = compile_args("maps.bpf.c", &["-target", "bpf"]);
    assert_eq!(
        refusal(&obj, "maps.bpf.o"),
        "maps.bpf.o: section .maps: BTF-defined maps need BTF, but the object has no .BTF section (compile with -g)"
    );
}

#[test]
fn unknown_map_type() {
    assert_eq!(refused("bad/map_type.bpf.c"), "map_type.bpf.o: section .maps: map `strange`: unknown map type 999");
}

#[test]
fn undefined_symbol() {
    assert_eq!(
        refused("bad/undefined.bpf.c"),
        "undefined.bpf.o: section uprobe/foo: relocation at instruction 1 refers to symbol `bar`, which is not defined"
    );
}

#[test]
fn max_entries_too_large() {
    assert_eq!(
        refused("bad/max_entries.bpf.c"),
        "max_entries.bpf.o: section .maps: map `huge`: max_entries 1073741824 exceeds the limit of 16777216"
    );
    // The limit is the caller's to set.
    let mut opts = ParseOptions::default();
    opts.limits.max_entries = 1 << 30;
    opts.limits.max_total_bytes = 1 << 40;
    let o = Object::parse_with_options(&compile("bad/max_entries.bpf.c"), "max_entries.bpf.o", &opts).unwrap();
    assert_eq!(o.maps[0].max_entries, 1 << 30);
}

#[test]
fn kfunc_extern() {
    assert_eq!(
        refused("bad/kfunc.bpf.c"),
        "kfunc.bpf.o: extern `bpf_task_acquire`: __ksym kfuncs are resolved against the running kernel, which a \
         user-space runtime cannot do (declare it __weak to let it resolve to 0)"
    );
}

#[test]
fn strong_kconfig_extern_without_value() {
    let msg = refused("bad/kconfig.bpf.c");
    assert_msg(&msg, "kconfig.bpf.o: extern `CONFIG_USERBPF_SURELY_MISSING`: no value for this kconfig extern");
}

#[test]
fn static_program() {
    assert_eq!(
        refused("bad/static_prog.bpf.c"),
        "static_prog.bpf.o: section uprobe: program `hidden`: program is static; programs outside .text must be global"
    );
}

#[test]
fn malformed_section_name() {
    assert_eq!(
        refused("bad/bad_section.bpf.c"),
        "bad_section.bpf.o: section uprobe/usr/bin/true: program `p`: invalid section name: missing ':function[+offset]' specification"
    );
}

/// File range of a section's contents.
fn section_range(obj: &[u8], name: &str) -> std::ops::Range<usize> {
    let elf = Elf::parse(obj).unwrap();
    let s = elf.section_by_name(name).unwrap_or_else(|| panic!("no section {name}"));
    let start = s.data.as_ptr() as usize - obj.as_ptr() as usize;
    start..start + s.data.len()
}

#[test]
fn bad_section_data() {
    let obj = compile("globals.bpf.c");
    // .BTF with a broken magic.
    let mut b = obj.clone();
    let r = section_range(&b, ".BTF");
    b[r.start] = 0x12;
    assert_eq!(refusal(&b, "g.o"), "g.o: section .BTF: bad BTF magic 0xeb12 (expected 0xeb9f)");
    // .BTF whose string section runs past the data.
    let mut b = obj.clone();
    let r = section_range(&b, ".BTF");
    b[r.start + 20..r.start + 24].copy_from_slice(&0x7fff_0000u32.to_le_bytes());
    assert_msg(&refusal(&b, "g.o"), "g.o: section .BTF: BTF data is truncated: string section");
    // .BTF.ext with an absurd func_info record size.
    let mut b = obj.clone();
    let r = section_range(&b, ".BTF.ext");
    let fi_off = u32::from_le_bytes(b[r.start + 8..r.start + 12].try_into().unwrap()) as usize;
    let hdr = u32::from_le_bytes(b[r.start + 4..r.start + 8].try_into().unwrap()) as usize;
    b[r.start + hdr + fi_off..r.start + hdr + fi_off + 4].copy_from_slice(&3u32.to_le_bytes());
    assert_eq!(refusal(&b, "g.o"), "g.o: section .BTF.ext: bad .BTF.ext: func_info: record size 3 is invalid");
    // A relocation naming a symbol that does not exist.
    let mut b = obj.clone();
    let r = section_range(&b, ".reluprobe");
    b[r.start + 12..r.start + 16].copy_from_slice(&9999u32.to_le_bytes());
    assert_eq!(
        refusal(&b, "g.o"),
        "g.o: section uprobe: relocation at instruction 1 refers to symbol `#9999`, which does not exist"
    );
    // A relocation pointing into the middle of an instruction.
    let mut b = obj.clone();
    let r = section_range(&b, ".reluprobe");
    b[r.start] = 3;
    assert_eq!(refusal(&b, "g.o"), "g.o: section uprobe: relocation offset 0x3 is not an instruction of the section");
    // A relocation on an instruction that is neither a call nor a 64-bit load.
    let mut b = obj.clone();
    let r = section_range(&b, ".reluprobe");
    b[r.start] = 0x10; // insn 2: r0 <<= 32
    assert_eq!(
        refusal(&b, "g.o"),
        "g.o: section uprobe: relocation at instruction 2 refers to symbol `global_helper`, but the instruction (opcode 0x67) is neither a call nor a 64-bit load"
    );
    // A version section of the wrong size.
    let sec = compile("sections.bpf.c");
    let mut b = sec.clone();
    let elf = Elf::parse(&sec).unwrap();
    let vidx = elf.section_by_name("version").unwrap().index;
    let shoff = u64::from_le_bytes(sec[40..48].try_into().unwrap()) as usize;
    let size_at = shoff + vidx * 64 + 32;
    b[size_at..size_at + 8].copy_from_slice(&3u64.to_le_bytes());
    assert_eq!(refusal(&b, "s.o"), "s.o: section version: size 3 is not 4");
}

use userbpf_testutil::Rng;

/// Byte ranges worth corrupting: the ELF and section headers and every section the loader reads.
fn interesting_ranges(obj: &[u8]) -> Vec<std::ops::Range<usize>> {
    let elf = Elf::parse(obj).unwrap();
    let shoff = u64::from_le_bytes(obj[40..48].try_into().unwrap()) as usize;
    let mut v = vec![0..64, shoff..obj.len()];
    for s in &elf.sections {
        if s.data.is_empty() || s.name.starts_with(".debug") || s.name.starts_with(".rel.debug") {
            continue;
        }
        let start = s.data.as_ptr() as usize - obj.as_ptr() as usize;
        v.push(start..start + s.data.len());
    }
    v
}

#[test]
fn fuzz_truncated_and_bit_flipped_objects() {
    let target = {
        let t = compile("core_target.bpf.c");
        Btf::parse(Elf::parse(&t).unwrap().section_by_name(".BTF").unwrap().data).unwrap()
    };
    // USERBPF_FUZZ_ITERS / USERBPF_FUZZ_SEED run longer or different campaigns.
    let iters: usize = std::env::var("USERBPF_FUZZ_ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(1500);
    let seed: u64 =
        std::env::var("USERBPF_FUZZ_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(0x9e37_79b9_7f4a_7c15);
    let mut rng = Rng::new(seed);
    // How far each mutant got: refused while reading the ELF file, its BTF, its symbols and
    // relocations, its maps and programs, or CO-RE; or accepted.
    let mut stages = Stages::default();
    for src in [
        "globals.bpf.c",
        "maps.bpf.c",
        "legacy.bpf.c",
        "core.bpf.c",
        "kconfig.bpf.c",
        "printer.bpf.c",
        "sections.bpf.c",
        "btf_kinds.bpf.c",
        "core_ptregs.bpf.c",
        "text_only.bpf.c",
    ] {
        let obj = compile(src);
        let mut tally = |r: Result<Object, userbpf_object::ObjectError>| {
            if let Err(e) = &r {
                assert!(e.to_string().starts_with("f.o: "), "{e}");
            }
            stages.count(&r);
        };
        // Every prefix length in steps.
        let step = (obj.len() / 300).max(1);
        for n in (0..obj.len()).step_by(step) {
            tally(Object::parse(&obj[..n], "f.o"));
        }
        // Random bit flips, mostly in the parts the loader reads.
        let ranges = interesting_ranges(&obj);
        for _ in 0..iters {
            let mut b = obj.clone();
            for _ in 0..1 + rng.index(4) {
                let r = &ranges[rng.index(ranges.len())];
                if r.is_empty() {
                    continue;
                }
                let i = r.start + rng.index(r.len());
                b[i] ^= 1 << rng.index(8);
            }
            // Occasionally overwrite a whole word with an extreme value.
            if rng.index(4) == 0 {
                let r = &ranges[rng.index(ranges.len())];
                if r.len() >= 4 {
                    let i = r.start + rng.index(r.len() - 3);
                    let v: u32 = [0, 1, 0x7fff_ffff, 0xffff_ffff, 0x8000_0000][rng.index(5)];
                    b[i..i + 4].copy_from_slice(&v.to_le_bytes());
                }
            }
            tally(Object::parse_with(&b, "f.o", Some(&target)));
            tally(Object::parse(&b, "f.o"));
        }
    }
    eprintln!("fuzz: {stages:?}");
    // Mutants must reach every stage of the loader, or the campaign tests only the first one.
    // The bounds are far below what the default seed gives (see the line above), so that other
    // seeds pass too, and far above zero.
    let total = stages.total();
    assert!(stages.elf > total / 20, "too few mutants refused by the ELF reader: {stages:?}");
    assert!(stages.btf > total / 200, "too few mutants reached the BTF reader: {stages:?}");
    assert!(stages.symbols > total / 200, "too few mutants reached symbols and relocations: {stages:?}");
    assert!(stages.maps_programs > total / 1000, "too few mutants reached maps and programs: {stages:?}");
    assert!(stages.core > total / 1000, "too few mutants reached CO-RE relocation: {stages:?}");
    assert!(stages.accepted > total / 20, "too few mutants accepted: {stages:?}");
}

/// Mutants counted by the loader stage that refused them.
#[derive(Debug, Default)]
struct Stages {
    elf: usize,
    btf: usize,
    symbols: usize,
    maps_programs: usize,
    core: usize,
    accepted: usize,
}

impl Stages {
    fn count(&mut self, r: &Result<Object, userbpf_object::ObjectError>) {
        use userbpf_object::ErrorKind as K;
        let slot = match r {
            Ok(_) => &mut self.accepted,
            Err(e) => match &e.kind {
                K::Io(_)
                | K::NotElf
                | K::Not64Bit
                | K::BigEndian
                | K::WrongMachine { .. }
                | K::NotRelocatable(_)
                | K::BadElf(_)
                | K::Section { .. } => &mut self.elf,
                K::Btf { .. } | K::MissingBtf { .. } => &mut self.btf,
                K::Relocation { .. } | K::Symbol { .. } | K::Extern { .. } => &mut self.symbols,
                K::Program { .. } | K::Map { .. } => &mut self.maps_programs,
                K::Core(_) => &mut self.core,
            },
        };
        *slot += 1;
    }
    fn total(&self) -> usize {
        self.elf + self.btf + self.symbols + self.maps_programs + self.core + self.accepted
    }
}

#[test]
fn fuzz_btf_and_printer() {
    let mut rng = Rng::new(42);
    let (mut parsed, mut refused) = (0usize, 0usize);
    for src in ["printer.bpf.c", "btf_kinds.bpf.c", "maps.bpf.c"] {
        let obj = compile(src);
        let r = section_range(&obj, ".BTF");
        let raw = obj[r].to_vec();
        for _ in 0..3000 {
            let mut b = raw.clone();
            for _ in 0..1 + rng.index(3) {
                let i = rng.index(b.len());
                b[i] ^= 1 << rng.index(8);
            }
            let Ok(btf) = Btf::parse(&b) else {
                refused += 1;
                continue;
            };
            parsed += 1;
            // Walk every type with every accessor, and print random data as it.
            let data: Vec<u8> = (0..256).map(|_| rng.next_u64() as u8).collect();
            for (id, _) in btf.types() {
                let _ = btf.resolve_size(id);
                let _ = btf.align_of(id);
                let _ = btf.type_name(id);
                let _ = btf.skip_mods_and_typedefs(id);
                let _ = btf.find_member(id, "id");
                let _ = format_value(&btf, id, &data);
                let _ = userbpf_object::btf::format::to_json(&btf, id, &data);
            }
        }
    }
    eprintln!("fuzz: {parsed} BTF mutants parsed and printed, {refused} refused");
    // Both outcomes must be common, or the printer is not exercised (or the parser not tested).
    assert!(parsed > 1000 && refused > 1000, "{parsed} parsed, {refused} refused");
}
