//! `userbpf asm` and `userbpf disasm`: between the conformance assembler syntax, hex text
//! and llvm-objdump's syntax.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use userbpf_isa::{asm::assemble, decode, disasm::disassemble, encode, parse_hex};

#[derive(Args)]
pub struct AsmArgs {
    /// Source in the bpf_conformance / uBPF assembler syntax ("-" for stdin).
    file: PathBuf,
}

#[derive(Args)]
pub struct DisasmArgs {
    /// Program as hex text, or raw bytes with --raw ("-" for stdin).
    file: PathBuf,
    /// The file holds raw instruction bytes instead of hex text.
    #[arg(long)]
    raw: bool,
}

fn read_input(path: &PathBuf) -> Result<Vec<u8>> {
    if path.as_os_str() == "-" {
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut v).context("reading stdin")?;
        Ok(v)
    } else {
        std::fs::read(path).with_context(|| format!("reading {}", path.display()))
    }
}

/// Prints the assembled program as hex text, the form `userbpf exec` reads.
pub fn asm(args: AsmArgs) -> Result<()> {
    let src =
        String::from_utf8(read_input(&args.file)?).with_context(|| format!("{} is not UTF-8", args.file.display()))?;
    let insns = assemble(&src).with_context(|| format!("{}", args.file.display()))?;
    let hex: Vec<String> = encode(&insns).iter().map(|b| format!("{b:02x}")).collect();
    for line in hex.chunks(8) {
        println!("{}", line.join(" "));
    }
    Ok(())
}

/// Prints the program as `llvm-objdump -d` would.
pub fn disasm(args: DisasmArgs) -> Result<()> {
    let data = read_input(&args.file)?;
    let bytes = if args.raw {
        data
    } else {
        let text = String::from_utf8(data).context("hex text is not UTF-8")?;
        parse_hex(&text).map_err(|e| anyhow::anyhow!("{}: {e}", args.file.display()))?
    };
    let insns = decode(&bytes).with_context(|| format!("{}", args.file.display()))?;
    print!("{}", disassemble(&insns));
    Ok(())
}
