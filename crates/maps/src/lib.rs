//! eBPF maps in shared memory.
//!
//! Every map lives in one file (under /dev/shm in practice) mapped by every process that uses
//! it: the target running programs, the CLI reading them, loaders. Semantics follow the
//! kernel's (flags, errno values, max_entries, get_next_key while entries are deleted). The
//! hot path (lookup, update, delete from a program) takes no lock that can block, makes no
//! system call and allocates nothing.

pub mod shm;
pub mod types;

pub use types::*;
