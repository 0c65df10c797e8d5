//! The agent's shared library is linked with `-z initfirst` (`DF_1_INITFIRST`): the dynamic
//! loader runs its constructors before those of every other library loaded with it, so the
//! session's probes are in place before other libraries' initialisers run (libselinux's
//! `statfs` calls in every coreutils program, the allocations of C++ static initialisers), as
//! the kernel's probes see them. Cargo passes this to the cdylibs that link this crate too:
//! the syscall server's library is linked so as well (for the processes a loader starts, where
//! it acts as the agent). Such a constructor runs before libc's: see
//! `watcher::environ_before_libc` for what that changes.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,initfirst");
    println!("cargo:rerun-if-changed=build.rs");
}
