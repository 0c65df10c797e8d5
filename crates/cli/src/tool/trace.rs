//! `userbpf tool trace SPEC...`: one line per call or return of user functions (BCC's trace).
//! A SPEC is `[p:|r:]BIN:FUNC [(FILTER)] ["FORMAT"[, ARG]...]`: `p:` (the default) at the
//! function's entry, `r:` at its return; FILTER is comparisons of `arg1`..`arg6` (entry) or
//! `retval` (return), optionally cast (`(int)retval`: an `int` function's -1 is 0xffffffff in
//! its 64-bit register), with integers (`==`, `!=`, `<`, `<=`, `>`, `>=`, signed 64-bit),
//! joined by `&&`; FORMAT is printf's (`%d %i %u %x %X %o %c %s %p`, with `h`, `hh`, `l`, `ll`, `z`,
//! flags `-` and `0`, a width), its ARGs `arg1`..`arg6` or `retval`.
//!
//! The eBPF side (tools/trace.bpf.c) is one program for entries and one for returns; the
//! link's cookie is the spec's index into the `probes` array, which holds its filter (checked
//! in the program: events that fail it cost no ring buffer record) and which values to read
//! as strings. The program records pid, tid, comm, the six argument registers or the return
//! value and up to three strings into a ring buffer; the front-end formats them.

use std::time::Duration;

use anyhow::{Context, Result, bail};

use super::{Common, Target, Tracer, conclude, match_functions, resolve_bin, split_spec};

#[derive(clap::Args)]
pub struct Args {
    /// Probes: `'BIN:FUNC "fmt %d", arg1'`, `'r:BIN:FUNC (retval < 0) "ret %d", retval'`.
    #[arg(required = true)]
    specs: Vec<String>,
    /// Stop after N events.
    #[arg(short = 'M', long = "max-events")]
    max_events: Option<u64>,
    #[command(flatten)]
    common: Common,
}

const MAX_PROBES: usize = 64;
const MAX_CONDS: usize = 4;
const MAX_STRS: usize = 3;
const STR_LEN: usize = 80;
const RETVAL: u8 = 7;
/// `struct event` of tools/trace.bpf.c.
const EVENT_SIZE: usize = 96 + MAX_STRS * STR_LEN;

/// A printf conversion.
#[derive(Debug, Clone, PartialEq)]
struct Conv {
    left: bool,
    zero: bool,
    width: usize,
    /// Bytes of the value: 1 (hh), 2 (h), 4 (none), 8 (l, ll, z).
    size: u8,
    kind: char,
}

#[derive(Debug, Clone, PartialEq)]
enum Piece {
    Lit(String),
    Conv(Conv),
}

/// A parsed SPEC.
#[derive(Debug, Clone, PartialEq)]
struct Probe {
    ret: bool,
    bin: String,
    func: String,
    /// The filter's comparisons (operand 1-6 argN, 7 retval), all of which must hold.
    conds: Vec<Cond>,
    format: Vec<Piece>,
    /// The operand of each conversion.
    args: Vec<u8>,
}

fn operand(name: &str) -> Option<u8> {
    match name {
        "retval" | "$retval" => Some(RETVAL),
        _ => name
            .strip_prefix("arg")
            .or_else(|| name.strip_prefix("$arg"))
            .and_then(|n| n.parse::<u8>().ok())
            .filter(|n| (1..=6).contains(n)),
    }
}

fn integer(s: &str) -> Option<i64> {
    let (neg, t) = match s.strip_prefix('-') {
        Some(t) => (true, t),
        None => (false, s),
    };
    let v = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16).ok()? as i64,
        None => t.parse::<i64>().ok()?,
    };
    Some(if neg { v.wrapping_neg() } else { v })
}

/// A comparison of the filter: `operand OP value`, the operand cast to `size` bytes first
/// (0: none), sign-extended when `signed`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Cond {
    operand: u8,
    /// 1 ==, 2 !=, 3 <, 4 <=, 5 >, 6 >=.
    op: u8,
    value: i64,
    size: u8,
    signed: bool,
}

/// A C cast in front of an operand (`(int)retval`): its size and signedness.
fn cast(name: &str) -> Option<(u8, bool)> {
    Some(match name.split_whitespace().collect::<Vec<_>>().join(" ").as_str() {
        "char" | "signed char" | "s8" | "i8" | "int8_t" | "__s8" => (1, true),
        "unsigned char" | "u8" | "uint8_t" | "__u8" | "bool" => (1, false),
        "short" | "s16" | "i16" | "int16_t" | "__s16" => (2, true),
        "unsigned short" | "u16" | "uint16_t" | "__u16" => (2, false),
        "int" | "s32" | "i32" | "int32_t" | "__s32" => (4, true),
        "unsigned" | "unsigned int" | "u32" | "uint32_t" | "__u32" => (4, false),
        "long" | "long long" | "s64" | "i64" | "int64_t" | "__s64" | "ssize_t" => (8, true),
        "unsigned long" | "unsigned long long" | "u64" | "uint64_t" | "__u64" | "size_t" => (8, false),
        _ => return None,
    })
}

/// An operand with an optional cast: `arg1`, `(int)retval`.
fn cast_operand(s: &str) -> Option<(u8, u8, bool)> {
    let s = s.trim();
    if let Some(rest) = s.strip_prefix('(') {
        let (ty, op) = rest.split_once(')')?;
        let (size, signed) = cast(ty.trim())?;
        return operand(op.trim()).map(|o| (o, size, signed));
    }
    operand(s).map(|o| (o, 0, true))
}

/// Whether `s` is one parenthesised whole: `(a < 1)`, not `(int)a < 1`.
fn wrapped(s: &str) -> bool {
    if !s.starts_with('(') || !s.ends_with(')') {
        return false;
    }
    let mut depth = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            _ => {}
        }
        if depth == 0 {
            return i == s.len() - 1;
        }
    }
    false
}

/// FILTER: `A OP B [&& A OP B]...`, one side an operand (with an optional cast such as
/// `(int)`), the other an integer. Comparisons are signed 64-bit, of the operand as it is in
/// its register, or cast first.
fn parse_filter(f: &str) -> Result<Vec<Cond>> {
    let mut out = Vec::new();
    for term in f.split("&&") {
        let mut term = term.trim();
        // Parentheses around the whole comparison (not a cast's).
        while wrapped(term) {
            term = term[1..term.len() - 1].trim();
        }
        let ops = [("==", 1u8), ("!=", 2), ("<=", 4), (">=", 6), ("<", 3), (">", 5)];
        let Some((at, sym, op)) = ops
            .iter()
            .filter_map(|&(sym, op)| term.find(sym).map(|at| (at, sym, op)))
            .min_by_key(|&(at, sym, _)| (at, usize::MAX - sym.len()))
        else {
            bail!(
                "filter `{term}`: expected a comparison (==, !=, <, <=, >, >=) of arg1..arg6 or retval with an integer"
            );
        };
        let (l, r) = (term[..at].trim(), term[at + sym.len()..].trim());
        let cond = match (cast_operand(l), integer(r), cast_operand(r), integer(l)) {
            (Some((o, size, signed)), Some(v), _, _) => Cond { operand: o, op, value: v, size, signed },
            // `10 < arg1` is `arg1 > 10`.
            (_, _, Some((o, size, signed)), Some(v)) => {
                Cond { operand: o, op: [0, 1, 2, 5, 6, 3, 4][op as usize], value: v, size, signed }
            }
            _ => bail!(
                "filter `{term}`: one side must be arg1..arg6 or retval (a cast such as (int) allowed), the other an integer (|| and other expressions are not supported)"
            ),
        };
        out.push(cond);
    }
    if out.len() > MAX_CONDS {
        bail!("filter `{f}`: at most {MAX_CONDS} comparisons");
    }
    Ok(out)
}

fn parse_format(f: &str) -> Result<Vec<Piece>> {
    let mut out = Vec::new();
    let mut lit = String::new();
    let mut it = f.chars().peekable();
    while let Some(c) = it.next() {
        if c != '%' {
            lit.push(c);
            continue;
        }
        if it.peek() == Some(&'%') {
            it.next();
            lit.push('%');
            continue;
        }
        let mut conv = Conv { left: false, zero: false, width: 0, size: 4, kind: 'd' };
        while let Some(&c) = it.peek() {
            match c {
                '-' => conv.left = true,
                '0' => conv.zero = true,
                _ => break,
            }
            it.next();
        }
        while let Some(d) = it.peek().and_then(|c| c.to_digit(10)) {
            conv.width = conv.width * 10 + d as usize;
            it.next();
        }
        let mut len = String::new();
        while let Some(&c) = it.peek().filter(|c| matches!(c, 'h' | 'l' | 'z')) {
            len.push(c);
            it.next();
        }
        conv.size = match len.as_str() {
            "" => 4,
            "h" => 2,
            "hh" => 1,
            "l" | "ll" | "z" => 8,
            _ => bail!("format `{f}`: length `{len}` is not one of h, hh, l, ll, z"),
        };
        conv.kind = match it.next() {
            Some(k @ ('d' | 'i' | 'u' | 'x' | 'X' | 'o' | 'c' | 's' | 'p')) => k,
            Some(k) => bail!("format `{f}`: conversion `%{k}` is not supported (d i u x X o c s p)"),
            None => bail!("format `{f}`: it ends inside a conversion"),
        };
        if !lit.is_empty() {
            out.push(Piece::Lit(std::mem::take(&mut lit)));
        }
        out.push(Piece::Conv(conv));
    }
    if !lit.is_empty() {
        out.push(Piece::Lit(lit));
    }
    Ok(out)
}

/// Reads a C string literal at the start of `s` (after its `"`): its text and the rest.
fn string_literal(s: &str) -> Result<(String, &str)> {
    let mut out = String::new();
    let mut it = s.char_indices();
    while let Some((i, c)) = it.next() {
        match c {
            '"' => return Ok((out, &s[i + 1..])),
            '\\' => match it.next() {
                Some((_, 'n')) => out.push('\n'),
                Some((_, 't')) => out.push('\t'),
                Some((_, c)) => out.push(c),
                None => break,
            },
            c => out.push(c),
        }
    }
    bail!("the format string `\"{s}` has no closing quote")
}

fn parse_probe(spec: &str) -> Result<Probe> {
    let s = spec.trim();
    let (ret, s) = match s.split_once(':') {
        Some(("r", rest)) => (true, rest),
        Some(("p", rest)) => (false, rest),
        _ => (false, s),
    };
    let end = s.find(|c: char| c.is_whitespace() || c == '(' || c == '"').unwrap_or(s.len());
    let (bin, func) = split_spec(&s[..end])?;
    let mut rest = s[end..].trim_start();
    let mut conds = Vec::new();
    if rest.starts_with('(') {
        let mut depth = 0;
        let close = rest
            .char_indices()
            .find(|&(_, c)| {
                depth += match c {
                    '(' => 1,
                    ')' => -1,
                    _ => 0,
                };
                depth == 0
            })
            .map(|(i, _)| i)
            .with_context(|| format!("`{spec}`: the filter has no closing parenthesis"))?;
        conds = parse_filter(&rest[1..close])?;
        rest = rest[close + 1..].trim_start();
    }
    let mut format = Vec::new();
    let mut args = Vec::new();
    if let Some(r) = rest.strip_prefix('"') {
        let (text, after) = string_literal(r)?;
        format = parse_format(&text)?;
        rest = after.trim_start();
        if let Some(a) = rest.strip_prefix(',') {
            for name in a.split(',') {
                let name = name.trim();
                args.push(
                    operand(name)
                        .with_context(|| format!("`{spec}`: argument `{name}` is not arg1..arg6 or retval"))?,
                );
            }
            rest = "";
        }
    }
    if !rest.is_empty() {
        bail!("`{spec}`: `{rest}` is not understood (expected [p:|r:]BIN:FUNC [(FILTER)] [\"FORMAT\"[, ARG]...])");
    }
    let convs = format.iter().filter(|p| matches!(p, Piece::Conv(_))).count();
    if convs != args.len() {
        bail!(
            "`{spec}`: the format has {convs} conversion{} but {} argument{} follow",
            if convs == 1 { "" } else { "s" },
            args.len(),
            if args.len() == 1 { "" } else { "s" }
        );
    }
    for &o in args.iter().chain(conds.iter().map(|c| &c.operand)) {
        if ret && o != RETVAL {
            bail!("`{spec}`: arg{o} is not known at a function's return (r:); use retval");
        }
        if !ret && o == RETVAL {
            bail!("`{spec}`: retval is known only at a function's return: write r:{bin}:{func}");
        }
    }
    let strs = format.iter().filter(|p| matches!(p, Piece::Conv(c) if c.kind == 's')).count();
    if strs > MAX_STRS {
        bail!("`{spec}`: at most {MAX_STRS} %s conversions");
    }
    Ok(Probe { ret, bin: bin.to_string(), func: func.to_string(), conds, format, args })
}

/// The `probes` entry (`struct probe_cfg`) of a probe.
fn config(p: &Probe) -> Vec<u8> {
    let mut v = vec![0u8; MAX_CONDS * 16 + 8];
    for (i, c) in p.conds.iter().enumerate() {
        v[i * 16] = c.operand;
        v[i * 16 + 1] = c.op;
        v[i * 16 + 2] = c.size;
        v[i * 16 + 3] = c.signed as u8;
        v[i * 16 + 8..i * 16 + 16].copy_from_slice(&c.value.to_ne_bytes());
    }
    let strs = p
        .format
        .iter()
        .filter_map(|x| if let Piece::Conv(c) = x { Some(c) } else { None })
        .zip(&p.args)
        .filter(|(c, _)| c.kind == 's')
        .map(|(_, &o)| o);
    for (i, o) in strs.enumerate() {
        v[MAX_CONDS * 16 + i] = o;
    }
    v
}

fn pad(s: String, c: &Conv) -> String {
    if s.len() >= c.width {
        return s;
    }
    let fill = c.width - s.len();
    if c.left {
        format!("{s}{}", " ".repeat(fill))
    } else if c.zero && c.kind != 's' && c.kind != 'c' {
        match s.strip_prefix('-') {
            Some(d) => format!("-{}{d}", "0".repeat(fill)),
            None => format!("{}{s}", "0".repeat(fill)),
        }
    } else {
        format!("{}{s}", " ".repeat(fill))
    }
}

/// The message of one event: the format applied to its values (`strs`: its strings, in
/// the order of the `%s` conversions).
fn message(p: &Probe, args: &[u64; 6], retval: u64, strs: &[String]) -> String {
    let mut out = String::new();
    let mut ops = p.args.iter();
    let mut next_str = strs.iter();
    for piece in &p.format {
        match piece {
            Piece::Lit(l) => out.push_str(l),
            Piece::Conv(c) => {
                let o = *ops.next().unwrap_or(&1);
                let raw = if o == RETVAL { retval } else { args[o as usize - 1] };
                let bits = c.size as u32 * 8;
                let unsigned = if bits == 64 { raw } else { raw & ((1u64 << bits) - 1) };
                let signed = if bits == 64 { raw as i64 } else { ((raw << (64 - bits)) as i64) >> (64 - bits) };
                let text = match c.kind {
                    'd' | 'i' => signed.to_string(),
                    'u' => unsigned.to_string(),
                    'x' => format!("{unsigned:x}"),
                    'X' => format!("{unsigned:X}"),
                    'o' => format!("{unsigned:o}"),
                    'c' => char::from(raw as u8).to_string(),
                    'p' => format!("{raw:#x}"),
                    _ => next_str.next().cloned().unwrap_or_default(),
                };
                out.push_str(&pad(text, c));
            }
        }
    }
    out
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_ne_bytes(x)
}

fn cstr(b: &[u8]) -> String {
    let n = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..n]).into_owned()
}

fn monotonic_ns() -> u64 {
    // SAFETY: clock_gettime writes only into the given timespec.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

pub fn run(args: Args) -> Result<()> {
    let target = Target::from(&args.common)?;
    let probes: Vec<Probe> = args.specs.iter().map(|s| parse_probe(s)).collect::<Result<_>>()?;
    if probes.len() > MAX_PROBES {
        bail!("at most {MAX_PROBES} probes at once");
    }
    let mut resolved = Vec::new();
    for p in &probes {
        let path = resolve_bin(&p.bin, target.pid())?;
        if super::is_glob(&p.func) {
            bail!(
                "`{}:{}`: trace takes one function per probe, not a pattern (try `userbpf tool calls`)",
                p.bin,
                p.func
            );
        }
        let f = match_functions(&path, &p.func)?.remove(0);
        resolved.push((path, f));
    }
    let mut tracer = Tracer::new("trace", target, args.common.interpreter)?;
    {
        let cfg = tracer.map("probes")?;
        for (i, p) in probes.iter().enumerate() {
            cfg.update_elem(&(i as u32).to_ne_bytes(), &config(p), 0)
                .with_context(|| format!("configuring probe {i}"))?;
        }
    }
    for (i, (p, (path, f))) in probes.iter().zip(&resolved).enumerate() {
        tracer.probe(if p.ret { "on_return" } else { "on_entry" }, p.ret, path, f, i as u64)?;
    }
    let start_ns = monotonic_ns();
    let userbpf_maps::Map::RingBuf(rb) = tracer.map("events")? else {
        bail!("the trace object's `events` map is not a ring buffer")
    };
    let mut consumer = userbpf_maps::ringbuf::RingBufConsumer::new(rb)?;
    let mut running = tracer.start()?;
    println!("{:<10} {:<7} {:<7} {:<16} {:<16} -", "TIME", "PID", "TID", "COMM", "FUNC");
    let printed = std::cell::Cell::new(0u64);
    let max = args.max_events;
    let mut on_event = |rec: &[u8]| {
        if rec.len() < EVENT_SIZE || max.is_some_and(|m| printed.get() >= m) {
            return;
        }
        let (ts, pid, tid, idx) = (u64_at(rec, 0), u32_at(rec, 8), u32_at(rec, 12), u32_at(rec, 16) as usize);
        let Some(p) = probes.get(idx) else { return };
        let comm = cstr(&rec[24..40]);
        let mut a = [0u64; 6];
        for (i, x) in a.iter_mut().enumerate() {
            *x = u64_at(rec, 40 + 8 * i);
        }
        let strs: Vec<String> = (0..MAX_STRS).map(|i| cstr(&rec[96 + i * STR_LEN..96 + (i + 1) * STR_LEN])).collect();
        let time = ts.saturating_sub(start_ns) as f64 / 1e9;
        println!("{time:<10.6} {pid:<7} {tid:<7} {comm:<16} {:<16} {}", p.func, message(p, &a, u64_at(rec, 88), &strs));
        printed.set(printed.get() + 1);
    };
    let end = running.run(
        &args.common,
        |d| {
            consumer.poll(d.max(Duration::from_millis(1)), &mut on_event)?;
            Ok(max.is_some_and(|m| printed.get() >= m))
        },
        || Ok(()),
    )?;
    let code = conclude(&mut tracer, &mut running, end);
    // What the command wrote before it ended.
    consumer.consume(&mut on_event)?;
    let lost = tracer.loaded.maps.iter().find(|m| m.def.name.ends_with(".bss")).map(|m| {
        let mut v = vec![0u8; m.map.value_buf_size()];
        let _ = m.map.lookup_elem(&0u32.to_ne_bytes(), &mut v);
        u64_at(&v, 0)
    });
    if let Some(lost) = lost.filter(|&l| l > 0) {
        eprintln!("userbpf: {lost} events lost (the ring buffer was full)");
    }
    if let Some(code) = code {
        drop(consumer);
        drop(tracer);
        std::process::exit(code);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_as_bcc_trace_reads_them() {
        let p = parse_probe(r#"/bin/x:work (arg1 > 10 && 5 >= arg2) "n=%d s=%s\n", arg1, arg2"#).unwrap();
        assert!(!p.ret);
        assert_eq!((p.bin.as_str(), p.func.as_str()), ("/bin/x", "work"));
        let c = |operand, op, value| Cond { operand, op, value, size: 0, signed: true };
        assert_eq!(p.conds, vec![c(1, 5, 10), c(2, 4, 5)]);
        assert_eq!(p.args, vec![1, 2]);
        let r = parse_probe(r#"r:c:malloc (retval == 0x10) "ret %lx", retval"#).unwrap();
        assert!(r.ret);
        assert_eq!(r.conds, vec![c(RETVAL, 1, 16)]);
        let r = parse_probe(r#"r:c:open ((int)retval < 0) "failed"#).unwrap_err();
        assert!(r.to_string().contains("no closing quote"), "{r}");
        let r = parse_probe(r#"r:c:open ((int)retval < 0 && (unsigned short) retval != 7)"#).unwrap();
        assert_eq!(
            r.conds,
            vec![
                Cond { operand: RETVAL, op: 3, value: 0, size: 4, signed: true },
                Cond { operand: RETVAL, op: 2, value: 7, size: 2, signed: false }
            ]
        );
        assert!(parse_probe("x:f ((float)arg1 > 1)").is_err());
        let r = parse_probe("r:x:f (((int)retval < 0) && (retval != 3))").unwrap();
        assert_eq!(r.conds.len(), 2);
        assert_eq!((r.conds[0].size, r.conds[1].size, r.conds[1].value), (4, 0, 3));
        assert_eq!(parse_probe("x:f").unwrap().format, vec![]);
        assert!(
            parse_probe(r#"r:x:f "%d", arg1"#).unwrap_err().to_string().contains("not known at a function's return")
        );
        assert!(parse_probe(r#"x:f "%d %d", arg1"#).unwrap_err().to_string().contains("2 conversions but 1 argument"));
        assert!(parse_probe(r#"x:f (arg1 > 1 || arg2 < 3)"#).is_err());
        assert!(parse_probe(r#"x:f "%q", arg1"#).unwrap_err().to_string().contains("%q"));
    }

    #[test]
    fn values_format_as_printf_does() {
        let p =
            parse_probe(r#"x:f "%d|%u|%5d|%-4x|%08lx|%hhd|%c|%s|%%", arg1, arg1, arg2, arg2, arg3, arg4, arg5, arg6"#)
                .unwrap();
        let args = [(-2i64) as u64, 42, 0xbeef, 0x1ff, b'A' as u64, 0];
        assert_eq!(message(&p, &args, 0, &["hi".to_string()]), "-2|4294967294|   42|2a  |0000beef|-1|A|hi|%");
    }
}
