//! `union bpf_attr`, one `#[repr(C)]` struct per command (or group of commands sharing a
//! layout), with the field names of the kernel's uapi header (`linux/bpf.h`): a command reads
//! its struct with [`Attr::get`](super::Attr::get), which first checks that the bytes past
//! the command's last field are zero, as the kernel's `CHECK_ATTR` does.
//!
//! Descriptor fields are `__u32` in the uapi; they are `i32` here where the command treats
//! them as descriptors (the same four bytes).

use std::mem::{offset_of, size_of};

/// Plain attribute data: read from the caller's bytes as is.
///
/// # Safety
/// Implementors are `#[repr(C)]` structs of integers and integer arrays only, so every bit
/// pattern is a valid value. (Reading one from an attribute block asserts at compile time
/// that it fits the block: [`super::Attr::view`].)
pub unsafe trait Plain: Copy {}

/// The end of field `$f` of struct `$t` (its offset plus its size): what `CHECK_ATTR` calls
/// the command's last field.
macro_rules! end_of {
    ($t:ty, $f:ident) => {
        $crate::bpf::attr::field_end::<$t, _>(::std::mem::offset_of!($t, $f), |x: &$t| &x.$f)
    };
}
pub(crate) use end_of;

/// `off + size_of::<F>()`, `F` named by the accessor (see [`end_of!`]).
pub fn field_end<T, F>(off: usize, _field: fn(&T) -> &F) -> usize {
    off + size_of::<F>()
}

/// The bytes of a NUL-padded name field up to its first NUL.
pub fn c_name(field: &[u8]) -> Vec<u8> {
    field[..field.iter().position(|&b| b == 0).unwrap_or(field.len())].to_vec()
}

macro_rules! plain {
    ($($t:ty),* $(,)?) => {
        $(
            // SAFETY: a #[repr(C)] struct of integer fields and integer arrays (checked to
            // fit in the attribute block below).
            unsafe impl Plain for $t {}
            const _: () = assert!(size_of::<$t>() <= super::ATTR_SIZE);
        )*
    };
}

/// BPF_MAP_CREATE.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MapCreate {
    pub map_type: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub map_flags: u32,
    pub inner_map_fd: i32,
    pub numa_node: u32,
    pub map_name: [u8; 16],
    pub map_ifindex: u32,
    pub btf_fd: i32,
    pub btf_key_type_id: u32,
    pub btf_value_type_id: u32,
    pub btf_vmlinux_value_type_id: u32,
    pub map_extra: u64,
}

/// BPF_MAP_LOOKUP_ELEM, BPF_MAP_UPDATE_ELEM, BPF_MAP_DELETE_ELEM,
/// BPF_MAP_LOOKUP_AND_DELETE_ELEM, BPF_MAP_FREEZE.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MapElem {
    pub map_fd: i32,
    pub key: u64,
    pub value: u64,
    pub flags: u64,
}

/// BPF_MAP_GET_NEXT_KEY (the same block as [`MapElem`], `value` read as `next_key`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MapNextKey {
    pub map_fd: i32,
    pub key: u64,
    pub next_key: u64,
}

/// The BPF_MAP_*_BATCH commands.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MapBatch {
    pub in_batch: u64,
    pub out_batch: u64,
    pub keys: u64,
    pub values: u64,
    pub count: u32,
    pub map_fd: i32,
    pub elem_flags: u64,
    pub flags: u64,
}

/// BPF_PROG_LOAD.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ProgLoad {
    pub prog_type: u32,
    pub insn_cnt: u32,
    pub insns: u64,
    pub license: u64,
    pub log_level: u32,
    pub log_size: u32,
    pub log_buf: u64,
    pub kern_version: u32,
    pub prog_flags: u32,
    pub prog_name: [u8; 16],
    pub prog_ifindex: u32,
    pub expected_attach_type: u32,
    pub prog_btf_fd: i32,
    pub func_info_rec_size: u32,
    pub func_info: u64,
    pub func_info_cnt: u32,
    pub line_info_rec_size: u32,
    pub line_info: u64,
    pub line_info_cnt: u32,
    pub attach_btf_id: u32,
    /// Or `attach_btf_obj_fd` (a union in the uapi).
    pub attach_prog_fd: u32,
    pub core_relo_cnt: u32,
    pub fd_array: u64,
    pub core_relos: u64,
    pub core_relo_rec_size: u32,
    pub log_true_size: u32,
}

/// BPF_OBJ_PIN, BPF_OBJ_GET.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Obj {
    pub pathname: u64,
    pub bpf_fd: i32,
    pub file_flags: u32,
    pub path_fd: i32,
}

/// BPF_PROG_ATTACH, BPF_PROG_DETACH.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ProgAttach {
    pub target_fd: i32,
    pub attach_bpf_fd: i32,
    pub attach_type: u32,
    pub attach_flags: u32,
    pub replace_bpf_fd: i32,
}

/// BPF_PROG_TEST_RUN (`test` in the uapi).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TestRun {
    pub prog_fd: i32,
    pub retval: u32,
    pub data_size_in: u32,
    pub data_size_out: u32,
    pub data_in: u64,
    pub data_out: u64,
    pub repeat: u32,
    pub duration: u32,
    pub ctx_size_in: u32,
    pub ctx_size_out: u32,
    pub ctx_in: u64,
    pub ctx_out: u64,
    pub flags: u32,
    pub cpu: u32,
    pub batch_size: u32,
}

/// BPF_*_GET_NEXT_ID and BPF_*_GET_FD_BY_ID.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct GetId {
    /// `start_id`, or `prog_id`, `map_id`, `btf_id`, `link_id` (a union in the uapi).
    pub start_id: u32,
    pub next_id: u32,
    pub open_flags: u32,
}

/// BPF_OBJ_GET_INFO_BY_FD (`info` in the uapi).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct InfoByFd {
    pub bpf_fd: i32,
    pub info_len: u32,
    pub info: u64,
}

/// BPF_PROG_QUERY (`query` in the uapi), up to `prog_cnt`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ProgQuery {
    pub target_fd: i32,
    pub attach_type: u32,
    pub query_flags: u32,
    pub attach_flags: u32,
    pub prog_ids: u64,
    pub prog_cnt: u32,
}

/// BPF_RAW_TRACEPOINT_OPEN (`raw_tracepoint` in the uapi).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct RawTracepointOpen {
    pub name: u64,
    pub prog_fd: i32,
}

/// BPF_BTF_LOAD.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct BtfLoad {
    pub btf: u64,
    pub btf_log_buf: u64,
    pub btf_size: u32,
    pub btf_log_size: u32,
    pub btf_log_level: u32,
    pub btf_log_true_size: u32,
}

/// BPF_TASK_FD_QUERY (`task_fd_query` in the uapi).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TaskFdQuery {
    pub pid: u32,
    pub fd: i32,
    pub flags: u32,
    pub buf_len: u32,
    pub buf: u64,
    pub prog_id: u32,
    pub fd_type: u32,
    pub probe_offset: u64,
    pub probe_addr: u64,
}

/// BPF_LINK_CREATE (`link_create` in the uapi): the target-specific union starts at
/// offset 16; only its `perf_event.bpf_cookie` is read here.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct LinkCreate {
    pub prog_fd: i32,
    /// Or `target_ifindex` (a union in the uapi).
    pub target_fd: i32,
    pub attach_type: u32,
    pub flags: u32,
    /// `perf_event.bpf_cookie`, the first word of the union.
    pub bpf_cookie: u64,
    /// The rest of the union (other attach types' fields).
    pub rest: [u64; 5],
}

/// BPF_LINK_UPDATE (`link_update` in the uapi).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct LinkUpdate {
    pub link_fd: i32,
    pub new_prog_fd: i32,
    pub flags: u32,
    pub old_prog_fd: i32,
}

/// BPF_LINK_DETACH (`link_detach` in the uapi).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct LinkDetach {
    pub link_fd: i32,
}

/// BPF_ENABLE_STATS (`enable_stats` in the uapi; its field is `type`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct EnableStats {
    pub r#type: u32,
}

/// BPF_ITER_CREATE (`iter_create` in the uapi).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IterCreate {
    pub link_fd: i32,
    pub flags: u32,
}

/// BPF_PROG_BIND_MAP (`prog_bind_map` in the uapi).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ProgBindMap {
    pub prog_fd: i32,
    pub map_fd: i32,
    pub flags: u32,
}

plain!(
    MapCreate,
    MapElem,
    MapNextKey,
    MapBatch,
    ProgLoad,
    Obj,
    ProgAttach,
    TestRun,
    GetId,
    InfoByFd,
    ProgQuery,
    RawTracepointOpen,
    BtfLoad,
    TaskFdQuery,
    LinkCreate,
    LinkUpdate,
    LinkDetach,
    EnableStats,
    IterCreate,
    ProgBindMap,
);

// The layouts are the uapi's: offsets of libbpf 1.1's linux/bpf.h (x86-64).
const _: () = {
    assert!(
        offset_of!(MapCreate, map_name) == 28
            && offset_of!(MapCreate, map_ifindex) == 44
            && offset_of!(MapCreate, map_extra) == 64
    );
    assert!(size_of::<MapCreate>() == 72);
    assert!(offset_of!(MapElem, key) == 8 && offset_of!(MapElem, value) == 16 && offset_of!(MapElem, flags) == 24);
    assert!(offset_of!(MapNextKey, next_key) == 16);
    assert!(
        offset_of!(MapBatch, count) == 32 && offset_of!(MapBatch, map_fd) == 36 && offset_of!(MapBatch, flags) == 48
    );
    assert!(
        offset_of!(ProgLoad, prog_flags) == 44
            && offset_of!(ProgLoad, prog_name) == 48
            && offset_of!(ProgLoad, prog_btf_fd) == 72
    );
    assert!(
        offset_of!(ProgLoad, func_info) == 80
            && offset_of!(ProgLoad, line_info_cnt) == 104
            && offset_of!(ProgLoad, fd_array) == 120
    );
    assert!(offset_of!(ProgLoad, log_true_size) == 140 && size_of::<ProgLoad>() == 144);
    assert!(offset_of!(Obj, bpf_fd) == 8 && offset_of!(Obj, path_fd) == 16);
    assert!(offset_of!(ProgAttach, replace_bpf_fd) == 16);
    assert!(
        offset_of!(TestRun, data_in) == 16
            && offset_of!(TestRun, ctx_in) == 48
            && offset_of!(TestRun, batch_size) == 72
    );
    assert!(offset_of!(GetId, open_flags) == 8);
    assert!(offset_of!(InfoByFd, info) == 8);
    assert!(
        offset_of!(ProgQuery, prog_ids) == 16 && offset_of!(ProgQuery, prog_cnt) == 24 && size_of::<ProgQuery>() == 32
    );
    assert!(offset_of!(RawTracepointOpen, prog_fd) == 8);
    assert!(offset_of!(BtfLoad, btf_size) == 16 && offset_of!(BtfLoad, btf_log_true_size) == 28);
    assert!(
        offset_of!(TaskFdQuery, buf) == 16
            && offset_of!(TaskFdQuery, prog_id) == 24
            && offset_of!(TaskFdQuery, probe_addr) == 40
    );
    assert!(offset_of!(LinkCreate, bpf_cookie) == 16 && size_of::<LinkCreate>() == 64);
    assert!(offset_of!(LinkUpdate, old_prog_fd) == 12);
    assert!(offset_of!(ProgBindMap, flags) == 8);
};
