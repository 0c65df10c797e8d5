//! The structs OBJ_GET_INFO_BY_FD fills, `#[repr(C)]` with the uapi's field names
//! (`struct bpf_prog_info`, `bpf_map_info`, `bpf_btf_info`, `bpf_link_info` of
//! `linux/bpf.h`), padding spelled out so that a struct is its bytes.

use std::mem::{offset_of, size_of};

use super::attr::Plain;

/// An info struct: plain data whose every byte is a field (explicit padding), so it can be
/// written back to the caller as its bytes.
///
/// # Safety
/// Implementors are [`Plain`] and have no implicit padding.
pub unsafe trait InfoStruct: Plain + Default {}

/// The bytes of an info struct.
pub fn bytes_of<T: InfoStruct>(v: &T) -> &[u8] {
    // SAFETY: `T` has no padding (InfoStruct's contract), so all its bytes are initialised;
    // the slice borrows `v` for its length.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) }
}

/// A NUL-padded 16-byte name field holding at most 15 bytes of `name`.
pub fn name16(name: &str) -> [u8; 16] {
    let mut f = [0u8; 16];
    let n = name.len().min(15);
    f[..n].copy_from_slice(&name.as_bytes()[..n]);
    f
}

/// `struct bpf_prog_info`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ProgInfo {
    pub r#type: u32,
    pub id: u32,
    pub tag: [u8; 8],
    pub jited_prog_len: u32,
    pub xlated_prog_len: u32,
    pub jited_prog_insns: u64,
    pub xlated_prog_insns: u64,
    pub load_time: u64,
    pub created_by_uid: u32,
    pub nr_map_ids: u32,
    pub map_ids: u64,
    pub name: [u8; 16],
    pub ifindex: u32,
    /// `gpl_compatible:1` and 31 unused bits.
    pub gpl_compatible: u32,
    pub netns_dev: u64,
    pub netns_ino: u64,
    pub nr_jited_ksyms: u32,
    pub nr_jited_func_lens: u32,
    pub jited_ksyms: u64,
    pub jited_func_lens: u64,
    pub btf_id: u32,
    pub func_info_rec_size: u32,
    pub func_info: u64,
    pub nr_func_info: u32,
    pub nr_line_info: u32,
    pub line_info: u64,
    pub jited_line_info: u64,
    pub nr_jited_line_info: u32,
    pub line_info_rec_size: u32,
    pub jited_line_info_rec_size: u32,
    pub nr_prog_tags: u32,
    pub prog_tags: u64,
    pub run_time_ns: u64,
    pub run_cnt: u64,
    pub recursion_misses: u64,
    pub verified_insns: u32,
    pub attach_btf_obj_id: u32,
    pub attach_btf_id: u32,
    pub _pad: u32,
}

/// `struct bpf_map_info`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MapInfo {
    pub r#type: u32,
    pub id: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub map_flags: u32,
    pub name: [u8; 16],
    pub ifindex: u32,
    pub btf_vmlinux_value_type_id: u32,
    pub netns_dev: u64,
    pub netns_ino: u64,
    pub btf_id: u32,
    pub btf_key_type_id: u32,
    pub btf_value_type_id: u32,
    pub btf_vmlinux_id: u32,
    pub map_extra: u64,
}

/// `struct bpf_btf_info`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct BtfInfo {
    pub btf: u64,
    pub btf_size: u32,
    pub id: u32,
    pub name: u64,
    pub name_len: u32,
    pub kernel_btf: u32,
}

/// `struct bpf_link_info`, with its union's `raw_tracepoint` member (other link types' members
/// are the rest of the union).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct LinkInfo {
    pub r#type: u32,
    pub id: u32,
    pub prog_id: u32,
    pub _pad: u32,
    /// `raw_tracepoint.tp_name`.
    pub tp_name: u64,
    /// `raw_tracepoint.tp_name_len`.
    pub tp_name_len: u32,
    pub _rest: [u32; 5],
}

macro_rules! info_struct {
    ($($t:ty = $size:expr_2021),* $(,)?) => {
        $(
            // SAFETY: #[repr(C)] structs of integers and integer arrays.
            unsafe impl Plain for $t {}
            // SAFETY: the size asserted below is the sum of the fields' sizes: no padding.
            unsafe impl InfoStruct for $t {}
            const _: () = assert!(size_of::<$t>() == $size);
        )*
    };
}

info_struct!(ProgInfo = 232, MapInfo = 88, BtfInfo = 32, LinkInfo = 48);

// The layouts are the uapi's (libbpf 1.1's linux/bpf.h, x86-64).
const _: () = {
    assert!(
        offset_of!(ProgInfo, tag) == 8
            && offset_of!(ProgInfo, xlated_prog_insns) == 32
            && offset_of!(ProgInfo, map_ids) == 56
    );
    assert!(
        offset_of!(ProgInfo, name) == 64
            && offset_of!(ProgInfo, gpl_compatible) == 84
            && offset_of!(ProgInfo, btf_id) == 128
    );
    assert!(
        offset_of!(ProgInfo, func_info) == 136
            && offset_of!(ProgInfo, line_info) == 152
            && offset_of!(ProgInfo, line_info_rec_size) == 172
    );
    assert!(
        offset_of!(ProgInfo, prog_tags) == 184
            && offset_of!(ProgInfo, run_time_ns) == 192
            && offset_of!(ProgInfo, attach_btf_id) == 224
    );
    assert!(
        offset_of!(MapInfo, name) == 24
            && offset_of!(MapInfo, netns_dev) == 48
            && offset_of!(MapInfo, btf_id) == 64
            && offset_of!(MapInfo, map_extra) == 80
    );
    assert!(offset_of!(BtfInfo, id) == 12 && offset_of!(BtfInfo, name) == 16 && offset_of!(BtfInfo, kernel_btf) == 28);
    assert!(
        offset_of!(LinkInfo, prog_id) == 8
            && offset_of!(LinkInfo, tp_name) == 16
            && offset_of!(LinkInfo, tp_name_len) == 24
    );
};
