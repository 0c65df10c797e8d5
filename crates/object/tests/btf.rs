//! The BTF parser (against `bpftool btf dump`, on test objects and on the running kernel's
//! BTF) and the typed value printer.

mod common;

use common::compile;
use std::process::Command;
use userbpf_object::Object;
use userbpf_object::btf::format::{format_value, to_json};
use userbpf_object::btf::{Btf, Kind, TypeKind};
use userbpf_object::elf::Elf;

/// The raw `.BTF` section of an object.
fn raw_btf(obj: &[u8]) -> Btf {
    let elf = Elf::parse(obj).expect("elf");
    let sec = elf.section_by_name(".BTF").expect(".BTF section");
    Btf::parse(sec.data).expect("parse .BTF")
}

fn q(s: &str) -> String {
    if s.is_empty() { "'(anon)'".into() } else { format!("'{s}'") }
}

/// Renders BTF the way `bpftool btf dump file` does (plain text).
fn bpftool_style(btf: &Btf) -> String {
    let mut out = String::new();
    for (id, t) in btf.types() {
        let name = btf.name_of(t.name_off);
        out.push_str(&format!("[{id}] {} {}", t.kind().name(), q(name)));
        match &t.kind {
            TypeKind::Int(i) => {
                let enc = if i.is_signed() {
                    "SIGNED"
                } else if i.is_char() {
                    "CHAR"
                } else if i.is_bool() {
                    "BOOL"
                } else {
                    "(none)"
                };
                out.push_str(&format!(" size={} bits_offset={} nr_bits={} encoding={enc}", i.size, i.offset, i.bits));
            }
            TypeKind::Ptr(r)
            | TypeKind::Typedef(r)
            | TypeKind::Volatile(r)
            | TypeKind::Const(r)
            | TypeKind::Restrict(r)
            | TypeKind::TypeTag(r) => out.push_str(&format!(" type_id={r}")),
            TypeKind::Array(a) => {
                out.push_str(&format!(" type_id={} index_type_id={} nr_elems={}", a.elem_type, a.index_type, a.nelems))
            }
            TypeKind::Struct(c) | TypeKind::Union(c) => {
                out.push_str(&format!(" size={} vlen={}", c.size, c.members.len()));
                for m in &c.members {
                    out.push_str(&format!(
                        "\n\t{} type_id={} bits_offset={}",
                        q(btf.name_of(m.name_off)),
                        m.type_id,
                        m.bit_offset
                    ));
                    if m.bitfield_size != 0 {
                        out.push_str(&format!(" bitfield_size={}", m.bitfield_size));
                    }
                }
            }
            TypeKind::Enum(e) | TypeKind::Enum64(e) => {
                let is64 = t.kind() == Kind::Enum64;
                let enc = if e.signed { "SIGNED" } else { "UNSIGNED" };
                out.push_str(&format!(" encoding={enc} size={} vlen={}", e.size, e.values.len()));
                for v in &e.values {
                    let n = q(btf.name_of(v.name_off));
                    match (is64, e.signed) {
                        (false, true) => out.push_str(&format!("\n\t{n} val={}", v.value as i64 as i32)),
                        (false, false) => out.push_str(&format!("\n\t{n} val={}", v.value as u32)),
                        (true, true) => out.push_str(&format!("\n\t{n} val={}LL", v.value as i64)),
                        (true, false) => out.push_str(&format!("\n\t{n} val={}ULL", v.value)),
                    }
                }
            }
            TypeKind::Fwd { is_union } => {
                out.push_str(&format!(" fwd_kind={}", if *is_union { "union" } else { "struct" }))
            }
            TypeKind::Func { proto, linkage } => {
                let l = ["static", "global", "extern"].get(*linkage as usize).copied().unwrap_or("(unknown)");
                out.push_str(&format!(" type_id={proto} linkage={l}"));
            }
            TypeKind::FuncProto(p) => {
                out.push_str(&format!(" ret_type_id={} vlen={}", p.ret_type, p.params.len()));
                for prm in &p.params {
                    out.push_str(&format!("\n\t{} type_id={}", q(btf.name_of(prm.name_off)), prm.type_id));
                }
            }
            TypeKind::Var { type_id, linkage } => {
                let l = ["static", "global", "extern"].get(*linkage as usize).copied().unwrap_or("(unknown)");
                out.push_str(&format!(" type_id={type_id}, linkage={l}"));
            }
            TypeKind::Datasec(d) => {
                out.push_str(&format!(" size={} vlen={}", d.size, d.vars.len()));
                for v in &d.vars {
                    out.push_str(&format!(
                        "\n\ttype_id={} offset={} size={} ({} {})",
                        v.type_id,
                        v.offset,
                        v.size,
                        btf.type_by_id(v.type_id).map_or("?", |t| t.kind().name()),
                        q(btf.name(v.type_id))
                    ));
                }
            }
            TypeKind::Float { size } => out.push_str(&format!(" size={size}")),
            TypeKind::DeclTag { type_id, component_idx } => {
                out.push_str(&format!(" type_id={type_id} component_idx={component_idx}"))
            }
            TypeKind::Void => {}
        }
        out.push('\n');
    }
    out
}

fn bpftool_dump(path: &std::path::Path) -> Option<String> {
    match Command::new("bpftool").args(["btf", "dump", "file"]).arg(path).output() {
        Ok(o) if o.status.success() => Some(String::from_utf8_lossy(&o.stdout).into_owned()),
        Ok(o) => panic!("bpftool failed: {}", String::from_utf8_lossy(&o.stderr)),
        Err(e) => {
            userbpf_testutil::require(false, &format!("bpftool ({e}) for the comparison with `bpftool btf dump`"));
            None
        }
    }
}

#[test]
fn btf_matches_bpftool_on_test_objects() {
    for src in ["btf_kinds.bpf.c", "globals.bpf.c", "maps.bpf.c", "printer.bpf.c", "core.bpf.c", "kconfig.bpf.c"] {
        let obj = compile(src);
        let path = common::out_dir().join(format!("bpftool-{}.o", src.replace('/', "_")));
        std::fs::write(&path, &obj).unwrap();
        let Some(expected) = bpftool_dump(&path) else { return };
        let mine = bpftool_style(&raw_btf(&obj));
        assert_eq!(mine.trim_end(), expected.trim_end(), "BTF dump of {src} differs from bpftool's");
    }
}

#[test]
fn btf_kinds_accessors() {
    let btf = raw_btf(&compile("btf_kinds.bpf.c"));
    let tagged = btf.find_by_name_kind("tagged", Kind::Struct).unwrap();
    assert_eq!(btf.resolve_size(tagged).unwrap(), 112);
    assert_eq!(btf.align_of(tagged).unwrap(), 8); // libbpf caps alignment at the pointer size
    let (m, off) = btf.find_member(tagged, "wide").unwrap();
    assert_eq!(off, 640);
    assert_eq!(btf.resolve_size(m.type_id).unwrap(), 16);
    let (cv, _) = btf.find_member(tagged, "cv").unwrap();
    assert_eq!(btf.type_name(cv.type_id), "const volatile int");
    assert_eq!(btf.resolve(cv.type_id).unwrap().kind(), Kind::Int);
    let (uptr, _) = btf.find_member(tagged, "uptr").unwrap();
    assert_eq!(btf.type_name(uptr.type_id), "int *");
    let (fwd, _) = btf.find_member(tagged, "fwdu").unwrap();
    assert_eq!(btf.type_name(fwd.type_id), "union fwd_union *");
    let (t, _) = btf.find_member(tagged, "t").unwrap();
    assert_eq!(btf.type_name(t.type_id), "u64_t");
    assert_eq!(btf.resolve_size(t.type_id).unwrap(), 8);
    let fwd_id = btf.find_by_name_kind("fwd_only", Kind::Fwd).unwrap();
    assert!(btf.resolve_size(fwd_id).is_err());
    // Round trip through the serialiser.
    assert_eq!(Btf::parse(&btf.to_bytes()).unwrap(), btf);
}

#[test]
fn vmlinux_btf() {
    let path = std::path::Path::new("/sys/kernel/btf/vmlinux");
    if !userbpf_testutil::require(path.exists(), "the kernel's BTF (/sys/kernel/btf/vmlinux)") {
        return;
    }
    let btf = Btf::parse_file(path).unwrap().unwrap();
    assert!(btf.len() > 1000);
    let task = btf.find_by_name_kind("task_struct", Kind::Struct).unwrap();
    assert!(btf.find_member(task, "pid").is_some());
    assert!(btf.resolve_size(task).unwrap() > 1000);
    if cfg!(target_arch = "x86_64") {
        let regs = btf.find_by_name_kind("pt_regs", Kind::Struct).unwrap();
        assert_eq!(btf.resolve_size(regs).unwrap(), 168);
        assert_eq!(btf.find_member(regs, "di").unwrap().1, 14 * 64);
    }
    if let Some(expected) = bpftool_dump(path) {
        let mine = bpftool_style(&btf);
        if mine.trim_end() != expected.trim_end() {
            let first = mine.lines().zip(expected.lines()).position(|(a, b)| a != b);
            panic!("vmlinux dump differs at line {first:?}");
        }
    }
}

fn set(buf: &mut [u8], off: usize, bytes: &[u8]) {
    buf[off..off + bytes.len()].copy_from_slice(bytes);
}

fn set_bits(buf: &mut [u8], bit_off: u32, bits: u32, value: u64) {
    for i in 0..bits {
        let b = bit_off + i;
        let byte = (b / 8) as usize;
        let mask = 1u8 << (b % 8);
        if value >> i & 1 == 1 {
            buf[byte] |= mask;
        } else {
            buf[byte] &= !mask;
        }
    }
}

#[test]
fn printer_record() {
    let obj = Object::parse(&compile("printer.bpf.c"), "printer.bpf.o").unwrap();
    let btf = obj.btf.as_ref().unwrap();
    let (_, map) = obj.map("records").unwrap();
    let vt = map.value_type_id.unwrap();
    assert_eq!(btf.type_name(vt), "struct record");
    let mut v = vec![0u8; map.value_size as usize];
    let off = |name: &str| btf.find_member(vt, name).unwrap().1;
    let byte = |name: &str| (off(name) / 8) as usize;
    set(&mut v, byte("id"), &42i32.to_le_bytes());
    set(&mut v, byte("name"), b"bash\0\0\0\0");
    set(&mut v, byte("col"), &7u32.to_le_bytes());
    set_bits(&mut v, off("flag"), 1, 1);
    set_bits(&mut v, off("level"), 4, 9);
    set_bits(&mut v, off("neg"), 5, (-3i64) as u64);
    set_bits(&mut v, off("bfcol"), 3, 1);
    let inners = byte("inners");
    set(&mut v, inners, &(-2i16).to_le_bytes());
    set(&mut v, inners + 2, &[1, 2, 3]);
    set(&mut v, inners + 6, &300i16.to_le_bytes());
    set(&mut v, inners + 8, &[4, 5, 6]);
    for (i, x) in [1i32, 2, 3, 4, 5, 6].iter().enumerate() {
        set(&mut v, byte("matrix") + 4 * i, &x.to_le_bytes());
    }
    v[byte("ok")] = 1;
    set(&mut v, byte("ptr"), &0x7ffd1000u64.to_le_bytes());
    set(&mut v, byte("ratio"), &0.5f64.to_le_bytes());
    set(&mut v, byte("f"), &1.25f32.to_le_bytes());
    set(&mut v, byte("u"), &0x01020304i32.to_le_bytes());
    set(&mut v, byte("ax"), &10i32.to_le_bytes());
    set(&mut v, byte("ay"), &(-20i32).to_le_bytes());
    set(&mut v, byte("notstr"), b"abcd");
    set(&mut v, byte("big"), &(-5i64).to_le_bytes());
    set(&mut v, byte("ubig"), &u64::MAX.to_le_bytes());
    v[byte("c")] = b'A';

    let text = format_value(btf, vt, &v).unwrap();
    assert_eq!(
        text,
        "{ .id = 42, .name = \"bash\", .col = BLUE, .flag = 1, .level = 9, .neg = -3, .bfcol = GREEN, \
         .inners = [{ .s = -2, .bytes = [1, 2, 3] }, { .s = 300, .bytes = [4, 5, 6] }], \
         .matrix = [[1, 2, 3], [4, 5, 6]], .ok = true, .ptr = 0x7ffd1000, .ratio = 0.5, .f = 1.25, \
         .u = { .as_int = 16909060, .raw4 = [4, 3, 2, 1] }, .ax = 10, .ay = -20, .notstr = [97, 98, 99, 100], \
         .big = -5, .ubig = 18446744073709551615, .c = 65 }"
    );
    let j = to_json(btf, vt, &v).unwrap();
    assert_eq!(j["name"], "bash");
    assert_eq!(j["col"], "BLUE");
    assert_eq!(j["neg"], -3);
    assert_eq!(j["inners"][1]["s"], 300);
    assert_eq!(j["matrix"][1][2], 6);
    assert_eq!(j["ptr"], 0x7ffd1000u64);
    assert_eq!(j["ok"], true);
    assert_eq!(j["ratio"], 0.5);
    assert_eq!(j["ubig"], u64::MAX);
    let keys: Vec<&String> = j.as_object().unwrap().keys().collect();
    assert_eq!(keys[..4], ["id", "name", "col", "flag"]);

    // Unknown enum values print as numbers; keys print too.
    set(&mut v, byte("col"), &3u32.to_le_bytes());
    assert!(format_value(btf, vt, &v).unwrap().contains(".col = 3,"));
    assert_eq!(format_value(btf, map.key_type_id.unwrap(), &5u32.to_le_bytes()).unwrap(), "5");

    // Too little data is an error, never a panic.
    assert!(format_value(btf, vt, &v[..10]).is_err());
    // The whole .bss map, through its DATASEC.
    let (_, bss) = obj.map("printer.bss").unwrap();
    let dump = format_value(btf, bss.value_type_id.unwrap(), bss.initial.as_ref().unwrap()).unwrap();
    assert!(dump.starts_with("{ .last_record = { .id = 0, .name = \"\", .col = RED,"), "{dump}");
}

#[test]
fn printer_global_sections() {
    let obj = Object::parse(&compile("globals.bpf.c"), "globals.bpf.o").unwrap();
    let btf = obj.btf.as_ref().unwrap();
    let show = |name: &str| {
        let (_, m) = obj.map(name).unwrap();
        format_value(btf, m.value_type_id.unwrap(), m.initial.as_ref().unwrap()).unwrap()
    };
    assert_eq!(show("globals.rodata"), "{ .limit = 42 }");
    assert_eq!(show("globals.data"), "{ .counter = 7 }");
    assert_eq!(show(".data.foo"), "{ .greeting = \"hello\" }");
    assert_eq!(show("globals.bss"), "{ .hits = [0, 0, 0, 0], .static_scratch = 0 }");
}

#[test]
fn printer_kinds() {
    let obj = Object::parse(&compile("btf_kinds.bpf.c"), "btf_kinds.bpf.o").unwrap();
    let btf = obj.btf.as_ref().unwrap();
    let t = btf.find_by_name_kind("tagged", Kind::Struct).unwrap();
    let mut v = vec![0u8; 112];
    v[0] = 0xff;
    v[1] = 0xff;
    v[2] = 0xff;
    v[3] = 0xff; // member = -1
    set(&mut v, 80, &u64::MAX.to_le_bytes()); // wide = 2^64 - 1
    set(&mut v, 64, &(-3i32).to_le_bytes()); // se = NEG
    let text = format_value(btf, t, &v).unwrap();
    assert!(
        text.starts_with("{ .member = -1, .cv = 0, .uptr = 0x0, .fwd = 0x0, .fwdu = 0x0, .f = 0.0, .d = 0.0,"),
        "{text}"
    );
    assert!(text.contains(".se = NEG,"), "{text}");
    assert!(text.contains(".wide = 0xffffffffffffffff,"), "{text}");
    assert!(text.ends_with(".fnptr = 0x0, .rp = 0x0 }"), "{text}");
    let j = to_json(btf, t, &v).unwrap();
    assert_eq!(j["wide"], "0xffffffffffffffff");
    // A FWD has no value.
    let fwd = btf.find_by_name_kind("fwd_only", Kind::Fwd).unwrap();
    assert!(format_value(btf, fwd, &v).is_err());
}
