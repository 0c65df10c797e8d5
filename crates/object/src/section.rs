//! Program kinds from section names, after libbpf's `section_defs` table.
//!
//! libbpf matches a section name against each definition in table order: a definition ending
//! in `+` matches the name itself or the name followed by `/anything`; one ending in `/` matches
//! any name starting with it; others match exactly. A leading `?` (libbpf: "do not autoload")
//! is stripped first. Sections matching nothing are [`ProgramKind::Unknown`].

/// Where a `uprobe/PATH:FUNC[+OFFSET]` section attaches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UprobeTarget {
    /// Binary or library path as written (libbpf resolves bare library names through the
    /// loader's search path at attach time; so should the runtime).
    pub path: String,
    /// Function symbol; `None` for `uprobe/PATH:0x1234` or `uprobe/PATH:+0x1234`, which name
    /// an offset only.
    pub func: Option<String>,
    /// Offset from the function (or from the start of the file when `func` is `None`).
    pub offset: u64,
}

/// Where a `usdt/PATH:PROVIDER:NAME` section attaches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsdtTarget {
    pub path: String,
    pub provider: String,
    pub name: String,
}

/// What a program is for, from its section name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProgramKind {
    /// `uprobe`, `uretprobe`, `uprobe.s`, `uretprobe.s`, optionally `/PATH:FUNC[+OFFSET]`.
    Uprobe { retprobe: bool, target: Option<UprobeTarget> },
    /// `usdt`, `usdt.s`, optionally `/PATH:PROVIDER:NAME`.
    Usdt { target: Option<UsdtTarget> },
    /// `tracepoint/CAT/NAME`, `tp/CAT/NAME` (and the `.s` forms). Bare `tp`/`tracepoint` give
    /// empty strings (no auto-attach, as in libbpf).
    Tracepoint { category: String, name: String },
    /// `raw_tracepoint/NAME`, `raw_tp/NAME` (and the `.s` forms); bare forms give "".
    RawTracepoint { name: String },
    /// A kernel program type recognised by name (kprobe, fentry, xdp, tc, cgroup/..., ...):
    /// `kind` is libbpf's section prefix (`kprobe`, `fentry`, `xdp`, `cgroup/connect4`).
    KernelOnly { kind: String },
    /// A section libbpf does not recognise (its `SEC("")` behaviour: the type must be given by
    /// the user). The section name is in [`ProgramSpec::section`](crate::ProgramSpec::section).
    Unknown,
}

impl ProgramKind {
    /// A short description for messages: `uprobe`, `tracepoint`, `kernel-only kprobe`, ...
    pub fn describe(&self) -> String {
        match self {
            ProgramKind::Uprobe { retprobe: false, .. } => "uprobe".into(),
            ProgramKind::Uprobe { retprobe: true, .. } => "uretprobe".into(),
            ProgramKind::Usdt { .. } => "usdt".into(),
            ProgramKind::Tracepoint { .. } => "tracepoint".into(),
            ProgramKind::RawTracepoint { .. } => "raw tracepoint".into(),
            ProgramKind::KernelOnly { kind } => format!("kernel-only {kind}"),
            ProgramKind::Unknown => "unknown".into(),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Class {
    Uprobe { ret: bool },
    Usdt,
    Tracepoint,
    RawTp,
    Kernel,
}

/// libbpf's definitions (1.1 plus later additions), in libbpf's order, with whether the
/// program is sleepable.
const DEFS: &[(&str, Class, bool)] = {
    use Class::*;
    &[
        ("socket", Kernel, false),
        ("sk_reuseport/migrate", Kernel, false),
        ("sk_reuseport", Kernel, false),
        ("kprobe+", Kernel, false),
        ("uprobe+", Uprobe { ret: false }, false),
        ("uprobe.s+", Uprobe { ret: false }, true),
        // userbpf's extension: a uprobe that may write the argument registers (see
        // `writable_args`); not in libbpf's table.
        ("uprobe.w+", Uprobe { ret: false }, false),
        ("kretprobe+", Kernel, false),
        ("uretprobe+", Uprobe { ret: true }, false),
        ("uretprobe.s+", Uprobe { ret: true }, true),
        ("kprobe.multi+", Kernel, false),
        ("kretprobe.multi+", Kernel, false),
        ("kprobe.session+", Kernel, false),
        ("uprobe.multi+", Kernel, false),
        ("uretprobe.multi+", Kernel, false),
        ("uprobe.session+", Kernel, false),
        ("uprobe.multi.s+", Kernel, true),
        ("uretprobe.multi.s+", Kernel, true),
        ("uprobe.session.s+", Kernel, true),
        ("ksyscall+", Kernel, false),
        ("kretsyscall+", Kernel, false),
        ("usdt+", Usdt, false),
        ("usdt.s+", Usdt, true),
        ("tc/ingress", Kernel, false),
        ("tc/egress", Kernel, false),
        ("tcx/ingress", Kernel, false),
        ("tcx/egress", Kernel, false),
        ("tc", Kernel, false),
        ("classifier", Kernel, false),
        ("action", Kernel, false),
        ("netkit/primary", Kernel, false),
        ("netkit/peer", Kernel, false),
        ("tracepoint+", Tracepoint, false),
        ("tp+", Tracepoint, false),
        ("tracepoint.s+", Tracepoint, true),
        ("tp.s+", Tracepoint, true),
        ("raw_tracepoint+", RawTp, false),
        ("raw_tp+", RawTp, false),
        ("raw_tracepoint.s+", RawTp, true),
        ("raw_tp.s+", RawTp, true),
        ("raw_tracepoint.w+", Kernel, false),
        ("raw_tp.w+", Kernel, false),
        ("tp_btf+", Kernel, false),
        ("tp_btf.s+", Kernel, true),
        ("fentry+", Kernel, false),
        ("fmod_ret+", Kernel, false),
        ("fexit+", Kernel, false),
        ("fentry.s+", Kernel, true),
        ("fmod_ret.s+", Kernel, true),
        ("fexit.s+", Kernel, true),
        ("fsession+", Kernel, false),
        ("fsession.s+", Kernel, true),
        ("freplace+", Kernel, false),
        ("lsm+", Kernel, false),
        ("lsm.s+", Kernel, true),
        ("lsm_cgroup+", Kernel, false),
        ("iter+", Kernel, false),
        ("iter.s+", Kernel, true),
        ("syscall", Kernel, true),
        ("xdp.frags/devmap", Kernel, false),
        ("xdp/devmap", Kernel, false),
        ("xdp.frags/cpumap", Kernel, false),
        ("xdp/cpumap", Kernel, false),
        ("xdp.frags", Kernel, false),
        ("xdp", Kernel, false),
        ("perf_event", Kernel, false),
        ("lwt_in", Kernel, false),
        ("lwt_out", Kernel, false),
        ("lwt_xmit", Kernel, false),
        ("lwt_seg6local", Kernel, false),
        ("sockops", Kernel, false),
        ("sk_skb/stream_parser", Kernel, false),
        ("sk_skb/stream_verdict", Kernel, false),
        ("sk_skb/verdict", Kernel, false),
        ("sk_skb", Kernel, false),
        ("sk_msg", Kernel, false),
        ("lirc_mode2", Kernel, false),
        ("flow_dissector", Kernel, false),
        ("cgroup_skb/ingress", Kernel, false),
        ("cgroup_skb/egress", Kernel, false),
        ("cgroup/skb", Kernel, false),
        ("cgroup/sock_create", Kernel, false),
        ("cgroup/sock_release", Kernel, false),
        ("cgroup/sock", Kernel, false),
        ("cgroup/post_bind4", Kernel, false),
        ("cgroup/post_bind6", Kernel, false),
        ("cgroup/bind4", Kernel, false),
        ("cgroup/bind6", Kernel, false),
        ("cgroup/connect4", Kernel, false),
        ("cgroup/connect6", Kernel, false),
        ("cgroup/connect_unix", Kernel, false),
        ("cgroup/sendmsg4", Kernel, false),
        ("cgroup/sendmsg6", Kernel, false),
        ("cgroup/sendmsg_unix", Kernel, false),
        ("cgroup/recvmsg4", Kernel, false),
        ("cgroup/recvmsg6", Kernel, false),
        ("cgroup/recvmsg_unix", Kernel, false),
        ("cgroup/getpeername4", Kernel, false),
        ("cgroup/getpeername6", Kernel, false),
        ("cgroup/getpeername_unix", Kernel, false),
        ("cgroup/getsockname4", Kernel, false),
        ("cgroup/getsockname6", Kernel, false),
        ("cgroup/getsockname_unix", Kernel, false),
        ("cgroup/sysctl", Kernel, false),
        ("cgroup/getsockopt", Kernel, false),
        ("cgroup/setsockopt", Kernel, false),
        ("cgroup/dev", Kernel, false),
        ("struct_ops+", Kernel, false),
        ("struct_ops.s+", Kernel, true),
        ("sk_lookup", Kernel, false),
        ("netfilter", Kernel, false),
    ]
};

fn def_matches(def: &str, name: &str) -> bool {
    if def.ends_with('/') {
        return name.starts_with(def);
    }
    if let Some(base) = def.strip_suffix('+') {
        return match name.strip_prefix(base) {
            Some(rest) => rest.is_empty() || rest.starts_with('/'),
            None => false,
        };
    }
    name == def
}

/// Whether a section is a userbpf `uprobe.w` section (`SEC("uprobe.w/PATH:FUNC")`): a
/// uprobe program that may store into the argument registers of its `struct pt_regs`, a
/// userbpf extension spelled as libbpf spells writable raw tracepoints (`raw_tp.w`). A
/// leading `?` is ignored. libbpf does not know the section: a libbpf loader registers it
/// (`include/userbpf/libbpf.h`), which asks `userbpf load` for it with a `prog_flags` bit.
pub fn writable_args(section: &str) -> bool {
    def_matches("uprobe.w+", section.strip_prefix('?').unwrap_or(section))
}

/// The result of classifying a section name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SectionClass {
    pub kind: ProgramKind,
    pub sleepable: bool,
}

/// Classifies a program section name (without the `?` prefix). Errors describe malformed
/// targets (`uprobe/PATH` without `:FUNC`, `usdt/` with fewer than three parts, ...).
pub fn classify(name: &str) -> Result<SectionClass, String> {
    let Some(&(def, class, sleepable)) = DEFS.iter().find(|(d, _, _)| def_matches(d, name)) else {
        return Ok(SectionClass { kind: ProgramKind::Unknown, sleepable: false });
    };
    let base = def.trim_end_matches('+');
    // What follows "base/" (None for the bare name).
    let extra = name.strip_prefix(base).and_then(|r| r.strip_prefix('/'));
    let kind = match class {
        Class::Kernel => ProgramKind::KernelOnly { kind: base.to_string() },
        Class::Uprobe { ret } => {
            ProgramKind::Uprobe { retprobe: ret, target: extra.map(|e| parse_uprobe(e, ret)).transpose()? }
        }
        Class::Usdt => ProgramKind::Usdt { target: extra.map(parse_usdt).transpose()? },
        Class::Tracepoint => match extra {
            None => ProgramKind::Tracepoint { category: String::new(), name: String::new() },
            Some(e) => {
                let (cat, tp) = e
                    .split_once('/')
                    .filter(|(c, n)| !c.is_empty() && !n.is_empty())
                    .ok_or_else(|| format!("expected SEC(\"{base}/<category>/<name>\")"))?;
                ProgramKind::Tracepoint { category: cat.to_string(), name: tp.to_string() }
            }
        },
        Class::RawTp => ProgramKind::RawTracepoint { name: extra.unwrap_or("").to_string() },
    };
    Ok(SectionClass { kind, sleepable })
}

fn parse_number(s: &str) -> Option<u64> {
    // strtol's %li: decimal, 0x hex, or leading-0 octal.
    if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        u64::from_str_radix(h, 16).ok()
    } else if s.len() > 1 && s.starts_with('0') {
        u64::from_str_radix(&s[1..], 8).ok()
    } else {
        s.parse().ok()
    }
}

fn parse_uprobe(spec: &str, ret: bool) -> Result<UprobeTarget, String> {
    let Some((path, func_spec)) = spec.split_once(':') else {
        return Err("missing ':function[+offset]' specification".into());
    };
    if path.is_empty() || func_spec.is_empty() {
        return Err("expected SEC(\"uprobe/<path>:<function>[+<offset>]\")".into());
    }
    let (func, offset) = match func_spec.rfind('+').and_then(|i| parse_number(&func_spec[i + 1..]).map(|o| (i, o))) {
        Some((i, off)) => (&func_spec[..i], off),
        None => match parse_number(func_spec) {
            // A bare number: an offset in the file, no function.
            Some(off) => ("", off),
            None => (func_spec, 0),
        },
    };
    if ret && offset != 0 {
        return Err("uretprobes do not support offset specification".into());
    }
    Ok(UprobeTarget {
        path: path.to_string(),
        func: if func.is_empty() { None } else { Some(func.to_string()) },
        offset,
    })
}

fn parse_usdt(spec: &str) -> Result<UsdtTarget, String> {
    let parts: Vec<&str> = spec.split(':').collect();
    match parts.as_slice() {
        [path, provider, name] if !path.is_empty() && !provider.is_empty() && !name.is_empty() => {
            Ok(UsdtTarget { path: path.to_string(), provider: provider.to_string(), name: name.to_string() })
        }
        _ => Err("expected SEC(\"usdt/<path>:<provider>:<name>\")".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(name: &str) -> ProgramKind {
        classify(name).unwrap().kind
    }

    #[test]
    fn writable_uprobes() {
        assert_eq!(
            k("uprobe.w/./a.out:f"),
            ProgramKind::Uprobe {
                retprobe: false,
                target: Some(UprobeTarget { path: "./a.out".into(), func: Some("f".into()), offset: 0 })
            }
        );
        assert!(writable_args("uprobe.w/./a.out:f"));
        assert!(writable_args("?uprobe.w"));
        assert!(!writable_args("uprobe/./a.out:f"));
        assert!(!writable_args("uprobe.wx/a:f"));
        assert!(!writable_args("uretprobe.w/a:f"));
        assert_eq!(k("uretprobe.w/a:f"), ProgramKind::Unknown);
    }

    #[test]
    fn uprobes() {
        assert_eq!(k("uprobe"), ProgramKind::Uprobe { retprobe: false, target: None });
        assert_eq!(k("uretprobe.s"), ProgramKind::Uprobe { retprobe: true, target: None });
        assert!(classify("uprobe.s").unwrap().sleepable);
        assert_eq!(
            k("uprobe//usr/lib/libc.so.6:malloc+0x10"),
            ProgramKind::Uprobe {
                retprobe: false,
                target: Some(UprobeTarget {
                    path: "/usr/lib/libc.so.6".into(),
                    func: Some("malloc".into()),
                    offset: 16
                })
            }
        );
        assert_eq!(
            k("uprobe/./a.out:0x1234"),
            ProgramKind::Uprobe {
                retprobe: false,
                target: Some(UprobeTarget { path: "./a.out".into(), func: None, offset: 0x1234 })
            }
        );
        assert!(classify("uprobe/bin").is_err());
        assert!(classify("uretprobe/bin:f+4").is_err());
        // Not a uprobe: "uprobex" is no match for "uprobe+".
        assert_eq!(k("uprobex"), ProgramKind::Unknown);
    }

    /// libbpf 1.1's `section_defs`, in its order: each name (with a target where the
    /// definition takes one) is recognised, as libbpf recognises it.
    #[test]
    fn every_libbpf_1_1_section_is_recognised() {
        const LIBBPF_1_1: &[&str] = &[
            "socket",
            "sk_reuseport/migrate",
            "sk_reuseport",
            "kprobe+",
            "uprobe+",
            "uprobe.s+",
            "kretprobe+",
            "uretprobe+",
            "uretprobe.s+",
            "kprobe.multi+",
            "kretprobe.multi+",
            "ksyscall+",
            "kretsyscall+",
            "usdt+",
            "tc",
            "classifier",
            "action",
            "tracepoint+",
            "tp+",
            "raw_tracepoint+",
            "raw_tp+",
            "raw_tracepoint.w+",
            "raw_tp.w+",
            "tp_btf+",
            "fentry+",
            "fmod_ret+",
            "fexit+",
            "fentry.s+",
            "fmod_ret.s+",
            "fexit.s+",
            "freplace+",
            "lsm+",
            "lsm.s+",
            "lsm_cgroup+",
            "iter+",
            "iter.s+",
            "syscall",
            "xdp.frags/devmap",
            "xdp/devmap",
            "xdp.frags/cpumap",
            "xdp/cpumap",
            "xdp.frags",
            "xdp",
            "perf_event",
            "lwt_in",
            "lwt_out",
            "lwt_xmit",
            "lwt_seg6local",
            "sockops",
            "sk_skb/stream_parser",
            "sk_skb/stream_verdict",
            "sk_skb",
            "sk_msg",
            "lirc_mode2",
            "flow_dissector",
            "cgroup_skb/ingress",
            "cgroup_skb/egress",
            "cgroup/skb",
            "cgroup/sock_create",
            "cgroup/sock_release",
            "cgroup/sock",
            "cgroup/post_bind4",
            "cgroup/post_bind6",
            "cgroup/bind4",
            "cgroup/bind6",
            "cgroup/connect4",
            "cgroup/connect6",
            "cgroup/sendmsg4",
            "cgroup/sendmsg6",
            "cgroup/recvmsg4",
            "cgroup/recvmsg6",
            "cgroup/getpeername4",
            "cgroup/getpeername6",
            "cgroup/getsockname4",
            "cgroup/getsockname6",
            "cgroup/sysctl",
            "cgroup/getsockopt",
            "cgroup/setsockopt",
            "cgroup/dev",
            "struct_ops+",
            "sk_lookup",
        ];
        for def in LIBBPF_1_1 {
            let (base, with_target) = match def.strip_suffix('+') {
                Some(b) => (b, true),
                None => (*def, false),
            };
            let mut names = vec![base.to_string()];
            if with_target {
                names.push(match base {
                    "uprobe" | "uprobe.s" | "uretprobe" | "uretprobe.s" => format!("{base}/bin:func"),
                    "usdt" => format!("{base}/bin:prov:name"),
                    "tracepoint" | "tp" => format!("{base}/cat/name"),
                    _ => format!("{base}/target"),
                });
            }
            for n in names {
                let c = classify(&n).unwrap_or_else(|e| panic!("{n}: {e}"));
                assert_ne!(c.kind, ProgramKind::Unknown, "{n}");
                let user = matches!(
                    c.kind,
                    ProgramKind::Uprobe { .. }
                        | ProgramKind::Usdt { .. }
                        | ProgramKind::Tracepoint { .. }
                        | ProgramKind::RawTracepoint { .. }
                );
                let want_user = ["uprobe", "uretprobe", "usdt", "tracepoint", "tp", "raw_tracepoint", "raw_tp"]
                    .contains(&base.trim_end_matches(".s"));
                assert_eq!(user, want_user, "{n}: {:?}", c.kind);
                assert_eq!(c.sleepable, base.ends_with(".s") || base == "syscall", "{n}");
            }
        }
    }

    #[test]
    fn others() {
        assert_eq!(
            k("tp/syscalls/sys_enter_openat"),
            ProgramKind::Tracepoint { category: "syscalls".into(), name: "sys_enter_openat".into() }
        );
        assert!(classify("tracepoint/foo").is_err());
        assert_eq!(k("raw_tp/sys_enter"), ProgramKind::RawTracepoint { name: "sys_enter".into() });
        assert_eq!(k("raw_tp.w/x"), ProgramKind::KernelOnly { kind: "raw_tp.w".into() });
        assert_eq!(k("kprobe/do_sys_open"), ProgramKind::KernelOnly { kind: "kprobe".into() });
        assert_eq!(k("xdp"), ProgramKind::KernelOnly { kind: "xdp".into() });
        assert_eq!(k("xdp/foo"), ProgramKind::Unknown);
        assert_eq!(k("cgroup/connect4"), ProgramKind::KernelOnly { kind: "cgroup/connect4".into() });
        assert_eq!(
            k("usdt/./bin:prov:probe"),
            ProgramKind::Usdt {
                target: Some(UsdtTarget { path: "./bin".into(), provider: "prov".into(), name: "probe".into() })
            }
        );
        assert!(classify("usdt/bin:prov").is_err());
        assert_eq!(k("my_custom"), ProgramKind::Unknown);
    }
}
