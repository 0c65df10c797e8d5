//! userbpf's io_uring helpers called by name from clang-compiled programs (through
//! `<userbpf/helpers.h>`), with the JIT and the interpreter: bad descriptors and buffers give
//! negative errnos, never a crash; data reaches the file; a program the kernel would run may
//! not call them.

mod common;

use std::os::fd::AsRawFd;
use std::sync::Arc;

use userbpf_runtime::context::CpuSlots;
use userbpf_runtime::loader::LoadOptions;
use userbpf_runtime::{Engine, load_object};

const EBADF: u64 = -(libc::EBADF as i64) as u64;
const EFAULT: u64 = -(libc::EFAULT as i64) as u64;
const EINVAL: u64 = -(libc::EINVAL as i64) as u64;

fn user_programs() -> Vec<String> {
    ["write_and_sync", "fsync_fd", "wait_idle"].map(String::from).to_vec()
}

#[test]
fn helpers_by_name_in_both_engines() {
    let path = common::compile("io_uring");
    for engine in [Engine::Jit, Engine::Interpreter] {
        let s = common::session(&format!("io-uring-{engine:?}"));
        let only = user_programs();
        let obj = common::load(&s, &path, engine, Some(&only));
        let data = b"written through io_uring\n";
        // Bad descriptors: the operations complete with -EBADF.
        for fd in [-1i64 as u64, 1_000_000] {
            assert_eq!(common::run_args(&obj, "write_and_sync", &[fd, data.as_ptr() as u64, data.len() as u64]), EBADF);
            assert_eq!(common::run_args(&obj, "fsync_fd", &[fd]), EBADF, "{engine:?} fd {fd}");
        }
        // A bad buffer: -EFAULT at submission.
        assert_eq!(common::run_args(&obj, "write_and_sync", &[1, 16, 8]), EFAULT, "{engine:?}");
        assert_eq!(common::run(&obj, "wait_idle"), EINVAL, "{engine:?}");
        // A real file.
        let file = std::env::temp_dir().join(format!("userbpf-io-uring-prog-{}-{engine:?}", std::process::id()));
        let f = std::fs::File::create(&file).unwrap();
        let fd = f.as_raw_fd() as u64;
        assert_eq!(common::run_args(&obj, "write_and_sync", &[fd, data.as_ptr() as u64, data.len() as u64]), 0);
        assert_eq!(common::run_args(&obj, "fsync_fd", &[fd]), 0);
        assert_eq!(std::fs::read(&file).unwrap(), data);
        std::fs::remove_file(&file).unwrap();
    }
}

#[test]
fn refused_in_programs_the_kernel_runs() {
    let path = common::compile("io_uring");
    let s = common::session("io-uring-kernel");
    let obj = userbpf_object::Object::open(&path).unwrap();
    let slots = Arc::new(CpuSlots::open(&s.layout().cpus()).unwrap());
    let opts = LoadOptions { engine: Engine::Jit, helpers: userbpf_runtime::helpers::registry(), only: None };
    let e =
        load_object(&s, obj, &opts, slots).err().expect("a kprobe calling bpf_io_uring_fdatasync loaded").to_string();
    assert!(
        e.contains(
            "program `kernel_side` (section kprobe/do_sys_open): instruction 1: helper bpf_io_uring_fdatasync (id 1002) is a userbpf helper and runs only in user space"
        ),
        "{e}"
    );
}
