//! Compiles the C sources under tests/bpf with clang at test time, into the cargo target dir.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

/// Where compiled objects go (never the repository).
pub fn out_dir() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("userbpf-object-tests");
    std::fs::create_dir_all(&d).expect("create test output dir");
    d
}

fn src_path(src: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/bpf").join(src)
}

/// Compiles `tests/bpf/<src>` with `clang -target bpf -g -O2` (or the given arguments instead of
/// `-target bpf -g`) and returns the object's bytes.
pub fn compile_args(src: &str, args: &[&str]) -> Vec<u8> {
    let tag: String = args.concat().chars().filter(|c| c.is_ascii_alphanumeric()).collect();
    let out = out_dir().join(format!("{}-{tag}.o", src.replace('/', "_")));
    // Unique temporary name: tests run concurrently, in several processes.
    let tmp = out.with_extension(
        format!("{}.{:?}.tmp", std::process::id(), std::thread::current().id())
            .replace(|c: char| !c.is_ascii_alphanumeric() && c != '.', ""),
    );
    let mut cmd = Command::new("clang");
    cmd.args(args).args(["-O2", "-c", "-I/usr/include/x86_64-linux-gnu", "-o"]).arg(&tmp).arg(src_path(src));
    let output = match cmd.output() {
        Ok(o) => o,
        Err(e) => panic!("cannot run clang ({e}); run `make test`, which installs clang and the BPF headers"),
    };
    if !output.status.success() {
        panic!(
            "clang failed on {src}:\n{}\n(run `make test`, which installs clang and the libbpf headers)",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    std::fs::rename(&tmp, &out).expect("rename object");
    std::fs::read(&out).expect("read object")
}

/// `clang -target bpf -g -O2 -c tests/bpf/<src>`.
pub fn compile(src: &str) -> Vec<u8> {
    compile_args(src, &["-target", "bpf", "-g"])
}

/// The file name the tests give the loader for a source.
pub fn obj_name(src: &str) -> String {
    let base = src.rsplit('/').next().unwrap();
    base.replace(".bpf.c", ".bpf.o").replace(".c", ".o")
}
