//! Cache files: what one process of a user derived at some cost (libc's system call sites,
//! the kernel's `task_struct` layout) kept for the next process of the same user, usually
//! in `/dev/shm`. A reader trusts only a regular file (not a symbolic link) owned by its
//! effective user that nobody else may write; a writer writes the whole file under another
//! name and renames it, so readers see the old file or the new one, never a part. Callers
//! still check what they read: a cache is a hint, and a damaged one means "compute again".

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

/// The bytes of the cache file at `path`, or None: missing, not a regular file, a symbolic
/// link, another user's, writable by group or others, or unreadable.
pub fn read(path: &Path) -> Option<Vec<u8>> {
    let mut f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(path).ok()?;
    let m = f.metadata().ok()?;
    // SAFETY: geteuid has no preconditions.
    if !m.is_file() || m.uid() != unsafe { libc::geteuid() } || m.mode() & 0o022 != 0 {
        return None;
    }
    let mut data = Vec::new();
    f.read_to_end(&mut data).ok()?;
    Some(data)
}

/// Keeps `data` at `path` (mode 0600), best effort: written whole under a name of this
/// process's, then renamed over `path`; on any failure nothing is left behind.
pub fn write(path: &Path, data: &[u8]) {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .and_then(|mut f| f.write_all(data));
    if written.is_err() || std::fs::rename(&tmp, path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn only_private_regular_files_are_read_back() {
        let dir = std::env::temp_dir().join(format!("userbpf-cachefile-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c");
        assert_eq!(read(&path), None, "missing");
        write(&path, b"kept");
        assert_eq!(read(&path).as_deref(), Some(&b"kept"[..]));
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        write(&path, b"replaced");
        assert_eq!(read(&path).as_deref(), Some(&b"replaced"[..]));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o622)).unwrap();
        assert_eq!(read(&path), None, "writable by others");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let link = dir.join("link");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert_eq!(read(&link), None, "a symbolic link");
        assert_eq!(read(&dir), None, "a directory");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2, "no temporary file left");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
