//! The assembler against the conformance suite in `shared/conformance` (beside the clone of
//! this repository): every test program must assemble to the bytes the suite's reference
//! assembler (`run.py dump`) produces (and pass the encoding checks and disassemble without
//! `<unknown>`), and every file of `negative/` must be refused.
//! The shared directory is required (see `userbpf_testutil::require`).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use userbpf_isa::asm::assemble;
use userbpf_isa::disasm::{UNKNOWN, disassemble};
use userbpf_isa::validate::check_program;
use userbpf_isa::{Insn, decode, encode, parse_hex};

fn conformance_dir() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/conformance");
    if dir.join("run.py").is_file() {
        Some(dir)
    } else {
        userbpf_testutil::require(
            false,
            &format!("the bpf_conformance suite at {} (shared/ beside the repository)", dir.display()),
        );
        None
    }
}

/// The sections of a `.data` file that matter here.
#[derive(Default)]
struct TestFile {
    asm: Vec<String>,
    raw: Vec<String>,
}

/// Splits a test file as run.py's `parse_test_file` (and bpf_conformance's parser) does:
/// `#` starts a comment, a line containing `--` switches section by the first of the names it
/// contains, empty lines are skipped. An unknown directive is an error.
fn parse_test_file(text: &str) -> Result<TestFile, String> {
    let mut section = None;
    let mut file = TestFile::default();
    for line in text.split('\n') {
        let line = line.strip_suffix('\r').unwrap_or(line);
        let line = line.split('#').next().unwrap_or_default();
        if line.contains("--") {
            section = if line.contains("asm") {
                Some("asm")
            } else if line.contains("result") {
                Some("result")
            } else if line.contains("mem") {
                Some("mem")
            } else if line.contains("raw") {
                Some("raw")
            } else if line.contains("no register offset") || line.contains(" c") {
                None
            } else if line.contains("error") {
                Some("error")
            } else {
                return Err(format!("unknown directive {line:?}"));
            };
            continue;
        }
        if line.is_empty() {
            continue;
        }
        match section {
            Some("asm") => file.asm.push(line.to_string()),
            Some("raw") => file.raw.push(line.to_string()),
            _ => {}
        }
    }
    Ok(file)
}

/// A `-- raw` section: lines of byte pairs (`07 00 01 00 ...`) or 64-bit words
/// (`0x0000000000000095`, as bpf_conformance writes them).
fn raw_program(lines: &[String]) -> Result<Vec<Insn>, String> {
    let mut bytes = Vec::new();
    for line in lines {
        let tokens: Vec<&str> = line.split_whitespace().collect();
        if tokens.iter().all(|t| t.len() == 2) {
            bytes.extend(parse_hex(line)?);
            continue;
        }
        for t in tokens {
            let word = match t.strip_prefix("0x") {
                Some(h) => u64::from_str_radix(h, 16),
                None => t.parse(),
            }
            .map_err(|e| format!("bad raw word {t:?}: {e}"))?;
            bytes.extend(word.to_le_bytes());
        }
    }
    decode(&bytes).map_err(|e| e.to_string())
}

/// The program of a test file as our tools see it: the raw section, checked, if there is one,
/// else the assembled `-- asm` section.
fn load(text: &str) -> Result<Vec<Insn>, String> {
    let file = parse_test_file(text)?;
    if file.raw.is_empty() {
        return assemble(&file.asm.join("\n")).map_err(|e| e.to_string());
    }
    let insns = raw_program(&file.raw)?;
    check_program(&insns).map_err(|e| e.to_string())?;
    Ok(insns)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The value of `"key": "value"` on one line of run.py's indented JSON (its names, hex and
/// messages are plain strings).
fn json_field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let rest = line.trim().strip_prefix(&format!("\"{key}\": \""))?;
    let rest = rest.strip_suffix(',').unwrap_or(rest);
    rest.strip_suffix('"')
}

#[test]
fn assembler_matches_run_py() {
    let Some(dir) = conformance_dir() else { return };
    let out =
        Command::new("python3").args(["run.py", "dump", "tests"]).current_dir(&dir).output().expect("python3 runs");
    assert!(out.status.success(), "run.py dump failed: {}", String::from_utf8_lossy(&out.stderr));
    // (file name, program hex or run.py's reason to skip it)
    let mut tests: Vec<(String, Result<String, String>)> = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        if let Some(name) = json_field(line, "name") {
            tests.push((name.to_string(), Err("no program_hex".to_string())));
        } else if let Some(last) = tests.last_mut() {
            if let Some(program) = json_field(line, "program_hex") {
                last.1 = Ok(program.to_string());
            } else if let Some(skip) = json_field(line, "skip") {
                last.1 = Err(skip.to_string());
            }
        }
    }
    assert!(tests.len() >= 300, "run.py dump listed only {} tests", tests.len());
    let mut failures = Vec::new();
    for (name, expected) in &tests {
        let text = fs::read_to_string(dir.join("tests").join(name)).expect("test file reads");
        let asm = parse_test_file(&text).expect("test file parses").asm.join("\n");
        match (expected, assemble(&asm)) {
            (Ok(expected), Ok(insns)) if hex(&encode(&insns)) == *expected => {
                // Every valid program passes the encoding checks and disassembles fully.
                if let Err(e) = check_program(&insns) {
                    failures.push(format!("{name}: {e}"));
                }
                if disassemble(&insns).contains(UNKNOWN) {
                    failures.push(format!("{name}: disassembly has {UNKNOWN}:\n{}", disassemble(&insns)));
                }
            }
            (Ok(expected), Ok(insns)) => failures.push(format!(
                "{name}: run.py {expected}\n{:>w$}  ours   {}",
                "",
                hex(&encode(&insns)),
                w = name.len()
            )),
            (Ok(_), Err(e)) => failures.push(format!("{name}: run.py assembles it, ours fails: {e}")),
            (Err(skip), Ok(_)) if skip.contains("assembler error") => {
                failures.push(format!("{name}: run.py refuses it ({skip}), ours assembles it"))
            }
            (Err(_), _) => {}
        }
    }
    assert!(failures.is_empty(), "{} of {} programs differ:\n{}", failures.len(), tests.len(), failures.join("\n"));
}

/// Files of `negative/` whose programs are valid: what is wrong is their expected outcome
/// (an error "Invalid" from `or %r0, %r10`; a wrong r0 for a load), which only running them
/// can show. They must assemble; the runner of the VM fails them.
const RUNTIME_NEGATIVES: [&str; 2] = ["error.data", "incorrect_return_value_high_bits.data"];

#[test]
fn negative_files_are_rejected() {
    let Some(dir) = conformance_dir() else { return };
    let mut files: Vec<PathBuf> = fs::read_dir(dir.join("negative"))
        .expect("negative/ lists")
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "data"))
        .collect();
    files.sort();
    assert!(files.len() >= 50, "only {} negative files", files.len());
    let mut failures = Vec::new();
    for path in &files {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let verdict = load(&fs::read_to_string(path).expect("negative file reads"));
        let shown = match &verdict {
            Err(e) => e.clone(),
            Ok(_) if RUNTIME_NEGATIVES.contains(&name) => "valid program, its expected outcome is wrong".to_string(),
            Ok(_) => "accepted".to_string(),
        };
        println!("{name}: {shown}");
        match verdict {
            Ok(_) if RUNTIME_NEGATIVES.contains(&name) => {}
            Ok(_) => failures.push(format!("{name}: accepted")),
            Err(e) if RUNTIME_NEGATIVES.contains(&name) => {
                failures.push(format!("{name}: a valid program, refused: {e}"))
            }
            Err(e) => {
                // unused-OP-FIELD.data must be refused for that field (an offset on mov or div
                // is refused as no sign extension or signed division).
                let field = name.strip_suffix(".data").and_then(|n| n.rsplit('-').next()).unwrap_or_default();
                let words = match field {
                    "offset" => "offset",
                    "imm" => "the immediate is not used",
                    "src" => "the source register is not used",
                    "dst" => "the destination register is not used",
                    _ => "",
                };
                if name.starts_with("unused-") && (words.is_empty() || !e.contains(words)) {
                    failures.push(format!("{name}: refused for another reason: {e}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
