//! The syscall server's error: the errno the loader gets, and why, in words.
//!
//! The reason is what libbpf would have from the kernel's verifier or BTF log: it is written
//! into the loader's `log_buf` where the kernel writes one (PROG_LOAD, BTF_LOAD) and printed
//! on stderr with each traced call when `USERBPF_TRACE_BPF` is set. An errno from a helper
//! that has no words for it converts with `?` (`From<i32>`), its reason empty.

use std::borrow::Cow;
use std::fmt;

/// A failed call: `errno`, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub errno: i32,
    pub reason: Cow<'static, str>,
}

/// The server's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// `errno` because of `reason`.
    pub fn new(errno: i32, reason: impl Into<Cow<'static, str>>) -> Error {
        Error { errno, reason: reason.into() }
    }

    /// `EINVAL` because of `reason`.
    pub fn inval(reason: impl Into<Cow<'static, str>>) -> Error {
        Error::new(libc::EINVAL, reason)
    }

    /// The same errno with `what` before the reason (`what: reason`, or `what` alone).
    pub fn context(self, what: impl fmt::Display) -> Error {
        let reason = if self.reason.is_empty() { what.to_string() } else { format!("{what}: {}", self.reason) };
        Error { errno: self.errno, reason: reason.into() }
    }
}

impl From<i32> for Error {
    fn from(errno: i32) -> Error {
        Error { errno, reason: Cow::Borrowed("") }
    }
}

impl From<Error> for i32 {
    fn from(e: Error) -> i32 {
        e.errno
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let os = std::io::Error::from_raw_os_error(self.errno);
        if self.reason.is_empty() { write!(f, "{os}") } else { write!(f, "{} ({os})", self.reason) }
    }
}

impl std::error::Error for Error {}

/// Adds context to an errno or an [`Error`]: `map_of_fd(fd).context(|| format!("map_fd {fd}"))`.
pub trait Context<T> {
    fn context<D: fmt::Display>(self, what: impl FnOnce() -> D) -> Result<T>;
}

impl<T, E: Into<Error>> Context<T> for std::result::Result<T, E> {
    fn context<D: fmt::Display>(self, what: impl FnOnce() -> D) -> Result<T> {
        self.map_err(|e| e.into().context(what()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_read_as_libbpf_would_print_them() {
        let e = Error::inval("map_flags 0x80000 unknown");
        assert_eq!(
            e.to_string(),
            format!("map_flags 0x80000 unknown ({})", std::io::Error::from_raw_os_error(libc::EINVAL))
        );
        let bare: Error = libc::EBADF.into();
        assert_eq!(bare.to_string(), std::io::Error::from_raw_os_error(libc::EBADF).to_string());
        let r: std::result::Result<(), i32> = Err(libc::EBADF);
        let e = r.context(|| "map_fd 7").unwrap_err();
        assert_eq!((e.errno, e.reason.as_ref()), (libc::EBADF, "map_fd 7"));
        assert_eq!(e.context("MAP_UPDATE_ELEM").reason, "MAP_UPDATE_ELEM: map_fd 7");
        assert_eq!(i32::from(Error::inval("x")), libc::EINVAL);
    }
}
