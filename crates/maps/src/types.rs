//! The kernel's map types, flags and errors, as the uapi names them.

use thiserror::Error;

/// `enum bpf_map_type` from the kernel's uapi.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
#[allow(non_camel_case_types)]
pub enum MapType {
    BPF_MAP_TYPE_HASH = 1,
    BPF_MAP_TYPE_ARRAY = 2,
    BPF_MAP_TYPE_PROG_ARRAY = 3,
    BPF_MAP_TYPE_PERF_EVENT_ARRAY = 4,
    BPF_MAP_TYPE_PERCPU_HASH = 5,
    BPF_MAP_TYPE_PERCPU_ARRAY = 6,
    BPF_MAP_TYPE_STACK_TRACE = 7,
    BPF_MAP_TYPE_CGROUP_ARRAY = 8,
    BPF_MAP_TYPE_LRU_HASH = 9,
    BPF_MAP_TYPE_LRU_PERCPU_HASH = 10,
    BPF_MAP_TYPE_LPM_TRIE = 11,
    BPF_MAP_TYPE_ARRAY_OF_MAPS = 12,
    BPF_MAP_TYPE_HASH_OF_MAPS = 13,
    BPF_MAP_TYPE_QUEUE = 22,
    BPF_MAP_TYPE_STACK = 23,
    BPF_MAP_TYPE_RINGBUF = 27,
    BPF_MAP_TYPE_BLOOM_FILTER = 30,
}

impl MapType {
    /// The supported type with this uapi number.
    pub fn from_u32(v: u32) -> Option<MapType> {
        use MapType::*;
        Some(match v {
            1 => BPF_MAP_TYPE_HASH,
            2 => BPF_MAP_TYPE_ARRAY,
            3 => BPF_MAP_TYPE_PROG_ARRAY,
            4 => BPF_MAP_TYPE_PERF_EVENT_ARRAY,
            5 => BPF_MAP_TYPE_PERCPU_HASH,
            6 => BPF_MAP_TYPE_PERCPU_ARRAY,
            7 => BPF_MAP_TYPE_STACK_TRACE,
            8 => BPF_MAP_TYPE_CGROUP_ARRAY,
            9 => BPF_MAP_TYPE_LRU_HASH,
            10 => BPF_MAP_TYPE_LRU_PERCPU_HASH,
            11 => BPF_MAP_TYPE_LPM_TRIE,
            12 => BPF_MAP_TYPE_ARRAY_OF_MAPS,
            13 => BPF_MAP_TYPE_HASH_OF_MAPS,
            22 => BPF_MAP_TYPE_QUEUE,
            23 => BPF_MAP_TYPE_STACK,
            27 => BPF_MAP_TYPE_RINGBUF,
            30 => BPF_MAP_TYPE_BLOOM_FILTER,
            _ => return None,
        })
    }

    /// The uapi name without the prefix, lower case, as bpftool prints it (`percpu_hash`).
    pub fn name(self) -> &'static str {
        use MapType::*;
        match self {
            BPF_MAP_TYPE_HASH => "hash",
            BPF_MAP_TYPE_ARRAY => "array",
            BPF_MAP_TYPE_PROG_ARRAY => "prog_array",
            BPF_MAP_TYPE_PERF_EVENT_ARRAY => "perf_event_array",
            BPF_MAP_TYPE_PERCPU_HASH => "percpu_hash",
            BPF_MAP_TYPE_PERCPU_ARRAY => "percpu_array",
            BPF_MAP_TYPE_STACK_TRACE => "stack_trace",
            BPF_MAP_TYPE_CGROUP_ARRAY => "cgroup_array",
            BPF_MAP_TYPE_LRU_HASH => "lru_hash",
            BPF_MAP_TYPE_LRU_PERCPU_HASH => "lru_percpu_hash",
            BPF_MAP_TYPE_LPM_TRIE => "lpm_trie",
            BPF_MAP_TYPE_ARRAY_OF_MAPS => "array_of_maps",
            BPF_MAP_TYPE_HASH_OF_MAPS => "hash_of_maps",
            BPF_MAP_TYPE_QUEUE => "queue",
            BPF_MAP_TYPE_STACK => "stack",
            BPF_MAP_TYPE_RINGBUF => "ringbuf",
            BPF_MAP_TYPE_BLOOM_FILTER => "bloom_filter",
        }
    }

    /// Whether values exist once per possible CPU.
    pub fn is_percpu(self) -> bool {
        matches!(
            self,
            MapType::BPF_MAP_TYPE_PERCPU_HASH
                | MapType::BPF_MAP_TYPE_PERCPU_ARRAY
                | MapType::BPF_MAP_TYPE_LRU_PERCPU_HASH
        )
    }
}

// map_flags at creation.
pub const BPF_F_NO_PREALLOC: u32 = 1 << 0;
pub const BPF_F_NO_COMMON_LRU: u32 = 1 << 1;
pub const BPF_F_NUMA_NODE: u32 = 1 << 2;
pub const BPF_F_RDONLY: u32 = 1 << 3;
pub const BPF_F_WRONLY: u32 = 1 << 4;
pub const BPF_F_STACK_BUILD_ID: u32 = 1 << 5;
pub const BPF_F_ZERO_SEED: u32 = 1 << 6;
pub const BPF_F_RDONLY_PROG: u32 = 1 << 7;
pub const BPF_F_WRONLY_PROG: u32 = 1 << 8;
pub const BPF_F_CLONE: u32 = 1 << 9;
pub const BPF_F_MMAPABLE: u32 = 1 << 10;
pub const BPF_F_PRESERVE_ELEMS: u32 = 1 << 11;
pub const BPF_F_INNER_MAP: u32 = 1 << 12;

// Flags of update_elem.
pub const BPF_ANY: u64 = 0;
pub const BPF_NOEXIST: u64 = 1;
pub const BPF_EXIST: u64 = 2;
pub const BPF_F_LOCK: u64 = 4;

// Flags of get_stackid.
pub const BPF_F_SKIP_FIELD_MASK: u64 = 0xff;
pub const BPF_F_USER_STACK: u64 = 1 << 8;
pub const BPF_F_FAST_STACK_CMP: u64 = 1 << 9;
pub const BPF_F_REUSE_STACKID: u64 = 1 << 10;

// Ring buffer flags and record header bits.
pub const BPF_RB_NO_WAKEUP: u64 = 1 << 0;
pub const BPF_RB_FORCE_WAKEUP: u64 = 1 << 1;
pub const BPF_RB_AVAIL_DATA: u64 = 0;
pub const BPF_RB_RING_SIZE: u64 = 1;
pub const BPF_RB_CONS_POS: u64 = 2;
pub const BPF_RB_PROD_POS: u64 = 3;
pub const BPF_RINGBUF_BUSY_BIT: u32 = 1 << 31;
pub const BPF_RINGBUF_DISCARD_BIT: u32 = 1 << 30;
pub const BPF_RINGBUF_HDR_SZ: u32 = 8;

/// The kernel's internal `ENOTSUPP` (524), which bpf() returns to userspace for operations a
/// map type lacks (`lookup_and_delete_elem` on an array, a hash map without preallocation
/// for LRU). Not `libc::ENOTSUP` (95), which is `EOPNOTSUPP`.
pub const ENOTSUPP: i32 = 524;

/// What a map is created with (the fields of BPF_MAP_CREATE that matter here).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapSpec {
    pub map_type: MapType,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub map_flags: u32,
    /// Bloom filter: number of hash functions in the low 4 bits (0 means 5).
    pub map_extra: u64,
    /// Up to 15 bytes, as the kernel keeps it.
    pub name: String,
}

/// A failed map operation: the kernel's errno for the same case.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
#[error("{} ({})", errno_name(.0.errno), .0.what)]
pub struct MapError(pub ErrorDetail);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorDetail {
    /// Positive errno (`libc::ENOENT`, ...); helpers return its negation.
    pub errno: i32,
    /// Why, for logs and CLI messages.
    pub what: &'static str,
}

impl MapError {
    pub const fn new(errno: i32, what: &'static str) -> MapError {
        MapError(ErrorDetail { errno, what })
    }
    pub fn errno(&self) -> i32 {
        self.0.errno
    }
    /// The value a helper returns: `-errno`.
    pub fn to_helper_ret(&self) -> u64 {
        (-(self.0.errno as i64)) as u64
    }
}

fn errno_name(e: i32) -> &'static str {
    match e {
        libc::ENOENT => "ENOENT",
        libc::EEXIST => "EEXIST",
        libc::E2BIG => "E2BIG",
        libc::EINVAL => "EINVAL",
        libc::ENOMEM => "ENOMEM",
        libc::EBUSY => "EBUSY",
        libc::EFAULT => "EFAULT",
        libc::ENOSPC => "ENOSPC",
        libc::EPERM => "EPERM",
        libc::ENOTSUP => "EOPNOTSUPP",
        ENOTSUPP => "ENOTSUPP",
        libc::EBADF => "EBADF",
        libc::EIO => "EIO",
        _ => "errno",
    }
}
