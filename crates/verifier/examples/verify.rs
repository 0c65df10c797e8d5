//! Verifies every uprobe, tracepoint and raw tracepoint program of an object file and
//! prints the verdicts: `cargo run --example verify -- OBJECT [PROGRAM] [-v|-vv]`.

use std::collections::BTreeMap;

use userbpf_object::{MapKind, Object, ProgramKind};
use userbpf_verifier::{MapInfo, Options, ProgType, verify};

fn map_info(m: &userbpf_object::MapDef) -> MapInfo {
    let frozen =
        matches!(m.kind, MapKind::Data { .. }).then(|| m.initial.clone()).flatten().filter(|_| m.is_readonly());
    MapInfo {
        name: m.name.clone(),
        map_type: m.map_type,
        key_size: m.key_size,
        value_size: m.value_size,
        max_entries: m.max_entries,
        readonly: m.is_readonly(),
        frozen,
        inner: m.inner.as_deref().map(|i| Box::new(map_info(i))),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let level = if args.iter().any(|a| a == "-vv") {
        2
    } else if args.iter().any(|a| a == "-v") {
        1
    } else {
        0
    };
    let pos: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    let Some(path) = pos.first() else {
        eprintln!("usage: verify OBJECT [PROGRAM] [-v|-vv]");
        std::process::exit(2);
    };
    let obj = match Object::open(path) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    let maps: BTreeMap<u32, MapInfo> = obj.maps.iter().enumerate().map(|(i, m)| (i as u32, map_info(m))).collect();
    let mut failed = false;
    for p in &obj.programs {
        if pos.get(1).is_some_and(|n| **n != p.name) {
            continue;
        }
        let prog_type = match p.kind {
            ProgramKind::Uprobe { .. } | ProgramKind::Usdt { .. } => ProgType::Kprobe,
            ProgramKind::Tracepoint { .. } => ProgType::Tracepoint { record_size: None },
            ProgramKind::RawTracepoint { .. } => ProgType::RawTracepoint { args: None },
            _ => continue,
        };
        let gpl_compatible = userbpf_verifier::helpers::license_is_gpl_compatible(&obj.license);
        let opts = Options {
            prog_type,
            maps: maps.clone(),
            privileged: true,
            gpl_compatible,
            writable_args: userbpf_object::section::writable_args(&p.section),
            log_level: level,
            // The format rules are the runtime's, which this example does not link.
            snprintf_format: None,
        };
        match verify(&p.insns, &opts) {
            Ok(s) => {
                print!("{}", s.log);
                println!(
                    "{}: accepted ({} insns processed, {} states, {} pruned)",
                    p.name, s.insns_processed, s.states, s.pruned
                );
            }
            Err(e) => {
                print!("{}", e.log);
                println!("{}: refused: {e}", p.name);
                failed = true;
            }
        }
    }
    std::process::exit(i32::from(failed));
}
