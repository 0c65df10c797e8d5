//! The loader's descriptors that are ours: each object is a file in the session directory,
//! and a descriptor is ours when `fstat` finds its (device, inode) in this table, so `dup`,
//! `fcntl(F_DUPFD)`, `close` and `fork` need no interposing.
