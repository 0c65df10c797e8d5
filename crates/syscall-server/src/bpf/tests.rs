//! [`serve`] in-process, command by command (the LD_PRELOAD tests in `tests/` run real
//! loaders against the library): each command's success and a failure, with its errno and
//! the reason the loader's trace would print.

use std::mem::{offset_of, size_of};
use std::sync::Once;

use super::attr::{self, Plain};
use super::*;
use crate::error::Error;

/// A zeroed attribute block (padding included), aligned for every [`attr`] struct.
#[repr(C, align(8))]
struct Block([u8; ATTR_SIZE]);

impl Block {
    /// The block of command struct `T`, with `f` setting its fields.
    fn of<T: Plain>(f: impl FnOnce(&mut T)) -> Block {
        let mut b = Block([0; ATTR_SIZE]);
        // SAFETY: `T` is plain data no larger than the block (any bytes are a valid `T`) and
        // the block is 8-aligned, as every attr struct needs at most.
        f(unsafe { &mut *b.0.as_mut_ptr().cast::<T>() });
        b
    }

    /// The block as `T` (fields the call wrote back).
    fn get<T: Plain>(&self) -> T {
        // SAFETY: as in `of`.
        unsafe { self.0.as_ptr().cast::<T>().read() }
    }
}

/// This process's calls are served in a session of its own, under a temporary root.
fn setup() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // Roots of earlier runs (their pinned map keeps their session) whose process is gone.
        for e in std::fs::read_dir(std::env::temp_dir()).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(pid) = name.strip_prefix("userbpf-serve-unit-").and_then(|p| p.parse::<u32>().ok())
                && !std::path::Path::new(&format!("/proc/{pid}")).exists()
            {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
        let root = std::env::temp_dir().join(format!("userbpf-serve-unit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        let s = userbpf_runtime::Session::open_in(&root, "serve").unwrap();
        assert!(objects::set_session(s).is_ok(), "the session was opened before the tests set theirs");
    });
}

/// `bpf(cmd, block, sizeof(T))`.
fn call<T: Plain>(cmd: i32, b: &mut Block) -> Result<i64, Error> {
    setup();
    serve(cmd, b.0.as_mut_ptr(), size_of::<T>() as u32)
}

/// The call succeeds: its value.
#[track_caller]
fn ok<T: Plain>(cmd: i32, b: &mut Block) -> i64 {
    match call::<T>(cmd, b) {
        Ok(v) => v,
        Err(e) => panic!("{}: {e}", cmd_name(cmd)),
    }
}

/// The call fails with `errno`, its reason containing `why`.
#[track_caller]
fn fails<T: Plain>(cmd: i32, b: &mut Block, errno: i32, why: &str) {
    match call::<T>(cmd, b) {
        Ok(v) => panic!("{}: succeeded ({v}), expected errno {errno} ({why})", cmd_name(cmd)),
        Err(e) => {
            assert_eq!(e.errno, errno, "{}: {e}", cmd_name(cmd));
            assert!(e.reason.contains(why), "{}: reason {:?} does not say {why:?}", cmd_name(cmd), e.reason);
        }
    }
}

fn close(fd: i64) {
    // SAFETY: closing a descriptor the test got from the server.
    unsafe { libc::close(fd as i32) };
}

fn name16(s: &str) -> [u8; 16] {
    let mut n = [0u8; 16];
    n[..s.len()].copy_from_slice(s.as_bytes());
    n
}

fn hash_map(name: &str) -> i64 {
    let mut b = Block::of(|a: &mut attr::MapCreate| {
        a.map_type = userbpf_maps::MapType::BPF_MAP_TYPE_HASH as u32;
        (a.key_size, a.value_size, a.max_entries, a.map_name) = (4, 8, 16, name16(name));
    });
    ok::<attr::MapCreate>(BPF_MAP_CREATE, &mut b)
}

fn elem(cmd: i32, fd: i64, key: &u32, value: u64, flags: u64) -> Result<i64, Error> {
    let mut b = Block::of(|a: &mut attr::MapElem| {
        (a.map_fd, a.key, a.value, a.flags) = (fd as i32, key as *const u32 as u64, value, flags);
    });
    call::<attr::MapElem>(cmd, &mut b)
}

/// `r0 = ret; exit` (with `extra` instructions first).
fn program(extra: &[u64], ret: i32) -> Vec<u64> {
    let mut v = extra.to_vec();
    v.push(0xb7 | (ret as u32 as u64) << 32); // mov64 r0, ret
    v.push(0x95); // exit
    v
}

/// PROG_LOAD of `insns` as `prog_type`, with a log: the result and the log's text.
fn load(prog_type: u32, insns: &[u64], name: &str) -> (Result<i64, Error>, String, u32) {
    let license = b"GPL\0";
    let mut log = vec![0u8; 4096];
    let mut b = Block::of(|a: &mut attr::ProgLoad| {
        (a.prog_type, a.insn_cnt, a.insns, a.license) =
            (prog_type, insns.len() as u32, insns.as_ptr() as u64, license.as_ptr() as u64);
        (a.log_level, a.log_size, a.log_buf, a.prog_name) =
            (1, log.len() as u32, log.as_mut_ptr() as u64, name16(name));
    });
    let r = call::<attr::ProgLoad>(BPF_PROG_LOAD, &mut b);
    let text = String::from_utf8_lossy(&log[..log.iter().position(|&c| c == 0).unwrap_or(0)]).into_owned();
    (r, text, b.get::<attr::ProgLoad>().log_true_size)
}

fn raw_tp_prog(ret: i32) -> i64 {
    let (r, log, _) = load(prog::BPF_PROG_TYPE_RAW_TRACEPOINT, &program(&[], ret), "rtp");
    r.unwrap_or_else(|e| panic!("{e}\n{log}"))
}

/// OBJ_GET_INFO_BY_FD with a `len`-byte info buffer.
fn info(fd: i64, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    let mut b = Block::of(|a: &mut attr::InfoByFd| {
        (a.bpf_fd, a.info_len, a.info) = (fd as i32, len as u32, buf.as_mut_ptr() as u64)
    });
    ok::<attr::InfoByFd>(BPF_OBJ_GET_INFO_BY_FD, &mut b);
    assert_eq!(b.get::<attr::InfoByFd>().info_len as usize, len, "info_len written back");
    buf
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_ne_bytes(b[off..off + 4].try_into().unwrap())
}

#[test]
fn element_commands() {
    let fd = hash_map("elems");
    let (k1, k2) = (1u32, 2u32);
    let mut v = 10u64;
    assert_eq!(elem(BPF_MAP_UPDATE_ELEM, fd, &k1, &v as *const u64 as u64, 0), Ok(0));
    let mut out = 0u64;
    assert_eq!(elem(BPF_MAP_LOOKUP_ELEM, fd, &k1, &mut out as *mut u64 as u64, 0), Ok(0));
    assert_eq!(out, 10);
    // BPF_NOEXIST on a present key: EEXIST.
    v = 11;
    assert_eq!(elem(BPF_MAP_UPDATE_ELEM, fd, &k1, &v as *const u64 as u64, 1).map_err(|e| e.errno), Err(libc::EEXIST));
    // Unknown flags, bad pointers: the reason says which.
    let e = elem(BPF_MAP_LOOKUP_ELEM, fd, &k1, &mut out as *mut u64 as u64, 0x100).unwrap_err();
    assert_eq!((e.errno, e.reason.as_ref()), (libc::EINVAL, "flags 0x100 unknown"));
    let e = elem(BPF_MAP_LOOKUP_ELEM, fd, &k1, 8, 0).unwrap_err();
    assert!(e.errno == libc::EFAULT && e.reason.contains("value at 0x8"), "{e}");
    let e = elem(BPF_MAP_LOOKUP_ELEM, 9999, &k1, 8, 0).unwrap_err();
    assert!(e.errno == libc::EBADF && e.reason.contains("map_fd 9999"), "{e}");

    // GET_NEXT_KEY: the first key, then the end.
    let mut next = 0u32;
    let mut b =
        Block::of(|a: &mut attr::MapNextKey| (a.map_fd, a.next_key) = (fd as i32, &mut next as *mut u32 as u64));
    assert_eq!(ok::<attr::MapNextKey>(BPF_MAP_GET_NEXT_KEY, &mut b), 0);
    assert_eq!(next, 1);
    let mut b = Block::of(|a: &mut attr::MapNextKey| {
        (a.map_fd, a.key, a.next_key) = (fd as i32, &k1 as *const u32 as u64, &mut next as *mut u32 as u64)
    });
    fails::<attr::MapNextKey>(BPF_MAP_GET_NEXT_KEY, &mut b, libc::ENOENT, "");

    // LOOKUP_AND_DELETE, then DELETE of what is gone.
    out = 0;
    assert_eq!(elem(BPF_MAP_LOOKUP_AND_DELETE_ELEM, fd, &k1, &mut out as *mut u64 as u64, 0), Ok(0));
    assert_eq!(out, 10);
    assert_eq!(
        elem(BPF_MAP_LOOKUP_ELEM, fd, &k1, &mut out as *mut u64 as u64, 0).map_err(|e| e.errno),
        Err(libc::ENOENT)
    );
    assert_eq!(elem(BPF_MAP_DELETE_ELEM, fd, &k2, 0, 0).map_err(|e| e.errno), Err(libc::ENOENT));
    assert_eq!(elem(BPF_MAP_UPDATE_ELEM, fd, &k2, &v as *const u64 as u64, 0), Ok(0));
    assert_eq!(elem(BPF_MAP_DELETE_ELEM, fd, &k2, 0, 0), Ok(0));
    // DELETE_ELEM's last field is the key: a flags word is a field of other commands.
    let e = elem(BPF_MAP_DELETE_ELEM, fd, &k2, 0, 1).unwrap_err();
    assert!(e.errno == libc::EINVAL && e.reason.contains("past offset 16"), "{e}");

    // FREEZE: writes from user space are refused from then on, with the reason.
    let mut b = Block::of(|a: &mut attr::MapElem| a.map_fd = fd as i32);
    assert_eq!(call::<attr::MapElem>(BPF_MAP_FREEZE, &mut b), Ok(0));
    let e = elem(BPF_MAP_UPDATE_ELEM, fd, &k1, &v as *const u64 as u64, 0).unwrap_err();
    assert_eq!((e.errno, e.reason.as_ref()), (libc::EPERM, "the map is frozen"));
    fails::<attr::MapElem>(BPF_MAP_FREEZE, &mut b, libc::EPERM, "frozen already");
    close(fd);
}

#[test]
fn map_create_refusals_say_why() {
    let mut b =
        Block::of(|a: &mut attr::MapCreate| (a.map_type, a.key_size, a.value_size, a.max_entries) = (9999, 4, 4, 1));
    fails::<attr::MapCreate>(BPF_MAP_CREATE, &mut b, libc::EINVAL, "map_type 9999 unknown");
    let mut b = Block::of(|a: &mut attr::MapCreate| {
        (a.map_type, a.key_size, a.value_size, a.max_entries, a.map_name) = (1, 4, 4, 1, name16("bad-name"));
    });
    fails::<attr::MapCreate>(BPF_MAP_CREATE, &mut b, libc::EINVAL, "name \"bad-name\"");
    let mut b = Block::of(|a: &mut attr::MapCreate| {
        (a.map_type, a.key_size, a.value_size, a.max_entries, a.map_ifindex) = (1, 4, 4, 1, 3)
    });
    fails::<attr::MapCreate>(BPF_MAP_CREATE, &mut b, libc::EINVAL, "map_ifindex 3");
    // A byte past the command's last field (map_extra ends at 72).
    let mut b =
        Block::of(|a: &mut attr::MapCreate| (a.map_type, a.key_size, a.value_size, a.max_entries) = (1, 4, 4, 1));
    b.0[100] = 1; // past map_extra, within the 104 bytes passed
    assert_eq!(setup_and_serve(BPF_MAP_CREATE, &mut b, 104).map_err(|e| e.errno), Err(libc::EINVAL));
    // Unknown commands.
    let mut b = Block([0; ATTR_SIZE]);
    fails::<attr::MapElem>(99, &mut b, libc::EINVAL, "unknown command 99");
}

fn setup_and_serve(cmd: i32, b: &mut Block, size: u32) -> Result<i64, Error> {
    setup();
    serve(cmd, b.0.as_mut_ptr(), size)
}

#[test]
fn batch_commands() {
    let fd = hash_map("batch");
    let keys = [1u32, 2, 3];
    let values = [10u64, 20, 30];
    let batch = |cmd: i32, keys: u64, values: u64, count: u32, in_batch: u64, out_batch: u64| {
        let mut b = Block::of(|a: &mut attr::MapBatch| {
            (a.map_fd, a.keys, a.values, a.count, a.in_batch, a.out_batch) =
                (fd as i32, keys, values, count, in_batch, out_batch);
        });
        (call::<attr::MapBatch>(cmd, &mut b), b.get::<attr::MapBatch>().count)
    };
    let (r, n) = batch(BPF_MAP_UPDATE_BATCH, keys.as_ptr() as u64, values.as_ptr() as u64, 3, 0, 0);
    assert_eq!((r, n), (Ok(0), 3));
    let (mut ks, mut vs, mut token) = ([0u32; 8], [0u64; 8], 0u32);
    let (r, n) = batch(
        BPF_MAP_LOOKUP_BATCH,
        ks.as_mut_ptr() as u64,
        vs.as_mut_ptr() as u64,
        8,
        0,
        &mut token as *mut u32 as u64,
    );
    // The whole map in one batch: ENOENT says the walk is over, count says what came.
    assert_eq!((r.map_err(|e| e.errno), n), (Err(libc::ENOENT), 3));
    let mut got: Vec<(u32, u64)> = ks[..3].iter().copied().zip(vs[..3].iter().copied()).collect();
    got.sort_unstable();
    assert_eq!(got, vec![(1, 10), (2, 20), (3, 30)]);
    let (r, n) = batch(
        BPF_MAP_LOOKUP_AND_DELETE_BATCH,
        ks.as_mut_ptr() as u64,
        vs.as_mut_ptr() as u64,
        1,
        0,
        &mut token as *mut u32 as u64,
    );
    assert_eq!((r, n), (Ok(0), 1));
    let (r, n) = batch(BPF_MAP_DELETE_BATCH, keys.as_ptr() as u64, 0, 3, 0, 0);
    // One of the three went with LOOKUP_AND_DELETE: the batch stops at it.
    assert_eq!(r.map_err(|e| e.errno), Err(libc::ENOENT));
    assert!(n < 3);
    // Arrays have no DELETE_BATCH (as in the kernel).
    let mut b = Block::of(|a: &mut attr::MapCreate| {
        (a.map_type, a.key_size, a.value_size, a.max_entries) =
            (userbpf_maps::MapType::BPF_MAP_TYPE_ARRAY as u32, 4, 8, 4)
    });
    let afd = ok::<attr::MapCreate>(BPF_MAP_CREATE, &mut b);
    let mut b = Block::of(|a: &mut attr::MapBatch| (a.map_fd, a.keys, a.count) = (afd as i32, keys.as_ptr() as u64, 1));
    fails::<attr::MapBatch>(BPF_MAP_DELETE_BATCH, &mut b, userbpf_maps::ENOTSUPP, "no Delete batch");
    close(afd);
    close(fd);
}

#[test]
fn prog_load_logs_and_test_run() {
    let (r, log, true_size) = load(prog::BPF_PROG_TYPE_RAW_TRACEPOINT, &program(&[], 42), "ok");
    let fd = r.unwrap_or_else(|e| panic!("{e}\n{log}"));
    assert!(log.contains("processed 2 insns"), "{log}");
    assert_eq!(true_size as usize, log.len() + 1);
    // TEST_RUN: the program's return value.
    let mut b = Block::of(|a: &mut attr::TestRun| a.prog_fd = fd as i32);
    assert_eq!(ok::<attr::TestRun>(BPF_PROG_TEST_RUN, &mut b), 0);
    assert_eq!(b.get::<attr::TestRun>().retval, 42);
    let mut b = Block::of(|a: &mut attr::TestRun| (a.prog_fd, a.repeat) = (fd as i32, 5));
    fails::<attr::TestRun>(
        BPF_PROG_TEST_RUN,
        &mut b,
        libc::EINVAL,
        "raw tracepoint program's test run takes ctx_in only",
    );

    // A refusal: the log and the error say the same, at the instruction.
    let call_unknown = 0x85 | (9999u64 << 32);
    let (r, log, _) = load(prog::BPF_PROG_TYPE_RAW_TRACEPOINT, &program(&[call_unknown], 0), "bad");
    let e = r.unwrap_err();
    assert_eq!((e.errno, e.reason.as_ref()), (libc::EINVAL, "insn 0: invalid func unknown#9999"));
    assert!(log.contains("0: (85) call unknown#9999\ninvalid func unknown#9999\nprocessed 1 insns"), "{log}");
    // Refused before the verifier: no log, as the kernel.
    let (r, log, _) = load(99, &program(&[], 0), "t");
    assert_eq!(r.unwrap_err().reason, "prog_type 99: not a program type that runs in user space");
    assert_eq!(log, "");
    let (r, _, _) = load(prog::BPF_PROG_TYPE_RAW_TRACEPOINT, &[], "t");
    assert_eq!(r.unwrap_err().errno, libc::E2BIG);

    // BIND_MAP: the map is listed in the program's info.
    let map = hash_map("bound");
    let mut b = Block::of(|a: &mut attr::ProgBindMap| (a.prog_fd, a.map_fd) = (fd as i32, map as i32));
    assert_eq!(ok::<attr::ProgBindMap>(BPF_PROG_BIND_MAP, &mut b), 0);
    let mut b = Block::of(|a: &mut attr::ProgBindMap| (a.prog_fd, a.map_fd, a.flags) = (fd as i32, map as i32, 1));
    fails::<attr::ProgBindMap>(BPF_PROG_BIND_MAP, &mut b, libc::EINVAL, "flags 0x1 unknown");
    let i = info(fd, 232);
    assert_eq!((u32_at(&i, 0), u32_at(&i, 52)), (prog::BPF_PROG_TYPE_RAW_TRACEPOINT, 1), "type and map count");
    assert_eq!(&i[64..67], b"ok\0");
    close(map);
    close(fd);
}

/// A minimal BTF object: `int`.
fn btf_int() -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&0xEB9F_u16.to_le_bytes());
    b.extend_from_slice(&[1, 0]);
    for v in [24u32, 0, 16, 16, 5] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    // struct btf_type: name_off 1, info INT (kind 1), size 4; then the encoding: 32 bits, signed.
    for v in [1u32, 1 << 24, 4, (1 << 24) | 32] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    b.extend_from_slice(b"\0int\0");
    b
}

fn btf_load(data: &[u8], log: &mut [u8]) -> Result<i64, Error> {
    let mut b = Block::of(|a: &mut attr::BtfLoad| {
        (a.btf, a.btf_size, a.btf_log_buf, a.btf_log_size, a.btf_log_level) =
            (data.as_ptr() as u64, data.len() as u32, log.as_mut_ptr() as u64, log.len() as u32, 1);
    });
    call::<attr::BtfLoad>(BPF_BTF_LOAD, &mut b)
}

#[test]
fn btf_load_and_ids() {
    let mut log = vec![0u8; 4096];
    let data = btf_int();
    let fd = btf_load(&data, &mut log).unwrap_or_else(|e| panic!("{e}"));
    assert!(String::from_utf8_lossy(&log).contains("[1] INT int size=4"), "{}", String::from_utf8_lossy(&log));
    let id = u32_at(&info(fd, 32), 12);
    assert!(id > 0);
    // GET_NEXT_ID from below finds it; GET_FD_BY_ID gives a descriptor of it.
    let mut b = Block::of(|a: &mut attr::GetId| a.start_id = id - 1);
    ok::<attr::GetId>(BPF_BTF_GET_NEXT_ID, &mut b);
    assert!(b.get::<attr::GetId>().next_id >= id);
    let mut b = Block::of(|a: &mut attr::GetId| a.start_id = id);
    let fd2 = ok::<attr::GetId>(BPF_BTF_GET_FD_BY_ID, &mut b);
    assert_eq!(u32_at(&info(fd2, 32), 12), id);
    let mut b = Block::of(|a: &mut attr::GetId| (a.start_id, a.open_flags) = (id, 1 << 3));
    fails::<attr::GetId>(BPF_BTF_GET_FD_BY_ID, &mut b, libc::EINVAL, "open_flags 0x8 invalid for a btf");

    // Malformed BTF: the reason is in the log and in the error.
    let mut bad = data.clone();
    bad[0] = 0;
    log.fill(0);
    let e = btf_load(&bad, &mut log).unwrap_err();
    assert!(e.errno == libc::EINVAL && e.reason.starts_with("malformed BTF: "), "{e}");
    let text = String::from_utf8_lossy(&log[..log.iter().position(|&c| c == 0).unwrap()]).into_owned();
    assert!(text.contains(&e.reason["malformed BTF: ".len()..]), "log {text:?}, error {e}");
    close(fd2);
    close(fd);
}

#[test]
fn prog_and_map_ids() {
    let map = hash_map("ids");
    let map_id = u32_at(&info(map, 88), 4);
    let prog = raw_tp_prog(0);
    let prog_id = u32_at(&info(prog, 232), 4);
    for (next_cmd, fd_cmd, id) in
        [(BPF_MAP_GET_NEXT_ID, BPF_MAP_GET_FD_BY_ID, map_id), (BPF_PROG_GET_NEXT_ID, BPF_PROG_GET_FD_BY_ID, prog_id)]
    {
        let mut b = Block::of(|a: &mut attr::GetId| a.start_id = id - 1);
        ok::<attr::GetId>(next_cmd, &mut b);
        assert_eq!(b.get::<attr::GetId>().next_id, id, "{}", cmd_name(next_cmd));
        let mut b = Block::of(|a: &mut attr::GetId| a.start_id = id);
        let fd = ok::<attr::GetId>(fd_cmd, &mut b);
        assert_eq!(u32_at(&info(fd, 88), 4), id, "{}", cmd_name(fd_cmd));
        close(fd);
        let mut b = Block::of(|a: &mut attr::GetId| a.start_id = u32::MAX - 1);
        fails::<attr::GetId>(next_cmd, &mut b, libc::ENOENT, "");
    }
    // The map's info: type, id, sizes, name.
    let i = info(map, 88);
    assert_eq!((u32_at(&i, 8), u32_at(&i, 12), u32_at(&i, 16)), (4, 8, 16));
    assert_eq!(&i[24..28], b"ids\0");
    let mut b = Block::of(|a: &mut attr::InfoByFd| a.bpf_fd = 0);
    fails::<attr::InfoByFd>(BPF_OBJ_GET_INFO_BY_FD, &mut b, libc::EINVAL, "bpf_fd 0 is not a bpf object");
    close(prog);
    close(map);
}

#[test]
fn pins() {
    let map = hash_map("pinned");
    let map_id = u32_at(&info(map, 88), 4);
    let path = format!("/sys/fs/bpf/userbpf-unit-{}\0", std::process::id());
    let mut b = Block::of(|a: &mut attr::Obj| (a.pathname, a.bpf_fd) = (path.as_ptr() as u64, map as i32));
    assert_eq!(ok::<attr::Obj>(BPF_OBJ_PIN, &mut b), 0);
    fails::<attr::Obj>(BPF_OBJ_PIN, &mut b, libc::EEXIST, "userbpf-unit-");
    let mut b = Block::of(|a: &mut attr::Obj| a.pathname = path.as_ptr() as u64);
    let fd = ok::<attr::Obj>(BPF_OBJ_GET, &mut b);
    assert_eq!(u32_at(&info(fd, 88), 4), map_id, "the pinned map");
    let outside = b"/tmp/x\0";
    let mut b = Block::of(|a: &mut attr::Obj| (a.pathname, a.bpf_fd) = (outside.as_ptr() as u64, map as i32));
    fails::<attr::Obj>(BPF_OBJ_PIN, &mut b, libc::EPERM, "/tmp/x: not under the BPF filesystem");
    let missing = b"/sys/fs/bpf/userbpf-unit-none\0";
    let mut b = Block::of(|a: &mut attr::Obj| a.pathname = missing.as_ptr() as u64);
    fails::<attr::Obj>(BPF_OBJ_GET, &mut b, libc::ENOENT, "/sys/fs/bpf/userbpf-unit-none");
    close(fd);
    close(map);
}

#[test]
fn raw_tracepoint_links() {
    let prog = raw_tp_prog(0);
    let prog_id = u32_at(&info(prog, 232), 4);
    let name = b"sys_enter\0";
    let mut b = Block::of(|a: &mut attr::RawTracepointOpen| (a.name, a.prog_fd) = (name.as_ptr() as u64, prog as i32));
    let link = ok::<attr::RawTracepointOpen>(BPF_RAW_TRACEPOINT_OPEN, &mut b);
    // Other names are the kernel's (kernel passthrough): one it does not have.
    let other = b"no_such_tracepoint\0";
    let mut b = Block::of(|a: &mut attr::RawTracepointOpen| (a.name, a.prog_fd) = (other.as_ptr() as u64, prog as i32));
    fails::<attr::RawTracepointOpen>(
        BPF_RAW_TRACEPOINT_OPEN,
        &mut b,
        libc::ENOENT,
        "raw tracepoint \"no_such_tracepoint\" in the kernel",
    );

    // TASK_FD_QUERY: program, type and name of the link.
    let mut buf = [0u8; 32];
    let mut b = Block::of(|a: &mut attr::TaskFdQuery| {
        (a.pid, a.fd, a.buf, a.buf_len) = (std::process::id(), link as i32, buf.as_mut_ptr() as u64, 32)
    });
    assert_eq!(ok::<attr::TaskFdQuery>(BPF_TASK_FD_QUERY, &mut b), 0);
    let q = b.get::<attr::TaskFdQuery>();
    assert_eq!((q.prog_id, q.fd_type, q.buf_len), (prog_id, 0, 9));
    assert_eq!(&buf[..10], b"sys_enter\0");

    // The link's info and ids.
    let i = info(link, 48);
    let link_id = u32_at(&i, 4);
    assert_eq!((u32_at(&i, 0), u32_at(&i, 8)), (obj::BPF_LINK_TYPE_RAW_TRACEPOINT, prog_id));
    let mut b = Block::of(|a: &mut attr::GetId| a.start_id = link_id - 1);
    ok::<attr::GetId>(BPF_LINK_GET_NEXT_ID, &mut b);
    assert_eq!(b.get::<attr::GetId>().next_id, link_id);
    let mut b = Block::of(|a: &mut attr::GetId| a.start_id = link_id);
    let fd = ok::<attr::GetId>(BPF_LINK_GET_FD_BY_ID, &mut b);
    close(fd);

    // What a raw tracepoint link cannot do, as in the kernel.
    let mut b = Block::of(|a: &mut attr::LinkDetach| a.link_fd = link as i32);
    fails::<attr::LinkDetach>(BPF_LINK_DETACH, &mut b, libc::EOPNOTSUPP, "no detach");
    let mut b = Block::of(|a: &mut attr::LinkUpdate| (a.link_fd, a.new_prog_fd) = (link as i32, prog as i32));
    fails::<attr::LinkUpdate>(BPF_LINK_UPDATE, &mut b, libc::EINVAL, "no link here can change its program");
    let mut b = Block::of(|a: &mut attr::IterCreate| a.link_fd = link as i32);
    fails::<attr::IterCreate>(BPF_ITER_CREATE, &mut b, libc::EINVAL, "no iterator links");
    let mut b = Block::of(|a: &mut attr::IterCreate| a.link_fd = prog as i32);
    fails::<attr::IterCreate>(BPF_ITER_CREATE, &mut b, libc::EINVAL, "link_fd");
    close(link);
    close(prog);
}

#[test]
fn perf_event_links() {
    // A CPU clock event sampling once a second, and a perf_event program on it.
    let mut pattr = [0u64; 16];
    pattr[0] = 1 | (128 << 32); // PERF_TYPE_SOFTWARE, size 128
    pattr[1] = 0; // PERF_COUNT_SW_CPU_CLOCK
    pattr[2] = 1_000_000_000; // sample_period
    // SAFETY: a perf_event_attr of the size it declares.
    let event =
        unsafe { crate::perf_event::perf_event_open(pattr.as_ptr().cast(), -1, 0, -1, 0) }.expect("clock event");
    let (r, log, _) = load(prog::BPF_PROG_TYPE_PERF_EVENT, &program(&[], 0), "clock");
    let prog = r.unwrap_or_else(|e| panic!("{e}\n{log}"));
    let mut b = Block::of(|a: &mut attr::LinkCreate| {
        (a.prog_fd, a.target_fd, a.attach_type) = (prog as i32, event as i32, link::BPF_PERF_EVENT)
    });
    let lfd = ok::<attr::LinkCreate>(BPF_LINK_CREATE, &mut b);
    let i = info(lfd, 48);
    assert_eq!(u32_at(&i, 0), obj::BPF_LINK_TYPE_PERF_EVENT);
    // TASK_FD_QUERY of a software event's program: EOPNOTSUPP, as the kernel.
    let mut b = Block::of(|a: &mut attr::TaskFdQuery| (a.pid, a.fd) = (std::process::id(), event as i32));
    fails::<attr::TaskFdQuery>(BPF_TASK_FD_QUERY, &mut b, libc::EOPNOTSUPP, "software event");
    // Refusals.
    let rtp = raw_tp_prog(0);
    let mut b = Block::of(|a: &mut attr::LinkCreate| {
        (a.prog_fd, a.target_fd, a.attach_type) = (rtp as i32, event as i32, link::BPF_PERF_EVENT)
    });
    fails::<attr::LinkCreate>(BPF_LINK_CREATE, &mut b, libc::EINVAL, "cannot attach to a perf event");
    let mut b = Block::of(|a: &mut attr::LinkCreate| {
        (a.prog_fd, a.target_fd, a.attach_type) = (prog as i32, prog as i32, link::BPF_PERF_EVENT)
    });
    fails::<attr::LinkCreate>(BPF_LINK_CREATE, &mut b, libc::EBADF, "is not a perf event");
    let mut b =
        Block::of(|a: &mut attr::LinkCreate| (a.prog_fd, a.target_fd, a.attach_type) = (prog as i32, event as i32, 1));
    fails::<attr::LinkCreate>(BPF_LINK_CREATE, &mut b, libc::EINVAL, "attach_type 1");
    crate::attach::remove_bpf_link(u32_at(&i, 4)).unwrap();
    for fd in [rtp, lfd, prog, event] {
        close(fd);
    }
}

#[test]
fn attach_query_and_stats() {
    // Cgroup, socket and device attachments do not exist here.
    let mut b = Block::of(|a: &mut attr::ProgAttach| (a.target_fd, a.attach_bpf_fd) = (1, 2));
    fails::<attr::ProgAttach>(BPF_PROG_ATTACH, &mut b, libc::EINVAL, "BPF_PROG_ATTACH: cgroup");
    fails::<attr::ProgAttach>(BPF_PROG_DETACH, &mut b, libc::EINVAL, "BPF_PROG_DETACH: cgroup");
    let mut b = Block::of(|a: &mut attr::ProgQuery| a.target_fd = 1);
    fails::<attr::ProgQuery>(BPF_PROG_QUERY, &mut b, libc::EINVAL, "no cgroup, netns or device attachments");
    // ENABLE_STATS: a descriptor keeping stats on.
    let mut b = Block::of(|a: &mut attr::EnableStats| a.r#type = 0);
    let fd = ok::<attr::EnableStats>(BPF_ENABLE_STATS, &mut b);
    assert!(fd >= 0);
    close(fd);
    let mut b = Block::of(|a: &mut attr::EnableStats| a.r#type = 1);
    fails::<attr::EnableStats>(BPF_ENABLE_STATS, &mut b, libc::EINVAL, "type 1");
    // The written-back fields are where the uapi has them.
    assert_eq!(offset_of!(attr::TaskFdQuery, probe_offset), 32);
}

#[test]
fn perf_event_open_refusals_say_why() {
    setup();
    let open = |typ: u32, config: u64, config1: u64, config2: u64| {
        let mut pattr = [0u64; 16];
        pattr[0] = typ as u64 | (128 << 32);
        pattr[1] = config;
        pattr[7] = config1;
        pattr[8] = config2;
        // SAFETY: a perf_event_attr of the size it declares; config1, when set, a C string.
        unsafe { crate::perf_event::open_event(pattr.as_ptr().cast(), -1, 0, -1, 0) }
    };
    // PERF_TYPE_TRACEPOINT with an id no tracepoint has: not a system call's, so the kernel's
    // event (kernel passthrough), which the kernel refuses.
    let e = open(2, u64::MAX - 1, 0, 0).unwrap_err();
    assert!(e.errno == libc::EINVAL && e.reason.contains("the kernel's event"), "{e}");
    // A uprobe at an offset beyond its file (the uprobe PMU's type from sysfs).
    let typ: u32 = std::fs::read_to_string("/sys/bus/event_source/devices/uprobe/type")
        .expect("uprobe PMU")
        .trim()
        .parse()
        .unwrap();
    let file = std::env::temp_dir().join(format!("userbpf-serve-unit-{}-small", std::process::id()));
    std::fs::write(&file, b"12345678").unwrap();
    let path = std::ffi::CString::new(file.to_str().unwrap()).unwrap();
    let e = open(typ, 0, path.as_ptr() as u64, 64).unwrap_err();
    assert!(e.errno == libc::EINVAL && e.reason.contains("offset 0x40 is beyond the file (8 bytes)"), "{e}");
    let e = open(typ, 0, 0, 0).unwrap_err();
    assert_eq!((e.errno, e.reason.as_ref()), (libc::EINVAL, "a uprobe without a path (config1)"));
    std::fs::remove_file(&file).unwrap();
}

/// userbpf's writable-arguments flag (`include/userbpf/libbpf.h` sets it for SEC("uprobe.w")):
/// a kprobe program loaded with it is recorded with section `uprobe.w`, which the agent's
/// verifier takes as the opt-in; other program types are refused with it.
#[test]
fn writable_args_flag_marks_uprobe_programs() {
    use userbpf_runtime::helpers::overrides::BPF_F_USERBPF_WRITABLE_ARGS;
    let license = b"GPL\0";
    let insns = program(&[], 0);
    let load_flags = |prog_type: u32, flags: u32| {
        let mut b = Block::of(|a: &mut attr::ProgLoad| {
            (a.prog_type, a.insn_cnt, a.insns, a.license) =
                (prog_type, insns.len() as u32, insns.as_ptr() as u64, license.as_ptr() as u64);
            (a.prog_flags, a.prog_name) = (flags, name16("w"));
        });
        call::<attr::ProgLoad>(BPF_PROG_LOAD, &mut b)
    };
    let section = |fd: i64| {
        let id = objects::get_kind(fd as i32, objects::Kind::Prog).unwrap().id;
        objects::session().unwrap().progs().unwrap().into_iter().find(|p| p.id == id).unwrap().section
    };
    let fd = load_flags(prog::BPF_PROG_TYPE_KPROBE, BPF_F_USERBPF_WRITABLE_ARGS).unwrap();
    assert_eq!(section(fd), "uprobe.w");
    close(fd);
    let fd = load_flags(prog::BPF_PROG_TYPE_KPROBE, 0).unwrap();
    assert_eq!(section(fd), "");
    close(fd);
    let e = load_flags(prog::BPF_PROG_TYPE_RAW_TRACEPOINT, BPF_F_USERBPF_WRITABLE_ARGS).unwrap_err();
    assert_eq!(
        (e.errno, e.reason.as_ref()),
        (libc::EINVAL, "prog_flags 0x40000000 (userbpf's writable arguments) is for uprobe programs only")
    );
    let e = load_flags(prog::BPF_PROG_TYPE_KPROBE, 1 << 29).unwrap_err();
    assert_eq!((e.errno, e.reason.as_ref()), (libc::EINVAL, "prog_flags 0x20000000 unknown"));
}

/// A uprobe at a file offset no function symbol covers (a stripped executable, a USDT site in
/// a static function) names the address its segment maps it at, which the agent probes; in an
/// executable built without PIE that address is not the offset. An offset in no loadable
/// segment is refused, naming it.
#[test]
fn uprobe_offsets_without_a_symbol_become_addresses() {
    setup();
    let dir = std::env::temp_dir().join(format!("userbpf-serve-unit-{}-nopie", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (src, bin) = (dir.join("t.c"), dir.join("t"));
    std::fs::write(&src, "int main(void) { return 0; }\n").unwrap();
    let st = std::process::Command::new("cc").args(["-O2", "-no-pie", "-s", "-o"]).arg(&bin).arg(&src).status();
    assert!(st.is_ok_and(|s| s.success()), "cc -no-pie -s failed");
    let data = std::fs::read(&bin).unwrap();
    let entry = u64::from_le_bytes(data[24..32].try_into().unwrap());
    let base = userbpf_elf::symbols::offset_to_vaddr(&bin, 0).unwrap();
    let off = entry - base;
    assert_eq!(userbpf_elf::symbols::offset_to_vaddr(&bin, off), Some(entry));
    assert!(base > 0 && off != entry, "a non-PIE executable: offset {off:#x}, address {entry:#x}");
    let typ: u32 = std::fs::read_to_string("/sys/bus/event_source/devices/uprobe/type")
        .expect("uprobe PMU")
        .trim()
        .parse()
        .unwrap();
    let path = std::ffi::CString::new(bin.to_str().unwrap()).unwrap();
    let open = |config2: u64| {
        let mut pattr = [0u64; 16];
        pattr[0] = typ as u64 | (128 << 32);
        (pattr[7], pattr[8]) = (path.as_ptr() as u64, config2);
        // SAFETY: a perf_event_attr of the size it declares; config1 a C string.
        unsafe { crate::perf_event::open_event(pattr.as_ptr().cast(), -1, 0, -1, 0) }
    };
    let fd = open(off).unwrap();
    let id = objects::get_kind(fd as i32, objects::Kind::PerfEvent).unwrap().id;
    match crate::perf_event::event_spec(id) {
        Some(crate::perf_event::Spec::Uprobe { func: None, offset, file_offset, .. }) => {
            assert_eq!((offset, file_offset), (entry, off));
        }
        other => panic!("event {id}: {other:?}"),
    }
    close(fd);
    // The section headers at the end of the file: loaded by no segment.
    let tail = data.len() as u64 - 8;
    let e = open(tail).unwrap_err();
    assert!(e.errno == libc::EINVAL && e.reason.contains("is in none of its loadable segments"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}
