//! ELF files on disk as probes need them, without the hook engine: function symbols
//! ([`symbols`]) and USDT notes with their argument specifications ([`usdt`]). The CLI checks
//! probe targets with it before a process runs; the hook engine resolves them in a process.

pub mod symbols;
pub mod usdt;
