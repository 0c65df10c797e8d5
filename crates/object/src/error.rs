//! [`ObjectError`]: every refusal names the file and the section, symbol, map, extern or
//! relocation at fault.

use crate::btf::BtfError;
use thiserror::Error;

/// An object file that could not be loaded.
#[derive(Debug, Error)]
#[error("{file}: {kind}")]
pub struct ObjectError {
    /// The file name given to [`Object::parse`](crate::Object::parse) or the path opened.
    pub file: String,
    pub kind: ErrorKind,
}

impl ObjectError {
    pub fn new(file: impl Into<String>, kind: ErrorKind) -> ObjectError {
        ObjectError { file: file.into(), kind }
    }
}

/// What went wrong, and where.
#[derive(Debug, Error)]
pub enum ErrorKind {
    #[error("cannot read: {0}")]
    Io(#[from] std::io::Error),
    #[error("not an ELF file")]
    NotElf,
    #[error("not a 64-bit ELF file")]
    Not64Bit,
    #[error(
        "big-endian ELF object; only little-endian BPF objects are supported (compile with `clang -target bpf`, not bpfeb)"
    )]
    BigEndian,
    #[error("ELF machine is {machine} ({name}), not BPF ({bpf}); compile with `clang -target bpf`", bpf = crate::elf::EM_BPF)]
    WrongMachine { machine: u16, name: &'static str },
    #[error("ELF type {0} is not a relocatable object (ET_REL)")]
    NotRelocatable(u16),
    #[error("malformed ELF: {0}")]
    BadElf(String),
    #[error("section {section}: {msg}")]
    Section { section: String, msg: String },
    #[error("section {section}: relocation at instruction {insn} refers to symbol `{symbol}`, {msg}")]
    Relocation { section: String, insn: usize, symbol: String, msg: String },
    #[error("section {section}: program `{program}`: {msg}")]
    Program { section: String, program: String, msg: String },
    #[error("section {section}: map `{map}`: {msg}")]
    Map { section: String, map: String, msg: String },
    #[error("section {section}: {source}")]
    Btf { section: String, source: BtfError },
    #[error("section {section}: {what} need BTF, but the object has no .BTF section (compile with -g)")]
    MissingBtf { section: String, what: String },
    #[error("symbol `{symbol}`: {msg}")]
    Symbol { symbol: String, msg: String },
    #[error("extern `{name}`: {msg}")]
    Extern { name: String, msg: String },
    #[error("{0}")]
    Core(Box<CoreFailure>),
}

/// A CO-RE relocation that could not be applied.
#[derive(Debug, Error)]
#[error(
    "section {section}: CO-RE relocation #{index} ({kind}) at instruction {insn} for {type_name} access `{access}`: {msg}"
)]
pub struct CoreFailure {
    /// Code section of the instruction.
    pub section: String,
    /// Index of the relocation among the section's CO-RE records.
    pub index: usize,
    /// Instruction index in the section.
    pub insn: usize,
    /// libbpf's name of the relocation kind (`byte_off`, `field_exists`, ...).
    pub kind: &'static str,
    /// The local type, C-like (`struct task_struct`).
    pub type_name: String,
    /// The access string (`0:1:2`).
    pub access: String,
    pub msg: String,
}
