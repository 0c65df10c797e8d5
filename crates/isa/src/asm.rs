//! Assembler for the bpf_conformance / uBPF syntax. (placeholder, being written)
