//! The agent's shared library is linked with `-z initfirst` (`DF_1_INITFIRST`): the dynamic
//! loader runs its constructors before those of every other library loaded with it, so the
//! session's probes are in place before other libraries' initialisers run (libselinux's
//! `statfs` calls in every coreutils program, the allocations of C++ static initialisers), as
//! the kernel's probes see them. Cargo passes this to the cdylibs that link this crate too:
//! the syscall server's library is linked so as well (for the processes a loader starts, where
//! it acts as the agent). Such a constructor runs before libc's: see
//! `watcher::environ_before_libc` for what that changes.
//!
//! It is also linked with `-z keep-text-section-prefix`: the code a probe hit runs (the
//! functions marked `#[unsafe(link_section = ".text.hot.userbpf…")]`: the lean run, the
//! helpers and map operations programs call) is gathered in an output section of its own,
//! `.text.hot`, instead of lying among the rest of the library's 1.7 MiB of code. A hit on
//! a target's cold caches pays a translation and a fill for every page and line of code it
//! runs: sslsniff-bpfcc's read+write pair ran the agent's code on 13 pages, 5 since (see the
//! README's sslsniff section).

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,initfirst");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,keep-text-section-prefix");
    println!("cargo:rerun-if-changed=build.rs");
}
