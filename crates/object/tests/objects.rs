//! Programs, sections, maps, global data, subprograms and externs of clang-compiled objects.

mod common;

use common::{compile, obj_name};
use userbpf_isa::*;
use userbpf_object::maps::{BPF_F_MMAPABLE, BPF_F_RDONLY_PROG};
use userbpf_object::*;

fn load(src: &str) -> Object {
    let bytes = compile(src);
    Object::parse(&bytes, &obj_name(src)).unwrap_or_else(|e| panic!("{e}"))
}

/// Every BPF-to-BPF call and function address of a program, as (instruction, target function).
/// Fails when one does not land on the start of a placed function.
fn calls(p: &ProgramSpec) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < p.insns.len() {
        let insn = p.insns[i];
        let is_call = insn.op == OP_CALL && insn.src == BPF_PSEUDO_CALL;
        let is_addr = insn.is_lddw() && insn.src == BPF_PSEUDO_FUNC;
        if is_call || is_addr {
            let target = i as i64 + insn.imm as i64 + 1;
            let f = p
                .functions
                .iter()
                .find(|f| f.start as i64 == target)
                .unwrap_or_else(|| panic!("{}: instruction {i} targets {target}, not a function start", p.name));
            out.push((i, f.name.clone()));
        }
        i += if insn.is_lddw() { 2 } else { 1 };
    }
    out
}

/// Every `lddw` with a pseudo source: (instruction, src, imm, second imm).
fn loads(p: &ProgramSpec) -> Vec<(usize, u8, i32, i32)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < p.insns.len() {
        let insn = p.insns[i];
        if insn.is_lddw() {
            if insn.src != 0 {
                out.push((i, insn.src, insn.imm, p.insns[i + 1].imm));
            }
            i += 2;
        } else {
            i += 1;
        }
    }
    out
}

fn map_idx(o: &Object, name: &str) -> i32 {
    o.map(name).unwrap_or_else(|| panic!("no map {name}")).0 as i32
}

#[test]
fn section_kinds() {
    let o = load("sections.bpf.c");
    assert_eq!(o.license, "GPL");
    assert_eq!(o.kern_version, Some(0x050a00));
    let kind = |name: &str| o.program(name).unwrap_or_else(|| panic!("no program {name}")).kind.clone();
    let up = |retprobe, target| ProgramKind::Uprobe { retprobe, target };
    let ut = |path: &str, func: &str, offset| Some(UprobeTarget { path: path.into(), func: Some(func.into()), offset });
    let ko = |k: &str| ProgramKind::KernelOnly { kind: k.into() };
    assert_eq!(kind("up_plain"), up(false, None));
    assert_eq!(kind("uret_plain"), up(true, None));
    assert_eq!(kind("up_target"), up(false, ut("/usr/lib/libc.so.6", "malloc", 16)));
    assert_eq!(kind("uret_target"), up(true, ut("./myapp", "handle_request", 0)));
    assert_eq!(kind("up_sleepable"), up(false, ut("./myapp", "sleepy", 0)));
    assert_eq!(kind("uret_sleepable"), up(true, None));
    assert_eq!(kind("usdt_plain"), ProgramKind::Usdt { target: None });
    assert_eq!(
        kind("usdt_target"),
        ProgramKind::Usdt {
            target: Some(UsdtTarget { path: "./myapp".into(), provider: "myprov".into(), name: "myprobe".into() })
        }
    );
    let tp = |c: &str, n: &str| ProgramKind::Tracepoint { category: c.into(), name: n.into() };
    assert_eq!(kind("tp_long"), tp("syscalls", "sys_enter_openat"));
    assert_eq!(kind("tp_short"), tp("sched", "sched_switch"));
    assert_eq!(kind("raw_long"), ProgramKind::RawTracepoint { name: "sys_enter".into() });
    assert_eq!(kind("raw_short"), ProgramKind::RawTracepoint { name: "sys_exit".into() });
    for (p, k) in [
        ("kp", "kprobe"),
        ("krp", "kretprobe"),
        ("fen", "fentry"),
        ("fex", "fexit"),
        ("fmr", "fmod_ret"),
        ("lsm_prog", "lsm"),
        ("it", "iter"),
        ("xdp_prog", "xdp"),
        ("tc_prog", "tc"),
        ("sock", "socket"),
        ("cg", "cgroup/connect4"),
        ("pe", "perf_event"),
        ("so", "struct_ops"),
    ] {
        assert_eq!(kind(p), ko(k), "{p}");
    }
    assert_eq!(kind("custom"), ProgramKind::Unknown);
    assert_eq!(o.program("custom").unwrap().section, "my_custom_section");
    // Sleepable and autoload flags.
    assert!(o.program("up_sleepable").unwrap().sleepable);
    assert!(o.program("uret_sleepable").unwrap().sleepable);
    assert!(!o.program("up_plain").unwrap().sleepable);
    let na = o.program("up_noautoload").unwrap();
    assert!(!na.autoload);
    assert_eq!(na.section, "uprobe");
    assert_eq!(na.kind, up(false, None));
    assert_eq!(o.programs.len(), 27);
    // Each program is `r0 = LINE; exit`.
    for p in &o.programs {
        assert_eq!(p.insns.len(), 2, "{}", p.name);
        assert_eq!(p.insns[1].op, OP_EXIT);
    }
}

#[test]
fn subprograms_and_global_data() {
    let o = load("globals.bpf.c");
    assert_eq!(o.name, "globals");
    assert_eq!(o.license, "Dual BSD/GPL");
    let names: Vec<&str> = o.maps.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["counts", "globals.data", "globals.rodata", ".data.foo", "globals.bss"]);

    let data = &o.maps[1];
    assert_eq!(data.kind, MapKind::Data { section: ".data".into(), readonly: false });
    assert_eq!((data.map_type, data.key_size, data.value_size, data.max_entries), (2, 4, 4, 1));
    assert_eq!(data.initial.as_deref(), Some(&7i32.to_le_bytes()[..]));
    assert_eq!(data.map_flags, BPF_F_MMAPABLE);
    let ro = &o.maps[2];
    assert_eq!(ro.kind, MapKind::Data { section: ".rodata".into(), readonly: true });
    assert_eq!(ro.map_flags, BPF_F_RDONLY_PROG | BPF_F_MMAPABLE);
    assert!(ro.is_readonly());
    assert_eq!(ro.initial.as_deref(), Some(&42i32.to_le_bytes()[..]));
    let foo = &o.maps[3];
    assert_eq!(foo.initial.as_ref().unwrap()[..6], *b"hello\0");
    let bss = &o.maps[4];
    assert_eq!(bss.value_size, 36);
    assert_eq!(bss.initial.as_deref(), Some(&[0u8; 36][..]));
    let btf = o.btf.as_ref().unwrap();
    assert_eq!(btf.type_name(bss.value_type_id.unwrap()), "datasec .bss");

    // prog_one: global_helper, then the bpf_loop callback, then add_twice (called by
    // global_helper), in the order libbpf appends them.
    let one = o.program("prog_one").unwrap();
    let order: Vec<&str> = one.functions.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(order, ["prog_one", "global_helper", "loop_cb", "add_twice"]);
    let c1 = calls(one);
    assert_eq!(c1.iter().map(|(_, n)| n.as_str()).collect::<Vec<_>>(), ["global_helper", "loop_cb", "add_twice"]);
    // The callback address is a BPF_PSEUDO_FUNC load.
    let cb = c1.iter().find(|(_, n)| n == "loop_cb").unwrap().0;
    assert!(one.insns[cb].is_lddw() && one.insns[cb].src == BPF_PSEUDO_FUNC);
    assert_eq!(one.insns[cb + 1].imm, 0);

    // prog_two calls add_twice directly first: a different placement, and global_helper's
    // call to add_twice (a same-section static call without relocation) must follow it.
    let two = o.program("prog_two").unwrap();
    let order: Vec<&str> = two.functions.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(order, ["prog_two", "add_twice", "global_helper"]);
    let c2 = calls(two);
    assert_eq!(c2.iter().map(|(_, n)| n.as_str()).collect::<Vec<_>>(), ["add_twice", "global_helper", "add_twice"]);
    let gh = two.functions[2].start;
    assert!(c2[2].0 > gh, "the last call is inside global_helper");

    // prog_three calls prog_two, an entry program of another section: it is appended with
    // everything it calls.
    let three = o.program("prog_three").unwrap();
    let order: Vec<&str> = three.functions.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(order, ["prog_three", "prog_two", "add_twice", "global_helper"]);
    assert_eq!(
        calls(three).iter().map(|(_, n)| n.as_str()).collect::<Vec<_>>(),
        ["prog_two", "add_twice", "global_helper", "add_twice"]
    );
    assert_eq!(three.kind, ProgramKind::Usdt { target: None });

    // Map and global variable references.
    let (counts, d, r, f, b) = (
        map_idx(&o, "counts"),
        map_idx(&o, "globals.data"),
        map_idx(&o, "globals.rodata"),
        map_idx(&o, ".data.foo"),
        map_idx(&o, "globals.bss"),
    );
    let l1: Vec<(u8, i32, i32)> =
        loads(one).into_iter().filter(|l| l.1 != BPF_PSEUDO_FUNC).map(|l| (l.1, l.2, l.3)).collect();
    assert_eq!(
        l1,
        [
            (BPF_PSEUDO_MAP_IDX_VALUE, b, 0),  // hits[0] in prog_one
            (BPF_PSEUDO_MAP_IDX_VALUE, f, 0),  // greeting
            (BPF_PSEUDO_MAP_IDX, counts, 0),   // counts in global_helper
            (BPF_PSEUDO_MAP_IDX_VALUE, d, 0),  // counter
            (BPF_PSEUDO_MAP_IDX_VALUE, b, 0),  // hits in loop_cb
            (BPF_PSEUDO_MAP_IDX_VALUE, b, 32), // static_scratch (section-relative)
            (BPF_PSEUDO_MAP_IDX_VALUE, r, 0),  // limit
        ]
    );
    // Every lddw of the object was rewritten.
    for p in &o.programs {
        for (i, src, _, _) in loads(p) {
            assert!([BPF_PSEUDO_MAP_IDX, BPF_PSEUDO_MAP_IDX_VALUE, BPF_PSEUDO_FUNC].contains(&src), "{} {i}", p.name);
        }
    }

    // func_info: one record per placed function, at its start.
    for p in &o.programs {
        let starts: Vec<u32> = p.functions.iter().map(|f| f.start as u32).collect();
        let fi: Vec<u32> = p.func_info.iter().map(|r| r.insn_off).collect();
        assert_eq!(fi, starts, "{}", p.name);
        for (r, f) in p.func_info.iter().zip(&p.functions) {
            assert_eq!(btf.name(r.type_id), f.name);
        }
        assert!(!p.line_info.is_empty());
        assert!(p.line_info.iter().all(|l| (l.insn_off as usize) < p.insns.len()));
        assert!(p.line_info.iter().any(|l| l.insn_off as usize >= p.functions.last().unwrap().start));
        let file = btf.name_of(p.line_info[0].file_name_off);
        assert!(file.ends_with("globals.bpf.c"), "{file}");
        assert!(p.line_info[0].line() > 0);
    }
}

#[test]
fn btf_maps() {
    let o = load("maps.bpf.c");
    let btf = o.btf.as_ref().unwrap();
    let m = |name: &str| o.map(name).unwrap().1.clone();

    let by_type = m("by_type");
    assert_eq!(by_type.kind, MapKind::Btf);
    assert_eq!((by_type.map_type, by_type.key_size, by_type.value_size, by_type.max_entries), (1, 8, 24, 1024));
    assert_eq!(by_type.map_flags, 1); // BPF_F_NO_PREALLOC
    assert_eq!(btf.type_name(by_type.key_type_id.unwrap()), "struct key_t");
    assert_eq!(btf.type_name(by_type.value_type_id.unwrap()), "struct val_t");

    let by_size = m("by_size");
    assert_eq!((by_size.map_type, by_size.key_size, by_size.value_size, by_size.max_entries), (6, 4, 24, 4));
    assert_eq!((by_size.key_type_id, by_size.value_type_id), (None, None));

    let events = m("events");
    assert_eq!((events.map_type, events.max_entries), (27, 8192)); // 5000 rounded to pages

    let pinned = m("pinned");
    assert_eq!((pinned.map_type, pinned.pinning, pinned.numa_node), (9, 1, 1));
    assert_eq!(btf.type_name(pinned.key_type_id.unwrap()), "__u64");

    let bloom = m("bloom");
    assert_eq!((bloom.map_type, bloom.key_size, bloom.value_size, bloom.map_extra), (30, 0, 4, 3));

    let outer = m("outer");
    assert_eq!((outer.map_type, outer.key_size, outer.value_size, outer.max_entries), (12, 4, 4, 4));
    let inner = outer.inner.as_ref().unwrap();
    assert_eq!(inner.name, "outer.inner");
    assert_eq!((inner.map_type, inner.key_size, inner.value_size, inner.max_entries), (2, 4, 8, 8));
    let (i1, i2) = (o.map("inner1").unwrap().0, o.map("inner2").unwrap().0);
    assert_eq!(outer.init_slots, [Some(InitSlot::Map(i1)), None, Some(InitSlot::Map(i2))]);

    let outer_hash = m("outer_hash");
    assert_eq!(outer_hash.map_type, 13);
    let ih = outer_hash.inner.as_ref().unwrap();
    assert_eq!((ih.map_type, ih.key_size, ih.value_size, ih.max_entries), (1, 4, 4, 16));
    assert!(outer_hash.init_slots.is_empty());

    let jumps = m("jumps");
    assert_eq!((jumps.map_type, jumps.value_size), (3, 4));
    let pa = o.programs.iter().position(|p| p.name == "tail_a").unwrap();
    let pb = o.programs.iter().position(|p| p.name == "tail_b").unwrap();
    assert_eq!(jumps.init_slots, [None, Some(InitSlot::Program(pa)), None, Some(InitSlot::Program(pb))]);

    // use_maps references each map by index.
    let u = o.program("use_maps").unwrap();
    let refs: Vec<i32> = loads(u).iter().filter(|l| l.1 == BPF_PSEUDO_MAP_IDX).map(|l| l.2).collect();
    let want: Vec<i32> = ["by_type", "outer", "by_size", "events", "pinned", "bloom", "outer_hash", "jumps"]
        .iter()
        .map(|n| map_idx(&o, n))
        .collect();
    assert_eq!(refs, want);
    assert_eq!(map_type_name(bloom.map_type), Some("bloom_filter"));
}

#[test]
fn legacy_maps() {
    let o = load("legacy.bpf.c");
    let btf = o.btf.as_ref().unwrap();
    let (hi, h) = o.map("legacy_hash").unwrap();
    assert_eq!(h.kind, MapKind::Legacy);
    assert_eq!((h.map_type, h.key_size, h.value_size, h.max_entries, h.map_flags), (1, 4, 16, 64, 0));
    assert_eq!(btf.type_name(h.key_type_id.unwrap()), "__u32");
    assert_eq!(btf.type_name(h.value_type_id.unwrap()), "struct pair");
    let (ai, a) = o.map("legacy_array").unwrap();
    assert_eq!((a.map_type, a.key_size, a.value_size, a.max_entries, a.map_flags), (2, 4, 8, 8, BPF_F_MMAPABLE));
    assert_eq!((a.key_type_id, a.value_type_id), (None, None));
    let p = o.program("legacy_user").unwrap();
    let refs: Vec<(u8, i32)> = loads(p).iter().map(|l| (l.1, l.2)).collect();
    assert_eq!(refs, [(BPF_PSEUDO_MAP_IDX, hi as i32), (BPF_PSEUDO_MAP_IDX, ai as i32)]);
}

#[test]
fn kconfig_externs() {
    let bytes = compile("kconfig.bpf.c");
    let mut opts = ParseOptions { kernel_version: Some(0x050f00), ..Default::default() };
    for (k, v) in [
        ("CONFIG_HZ", "250"),
        ("CONFIG_BPF_SYSCALL", "y"),
        ("CONFIG_MODULES", "m"),
        ("CONFIG_DEFAULT_HOSTNAME", "\"(none)\""),
    ] {
        opts.kconfig.insert(k.into(), KconfigValue::parse(v).unwrap());
    }
    let o = Object::parse_with_options(&bytes, "kconfig.bpf.o", &opts).unwrap();
    let btf = o.btf.as_ref().unwrap();
    let (ki, k) = o.map("kconfig.kconfig").unwrap();
    assert_eq!(k.kind, MapKind::Data { section: ".kconfig".into(), readonly: true });
    assert!(k.is_readonly());
    let text = btf::format::format_value(btf, k.value_type_id.unwrap(), k.initial.as_ref().unwrap()).unwrap();
    assert_eq!(
        text,
        "{ .CONFIG_HZ = 250, .CONFIG_MODULES = TRI_MODULE, .CONFIG_NOT_SET = 0, .LINUX_KERNEL_VERSION = 331520, \
         .CONFIG_BPF_SYSCALL = true, .CONFIG_DEFAULT_HOSTNAME = \"(none)\" }"
    );
    let p = o.program("read_config").unwrap();
    let l = loads(p);
    // LINUX_KERNEL_VERSION, CONFIG_HZ, CONFIG_BPF_SYSCALL, CONFIG_MODULES, CONFIG_DEFAULT_HOSTNAME,
    // CONFIG_NOT_SET read from the kconfig map at their offsets.
    let mut kc: Vec<i32> =
        l.iter().filter(|x| x.1 == BPF_PSEUDO_MAP_IDX_VALUE && x.2 == ki as i32).map(|x| x.3).collect();
    kc.sort();
    assert_eq!(kc, [0, 4, 8, 12, 16, 17]);
    // The weak __ksym resolved to 0: a plain `lddw r, 0`.
    let mut i = 0;
    let mut zero_loads = 0;
    while i < p.insns.len() {
        if p.insns[i].is_lddw() {
            if p.insns[i].src == 0 && p.insns[i].imm == 0 && p.insns[i + 1].imm == 0 {
                zero_loads += 1;
            }
            i += 2;
        } else {
            i += 1;
        }
    }
    assert_eq!(zero_loads, 1);
    // The weak kfunc call stays an unresolved kfunc call (imm 0), as libbpf leaves it.
    let kfunc_calls: Vec<&Insn> =
        p.insns.iter().filter(|i| i.op == OP_CALL && i.src == BPF_PSEUDO_KFUNC_CALL).collect();
    assert_eq!(kfunc_calls.len(), 1);
    assert_eq!((kfunc_calls[0].imm, kfunc_calls[0].off), (0, 0));

    // Defaults, as libbpf: LINUX_KERNEL_VERSION from the running kernel, CONFIG_* from the
    // kernel's config (/boot/config-RELEASE or /proc/config.gz), weak ones missing there 0.
    let (file, sys) = system_kconfig(None).expect("the kernel's config is readable here (/proc/config.gz)");
    let o = Object::parse(&bytes, "kconfig.bpf.o").unwrap();
    let (_, k) = o.map("kconfig.kconfig").unwrap();
    let text =
        btf::format::format_value(o.btf.as_ref().unwrap(), k.value_type_id.unwrap(), k.initial.as_ref().unwrap())
            .unwrap();
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut it = release.trim().split(|c: char| !c.is_ascii_digit()).map(|x| x.parse::<u32>().unwrap_or(0));
    let (a, b, c) = (it.next().unwrap(), it.next().unwrap(), it.next().unwrap_or(0));
    let version = (a << 16) | (b << 8) | c.min(255);
    let hz = match sys.get("CONFIG_HZ") {
        Some(KconfigValue::Number(n)) => n.to_string(),
        None => "0".into(),
        other => panic!("CONFIG_HZ in {}: {other:?}", file.display()),
    };
    let modules = match sys.get("CONFIG_MODULES") {
        Some(KconfigValue::Yes) => "TRI_YES",
        Some(KconfigValue::Module) => "TRI_MODULE",
        _ => "TRI_NO",
    };
    let bpf = if sys.get("CONFIG_BPF_SYSCALL") == Some(&KconfigValue::Yes) { "true" } else { "false" };
    let host = match sys.get("CONFIG_DEFAULT_HOSTNAME") {
        Some(KconfigValue::Str(h)) => h.chars().take(15).collect::<String>(),
        _ => String::new(),
    };
    assert!(!sys.contains_key("CONFIG_NOT_SET"));
    assert_eq!(
        text,
        format!(
            "{{ .CONFIG_HZ = {hz}, .CONFIG_MODULES = {modules}, .CONFIG_NOT_SET = 0, .LINUX_KERNEL_VERSION = {version}, \
             .CONFIG_BPF_SYSCALL = {bpf}, .CONFIG_DEFAULT_HOSTNAME = \"{host}\" }}"
        ),
        "from {}",
        file.display()
    );
}

#[test]
fn kconfig_from_a_config_file_plain_or_gzipped() {
    use std::io::Write;
    let bytes = compile("kconfig.bpf.c");
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("kconfig-files");
    std::fs::create_dir_all(&dir).unwrap();
    let config = "# comment\nCONFIG_HZ=300\nCONFIG_BPF_SYSCALL=y\n# CONFIG_MODULES is not set\nCONFIG_DEFAULT_HOSTNAME=\"host\"\n";
    let plain = dir.join("config");
    std::fs::write(&plain, config).unwrap();
    let gz = dir.join("config.gz");
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(config.as_bytes()).unwrap();
    std::fs::write(&gz, enc.finish().unwrap()).unwrap();
    for f in [&plain, &gz] {
        let opts = ParseOptions { kconfig_file: Some(f.clone()), kernel_version: Some(0x050f00), ..Default::default() };
        let o = Object::parse_with_options(&bytes, "kconfig.bpf.o", &opts).unwrap();
        let (_, k) = o.map("kconfig.kconfig").unwrap();
        let text =
            btf::format::format_value(o.btf.as_ref().unwrap(), k.value_type_id.unwrap(), k.initial.as_ref().unwrap())
                .unwrap();
        // `# ... is not set` leaves the weak CONFIG_MODULES unset (0), as libbpf reads it.
        assert_eq!(
            text,
            "{ .CONFIG_HZ = 300, .CONFIG_MODULES = TRI_NO, .CONFIG_NOT_SET = 0, .LINUX_KERNEL_VERSION = 331520, \
             .CONFIG_BPF_SYSCALL = true, .CONFIG_DEFAULT_HOSTNAME = \"host\" }",
            "{}",
            f.display()
        );
    }
    // Values given win over the file.
    let mut opts = ParseOptions { kconfig_file: Some(plain.clone()), ..Default::default() };
    opts.kconfig.insert("CONFIG_HZ".into(), KconfigValue::Number(1000));
    let o = Object::parse_with_options(&bytes, "kconfig.bpf.o", &opts).unwrap();
    let init = o.map("kconfig.kconfig").unwrap().1.initial.clone().unwrap();
    assert_eq!(&init[0..4], &1000u32.to_le_bytes());
    // No config to read: refused, naming the extern and the file, as libbpf fails.
    let missing = dir.join("no-such-config");
    let opts = ParseOptions { kconfig_file: Some(missing.clone()), ..Default::default() };
    let e = Object::parse_with_options(&bytes, "kconfig.bpf.o", &opts).unwrap_err().to_string();
    assert!(e.starts_with("kconfig.bpf.o: extern `CONFIG_"), "{e}");
    assert!(e.contains(&missing.display().to_string()) && e.contains("ParseOptions::kconfig"), "{e}");
}

#[test]
fn lone_text_function_is_a_program() {
    let o = load("text_only.bpf.c");
    assert_eq!(o.programs.len(), 1);
    let p = &o.programs[0];
    assert_eq!((p.name.as_str(), p.section.as_str(), &p.kind), ("lonely", ".text", &ProgramKind::Unknown));
    assert_eq!(p.insns.len(), 2);
    assert_eq!(o.license, "");
    assert!(o.maps.is_empty());
}

#[test]
fn object_names() {
    assert_eq!(object_name("/a/b/prog.bpf.o"), "prog");
    assert_eq!(object_name("a_very_long_object_name.o"), "a_very_long_obj");
    let o = Object::parse(&compile("globals.bpf.c"), "/tmp/x/a_very_long_object_name.bpf.o").unwrap();
    assert_eq!(o.name, "a_very_long_obj");
    assert_eq!(o.maps[1].name, "a_very_l.data");
    assert_eq!(o.maps[2].name, "a_very_l.rodata");
    assert_eq!(o.maps[4].name, "a_very_l.bss");
    assert_eq!(o.file, "/tmp/x/a_very_long_object_name.bpf.o");
}

#[test]
fn open_reads_files() {
    let bytes = compile("globals.bpf.c");
    let path = common::out_dir().join("open-test.bpf.o");
    std::fs::write(&path, bytes).unwrap();
    let o = Object::open(&path).unwrap();
    assert_eq!(o.name, "open-test");
    let e = Object::open(common::out_dir().join("missing.o")).unwrap_err();
    assert!(e.to_string().contains("missing.o: cannot read"), "{e}");
}
