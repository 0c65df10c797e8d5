//! eBPF maps in shared memory.
//!
//! Every map lives in one file (under /dev/shm in practice) mapped by every process that uses
//! it: the target running programs, the CLI reading them, loaders. Semantics follow the
//! kernel's (flags, errno values, max_entries, get_next_key while entries are deleted). The
//! hot path (lookup, update, delete from a program) takes no lock that can block, makes no
//! system call and allocates nothing.
//!
//! [`Map`] is the entry point: [`Map::create`] / [`Map::open`], the syscall-style API
//! (`lookup_elem`, `update_elem`, `delete_elem`, `get_next_key`, `lookup_and_delete_elem`)
//! and the program-side API (`lookup`, `update`, `delete`, `push`, `pop`, `peek`,
//! `get_stackid`). One module per family of map types documents its file layout; [`linger`]
//! says how consumers of perf and ring buffers wait, so that producers of a steady stream
//! make no system call.

pub mod array;
pub mod bloom_filter;
pub mod cgroup_array;
pub mod hash;
pub mod kernel;
pub mod linger;
pub mod lpm_trie;
pub mod map;
mod mem;
pub mod perf;
pub mod queue_stack;
pub mod ringbuf;
pub mod shm;
pub mod stack_trace;
mod sync;
pub mod types;

pub use map::{MAX_CPUS, MAX_MAP_FILE_SIZE, Map, check_spec};
pub use types::*;
