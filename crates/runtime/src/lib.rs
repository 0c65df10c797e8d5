//! userbpf's runtime: sessions (programs, maps and links in shared memory), the helpers with
//! the kernel's ids and semantics, and programs loaded from objects.

pub mod context;
pub mod control;
pub mod crash;
pub mod helpers;
pub mod kernel_map;
pub mod loader;
pub mod own_work;
pub mod prog_stats;
pub mod program;
pub mod program_table;
pub mod session;
pub mod verify;

pub use loader::{LoadObjectError, LoadedObject, load_object};
pub use program::{Engine, LoadedProgram};
pub use session::{LinkRecord, MapRecord, ProgRecord, Session, SessionError};
