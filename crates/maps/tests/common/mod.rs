//! Test support: temporary directories, specs, a small PRNG, and kernel maps through bpf().
#![allow(dead_code)]

use std::sync::atomic::{AtomicU32, Ordering};

use userbpf_maps::*;

#[allow(unused_imports)]
pub use userbpf_testutil::{Rng, TmpDir};

pub fn spec(map_type: MapType, key_size: u32, value_size: u32, max_entries: u32, map_flags: u32) -> MapSpec {
    MapSpec { map_type, key_size, value_size, max_entries, map_flags, map_extra: 0, name: "test".into() }
}

/// Creates a map in a fresh file of `dir`.
pub fn create(dir: &TmpDir, s: &MapSpec) -> Map {
    static N: AtomicU32 = AtomicU32::new(0);
    Map::create(&dir.path(&format!("m{}", N.fetch_add(1, Ordering::Relaxed))), s).unwrap()
}

pub fn errno<T>(r: Result<T, MapError>) -> i32 {
    match r {
        Ok(_) => 0,
        Err(e) => e.errno(),
    }
}

// ---- the kernel's maps ----

const BPF_MAP_CREATE: i64 = 0;
const BPF_MAP_LOOKUP_ELEM: i64 = 1;
const BPF_MAP_UPDATE_ELEM: i64 = 2;
const BPF_MAP_DELETE_ELEM: i64 = 3;
const BPF_MAP_GET_NEXT_KEY: i64 = 4;
const BPF_MAP_LOOKUP_AND_DELETE_ELEM: i64 = 21;

/// A map created in the kernel with bpf(BPF_MAP_CREATE).
pub struct KMap {
    fd: i32,
    pub spec: MapSpec,
}

fn bpf(cmd: i64, attr: &mut [u64; 16]) -> Result<i64, i32> {
    // SAFETY: `attr` is a zero-initialised 128-byte buffer laid out as union bpf_attr's
    // first fields; the kernel reads at most 128 bytes and writes nothing back for these
    // commands except through the user pointers stored in it, which point at live buffers
    // of the sizes the map was created with.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), 128usize) };
    if r < 0 { Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)) } else { Ok(r) }
}

impl KMap {
    /// BPF_MAP_CREATE, or the errno.
    pub fn create(s: &MapSpec) -> Result<KMap, i32> {
        let mut a = [0u64; 16];
        let w = |a: &mut [u64; 16], off: usize, v: u32| {
            let i = off / 8;
            if off.is_multiple_of(8) {
                a[i] = (a[i] & !0xffff_ffff) | v as u64;
            } else {
                a[i] = (a[i] & 0xffff_ffff) | (v as u64) << 32;
            }
        };
        w(&mut a, 0, s.map_type as u32);
        w(&mut a, 4, s.key_size);
        w(&mut a, 8, s.value_size);
        w(&mut a, 12, s.max_entries);
        w(&mut a, 16, s.map_flags);
        a[8] = s.map_extra; // offset 64
        let fd = bpf(BPF_MAP_CREATE, &mut a)?;
        Ok(KMap { fd: fd as i32, spec: s.clone() })
    }

    fn elem(&self, cmd: i64, key: *const u8, value: *const u8, flags: u64) -> Result<(), i32> {
        let mut a = [0u64; 16];
        a[0] = self.fd as u64;
        a[1] = key as u64;
        a[2] = value as u64;
        a[3] = flags;
        bpf(cmd, &mut a).map(|_| ())
    }

    fn kptr(key: &[u8]) -> *const u8 {
        if key.is_empty() { std::ptr::null() } else { key.as_ptr() }
    }

    pub fn lookup(&self, key: &[u8], out: &mut [u8]) -> Result<(), i32> {
        self.elem(BPF_MAP_LOOKUP_ELEM, Self::kptr(key), out.as_mut_ptr(), 0)
    }
    pub fn update(&self, key: &[u8], value: &[u8], flags: u64) -> Result<(), i32> {
        self.elem(BPF_MAP_UPDATE_ELEM, Self::kptr(key), value.as_ptr(), flags)
    }
    pub fn delete(&self, key: &[u8]) -> Result<(), i32> {
        self.elem(BPF_MAP_DELETE_ELEM, Self::kptr(key), std::ptr::null(), 0)
    }
    pub fn get_next_key(&self, key: Option<&[u8]>, out: &mut [u8]) -> Result<(), i32> {
        self.elem(BPF_MAP_GET_NEXT_KEY, key.map_or(std::ptr::null(), |k| k.as_ptr()), out.as_mut_ptr(), 0)
    }
    pub fn lookup_and_delete(&self, key: &[u8], out: &mut [u8]) -> Result<(), i32> {
        self.elem(BPF_MAP_LOOKUP_AND_DELETE_ELEM, Self::kptr(key), out.as_mut_ptr(), 0)
    }
}

impl Drop for KMap {
    fn drop(&mut self) {
        // SAFETY: closing the fd this value owns.
        unsafe { libc::close(self.fd) };
    }
}

/// Whether bpf() can create maps here; prints a notice when not.
pub fn kernel_available(test: &str) -> bool {
    match KMap::create(&spec(MapType::BPF_MAP_TYPE_ARRAY, 4, 4, 1, 0)) {
        Ok(_) => true,
        Err(e) => userbpf_testutil::require(
            false,
            &format!("{test}: the kernel's bpf() (errno {e}; needs root or CAP_BPF) for the differential test"),
        ),
    }
}

/// Ours as an errno (0 = ok).
pub fn ours(r: Result<(), MapError>) -> i32 {
    errno(r)
}
/// The kernel's as an errno (0 = ok).
pub fn theirs(r: Result<(), i32>) -> i32 {
    r.err().unwrap_or(0)
}
