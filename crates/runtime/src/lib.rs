//! userbpf's runtime: sessions (programs, maps and links in shared memory), the helpers with
//! the kernel's ids and semantics, and programs loaded from objects.

pub mod context;
pub mod session;

pub use session::{MapRecord, ProgRecord, Session, SessionError};
