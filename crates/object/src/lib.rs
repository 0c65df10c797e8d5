//! eBPF object loader (being written).
