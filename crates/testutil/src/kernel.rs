//! Raw `bpf(2)` calls for the tests that compare userbpf with the kernel (its verifier, its
//! interpreter and JIT, its maps and helpers): map creation, freezing and pops, programs and
//! `BPF_PROG_TEST_RUN`, with `union bpf_attr` filled by the uapi's offsets. A map's element
//! lookups, updates and iteration are `userbpf_kernel::sys`'s.

use std::io;

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_TEST_RUN: libc::c_long = 10;
const BPF_MAP_LOOKUP_AND_DELETE_ELEM: libc::c_long = 21;
const BPF_MAP_FREEZE: libc::c_long = 22;
const BPF_BTF_LOAD: libc::c_long = 18;

/// `BPF_PROG_TYPE_SOCKET_FILTER`: runs on a packet, may use every kind of map.
pub const PROG_SOCKET_FILTER: u32 = 1;
/// `BPF_PROG_TYPE_SYSCALL`: runs on a context buffer the kernel copies in and back out; must
/// be sleepable ([`F_SLEEPABLE`]), and may then use only array and hash maps.
pub const PROG_SYSCALL: u32 = 31;
/// `BPF_F_SLEEPABLE`.
pub const F_SLEEPABLE: u32 = 1 << 4;

/// Whether this process may load programs into the kernel (it runs as root); the difference
/// tests [`require`](crate::require) it.
pub fn may_load() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The start of a difference test's fuzz loop: `None` when this process may not load
/// programs (the test then returns; see [`require`](crate::require)), else the first seed and
/// the number of cases from the environment ([`seed_from_env`](crate::seed_from_env),
/// `count_env`) or the defaults.
pub fn fuzz_setup(seed_env: &str, default_seed: u64, count_env: &str, default_count: u64) -> Option<(u64, u64)> {
    if !crate::require(may_load(), "root, to load programs into the kernel (bpf(BPF_PROG_LOAD))") {
        return None;
    }
    Some((crate::seed_from_env(seed_env, default_seed), crate::env_u64(count_env).unwrap_or(default_count)))
}

/// A `union bpf_attr` of 128 bytes, filled by offset.
struct Attr([u64; 16]);

impl Attr {
    fn new() -> Attr {
        Attr([0; 16])
    }
    fn u32(mut self, off: usize, v: u32) -> Attr {
        let w = &mut self.0[off / 8];
        let shift = (off % 8) * 8;
        *w = (*w & !(0xffff_ffffu64 << shift)) | (v as u64) << shift;
        self
    }
    fn u64(mut self, off: usize, v: u64) -> Attr {
        self.0[off / 8] = v;
        self
    }
    fn get_u32(&self, off: usize) -> u32 {
        (self.0[off / 8] >> ((off % 8) * 8)) as u32
    }
    fn call(&mut self, cmd: libc::c_long) -> io::Result<libc::c_long> {
        // SAFETY: the attribute is a `union bpf_attr` of 128 bytes whose pointers (set by the
        // functions below from their arguments) point to live buffers of the sizes the command
        // reads and writes.
        let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, self.0.as_mut_ptr(), 128u32) };
        if r < 0 { Err(io::Error::last_os_error()) } else { Ok(r) }
    }
}

/// A descriptor of the kernel's (a map or a program), closed when dropped.
pub struct Fd(pub libc::c_int);

impl Drop for Fd {
    fn drop(&mut self) {
        // SAFETY: a descriptor this process opened, closed once.
        unsafe { libc::close(self.0) };
    }
}

/// `BPF_MAP_CREATE`.
pub fn map_create(map_type: u32, key_size: u32, value_size: u32, max_entries: u32, flags: u32) -> io::Result<Fd> {
    let mut a = Attr::new().u32(0, map_type).u32(4, key_size).u32(8, value_size).u32(12, max_entries).u32(16, flags);
    Ok(Fd(a.call(BPF_MAP_CREATE)? as libc::c_int))
}

/// `BPF_MAP_LOOKUP_AND_DELETE_ELEM` of a map without keys (a queue's or stack's pop).
pub fn map_pop(map: &Fd, value: &mut [u8]) -> io::Result<()> {
    let mut a = Attr::new().u32(0, map.0 as u32).u64(16, value.as_mut_ptr() as u64);
    a.call(BPF_MAP_LOOKUP_AND_DELETE_ELEM).map(drop)
}

/// `BPF_MAP_FREEZE`.
pub fn map_freeze(map: &Fd) -> io::Result<()> {
    Attr::new().u32(0, map.0 as u32).call(BPF_MAP_FREEZE).map(drop)
}

/// `BPF_BTF_LOAD` of the smallest BTF that names a program's functions, for programs whose
/// subprograms the kernel wants described (callbacks, as `bpf_loop`'s): one `FUNC_PROTO`
/// (no arguments, void) and a static `FUNC` per function. Its descriptor, and the `func_info`
/// records (instruction offset, type id) for [`prog_load_with_funcs`].
fn funcs_btf(starts: &[u32]) -> io::Result<(Fd, Vec<[u32; 2]>)> {
    const BTF_KIND_FUNC: u32 = 12;
    const BTF_KIND_FUNC_PROTO: u32 = 13;
    let mut strings = vec![0u8];
    let mut types: Vec<u32> = vec![0, BTF_KIND_FUNC_PROTO << 24, 0];
    let mut infos = Vec::new();
    for (i, &start) in starts.iter().enumerate() {
        let name = strings.len() as u32;
        strings.extend_from_slice(format!("f{i}").as_bytes());
        strings.push(0);
        types.extend([name, BTF_KIND_FUNC << 24, 1]);
        infos.push([start, 2 + i as u32]);
    }
    let type_len = (types.len() * 4) as u32;
    let mut btf = Vec::new();
    btf.extend_from_slice(&0xeb9fu16.to_ne_bytes());
    btf.extend_from_slice(&[1, 0]);
    for v in [24u32, 0, type_len, type_len, strings.len() as u32] {
        btf.extend_from_slice(&v.to_ne_bytes());
    }
    for t in types {
        btf.extend_from_slice(&t.to_ne_bytes());
    }
    btf.extend_from_slice(&strings);
    let mut a = Attr::new().u64(0, btf.as_ptr() as u64).u32(16, btf.len() as u32);
    Ok((Fd(a.call(BPF_BTF_LOAD)? as libc::c_int), infos))
}

/// [`prog_load`] of a program whose functions start at `starts` (the main one at 0), with the
/// BTF and `func_info` the kernel asks of programs that pass callbacks.
pub fn prog_load_with_funcs(
    prog_type: u32,
    insns: &[u8],
    flags: u32,
    starts: &[u32],
) -> Result<Fd, (io::Error, String)> {
    let (btf, infos) = funcs_btf(starts).map_err(|e| (e, "BPF_BTF_LOAD".to_string()))?;
    let funcs = (btf.0 as u32, infos);
    prog_load_inner(prog_type, insns, flags, Some(&funcs))
}

/// `BPF_PROG_LOAD` of `insns` (encoded), GPL, with the verifier's log at level 1: the
/// program, or the error and the log.
pub fn prog_load(prog_type: u32, insns: &[u8], flags: u32) -> Result<Fd, (io::Error, String)> {
    prog_load_inner(prog_type, insns, flags, None)
}

fn prog_load_inner(
    prog_type: u32,
    insns: &[u8],
    flags: u32,
    funcs: Option<&(u32, Vec<[u32; 2]>)>,
) -> Result<Fd, (io::Error, String)> {
    let mut log = vec![0u8; 1 << 20];
    let mut a = Attr::new()
        .u32(0, prog_type)
        .u32(4, (insns.len() / 8) as u32)
        .u64(8, insns.as_ptr() as u64)
        .u64(16, c"GPL".as_ptr() as u64)
        .u32(24, 1)
        .u32(28, log.len() as u32)
        .u64(32, log.as_mut_ptr() as u64)
        .u32(44, flags);
    if let Some((btf, infos)) = funcs {
        a = a.u32(72, *btf).u32(76, 8).u64(80, infos.as_ptr() as u64).u32(88, infos.len() as u32);
    }
    match a.call(BPF_PROG_LOAD) {
        Ok(fd) => Ok(Fd(fd as libc::c_int)),
        Err(e) => {
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            Err((e, String::from_utf8_lossy(&log[..end]).into_owned()))
        }
    }
}

/// `BPF_PROG_TEST_RUN` on `packet`: the program's return value.
pub fn test_run_packet(prog: &Fd, packet: &[u8]) -> io::Result<u32> {
    let mut a = Attr::new().u32(0, prog.0 as u32).u32(8, packet.len() as u32).u64(16, packet.as_ptr() as u64);
    a.call(BPF_PROG_TEST_RUN)?;
    Ok(a.get_u32(4))
}

/// `BPF_PROG_TEST_RUN` with `ctx` as the context (copied in, and back out for the program
/// types that write it): the program's return value (its low 32 bits).
pub fn test_run_ctx(prog: &Fd, ctx: &mut [u8]) -> io::Result<u32> {
    let mut a = Attr::new().u32(0, prog.0 as u32).u32(40, ctx.len() as u32).u64(48, ctx.as_mut_ptr() as u64);
    a.call(BPF_PROG_TEST_RUN)?;
    Ok(a.get_u32(4))
}
