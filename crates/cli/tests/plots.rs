//! `--svg FILE`: the charts are valid SVG (parsed as XML) with one bar per non-empty bucket,
//! panel by panel: `map dump --svg` of histogram maps holding known counts (an array, and
//! one histogram per key: libbpf-tools' `slots` values, a `slot` member in the key),
//! `tool funclatency --svg` and `tool calls --svg` on the target with known calls
//! (tests/targets/tool_target.c: per round of N, tt_alpha N times, tt_beta 2N, tt_gamma 3N,
//! tt_greet N), `tool iolatency --svg` on a loop device, `tool aiocost --svg`'s times and
//! shares for the three interfaces; a path that cannot be written and a
//! map that is not a histogram are clear errors, before any tracing.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;

use common::{here, repo, tmp, userbpf};
use userbpf_plot::series_fill;

fn shm_dir() -> PathBuf {
    let d = tmp().join(format!("plots-shm-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The tools' objects, built from tools/*.bpf.c (and iolatency's example) once per test binary.
fn tools_dir() -> PathBuf {
    static ONCE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    ONCE.get_or_init(|| {
        let dir = tmp().join("plots-objects");
        for t in ["funclatency", "calls", "aiocost"] {
            userbpf_testutil::compile_bpf(&repo(&format!("tools/{t}.bpf.c")), &dir);
        }
        userbpf_testutil::compile_c(&repo("tools/aiocost/aiobench.c"), &dir.join("aiobench"), &["-luring", "-laio"]);
        userbpf_testutil::compile_bpf(&repo("examples/bpf/iolatency.bpf.c"), &dir);
        dir
    })
    .clone()
}

fn target() -> PathBuf {
    static ONCE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    ONCE.get_or_init(|| {
        userbpf_testutil::compile_c(&here("targets/tool_target.c"), &tmp().join("plots/tool_target"), &[])
    })
    .clone()
}

fn tool(args: &[&str]) -> Output {
    Command::new(userbpf())
        .arg("tool")
        .args(args)
        .env("USERBPF_TOOLS_DIR", tools_dir())
        .env("USERBPF_SHM_DIR", shm_dir())
        .output()
        .unwrap()
}

fn ok(args: &[&str], out: Output) -> String {
    let (so, se) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "userbpf {args:?} failed ({:?})\n--- stdout ---\n{so}\n--- stderr ---\n{se}",
        out.status
    );
    so.into_owned()
}

fn svg_file(name: &str) -> PathBuf {
    let d = tmp().join("plots-svg");
    std::fs::create_dir_all(&d).unwrap();
    let p = d.join(name);
    let _ = std::fs::remove_file(&p);
    p
}

/// A panel: its title, its bars, its other texts.
type Panel = (String, usize, Vec<String>);

/// A chart file's panels in document order: (title, bars, the other texts of the panel, top
/// to bottom as drawn).
/// A panel starts at a text for which `is_title` holds; bars are `<rect>`s filled with a
/// series colour (a legend's swatches too: one per series when there are several).
fn panels(path: &Path, is_title: impl Fn(&str) -> bool) -> Vec<Panel> {
    let doc = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let xml = roxmltree::Document::parse(&doc).unwrap_or_else(|e| panic!("{} is not XML: {e}\n{doc}", path.display()));
    let root = xml.root_element();
    assert_eq!(root.tag_name().name(), "svg", "{doc}");
    assert_eq!(root.tag_name().namespace(), Some("http://www.w3.org/2000/svg"), "{doc}");
    let fills: Vec<String> = (0..userbpf_plot::SERIES_COLORS.len()).map(series_fill).collect();
    // Texts with their y, sorted once the panel is complete.
    type Drawn = (String, usize, Vec<(f64, String)>);
    let mut out: Vec<Drawn> = Vec::new();
    for n in xml.descendants() {
        if n.has_tag_name("text") {
            let t = n.text().unwrap_or("").trim().to_string();
            let y: f64 = n.attribute("y").and_then(|y| y.parse().ok()).unwrap_or(0.0);
            if is_title(&t) {
                out.push((t, 0, Vec::new()));
            } else if let Some(p) = out.last_mut() {
                p.2.push((y, t));
            }
        } else if n.has_tag_name("rect") && n.attribute("fill").is_some_and(|f| fills.iter().any(|x| x == f)) {
            let p = out.last_mut().unwrap_or_else(|| panic!("a bar before any title in {doc}"));
            p.1 += 1;
        }
    }
    out.into_iter()
        .map(|(t, b, mut texts)| {
            texts.sort_by(|a, b| a.0.total_cmp(&b.0));
            (t, b, texts.into_iter().map(|(_, t)| t).collect())
        })
        .collect()
}

/// funclatency's histograms from its text: (header, non-empty buckets, count).
fn text_hists(out: &str) -> Vec<(String, usize, u64)> {
    let mut v: Vec<(String, usize, u64)> = Vec::new();
    for line in out.lines() {
        if line.starts_with('@') && line.ends_with(':') {
            v.push((line.trim_end_matches(':').to_string(), 0, 0));
        } else if line.starts_with('[') {
            let c: u64 = line.split_whitespace().find_map(|w| w.parse().ok()).unwrap();
            let h = v.last_mut().unwrap();
            h.1 += (c > 0) as usize;
            h.2 += c;
        }
    }
    v
}

#[test]
fn funclatency_draws_a_bar_per_non_empty_bucket_of_each_histogram() {
    let t = target().display().to_string();
    let file = svg_file("funclatency.svg");
    let spec = format!("{t}:tt_*");
    let args = ["funclatency", "-F", "--svg", file.to_str().unwrap(), &spec, "--", &t, "100", "20"];
    let out = ok(&args, tool(&args));
    let text = text_hists(&out);
    let want: Vec<(&str, u64)> =
        vec![("@nsecs[tt_alpha]", 120), ("@nsecs[tt_beta]", 240), ("@nsecs[tt_gamma]", 360), ("@nsecs[tt_greet]", 120)];
    assert_eq!(text.iter().map(|h| (h.0.as_str(), h.2)).collect::<Vec<_>>(), want, "{out}");
    let svg = panels(&file, |s| s.starts_with("tool_target:tt_*"));
    assert_eq!(svg.len(), 4, "{svg:?}");
    for ((title, bars, labels), (header, buckets, count)) in svg.iter().zip(&text) {
        assert!(title.starts_with(&format!("tool_target:tt_* {header}: {count} calls, avg ")), "{title} vs {header}");
        assert_eq!(bars, buckets, "{title}: bars vs the text's non-empty buckets\n{out}");
        assert!(labels.iter().any(|l| l == "nsecs") && labels.iter().any(|l| l == "count"), "{labels:?}");
        assert!(labels.iter().any(|l| l.starts_with('[') && l.ends_with(')')), "no bucket range in {labels:?}");
    }
}

#[test]
fn calls_draws_the_top_functions_with_their_counts() {
    let t = target().display().to_string();
    let file = svg_file("calls.svg");
    let spec = format!("{t}:tt_*");
    let args = ["calls", "-n", "3", "--svg", file.to_str().unwrap(), &spec, "--", &t, "50"];
    ok(&args, tool(&args));
    let svg = panels(&file, |s| s.starts_with("calls "));
    assert_eq!(svg.len(), 1, "{svg:?}");
    let (title, bars, labels) = &svg[0];
    assert_eq!(title, "calls tool_target:tt_*: top 3 of 4 functions called (-n shows more)");
    assert_eq!(*bars, 3);
    // Most called first: tt_gamma 150, tt_beta 100, then tt_alpha 50 (tt_greet's 50 ties and sorts after).
    for want in ["tt_gamma", "tt_beta", "tt_alpha", "150", "100", "50"] {
        assert!(labels.iter().any(|l| l == want), "no {want:?} in {labels:?}");
    }
    assert!(!labels.iter().any(|l| l == "tt_greet"), "{labels:?}");
}

#[test]
fn a_path_that_cannot_be_written_fails_before_tracing() {
    let t = target().display().to_string();
    let spec = format!("{t}:tt_alpha");
    for name in ["funclatency", "calls", "iolatency", "aiocost"] {
        let args: Vec<&str> = match name {
            "iolatency" => vec![name, "--svg", "/nonexistent-dir/x.svg", "--", &t, "1"],
            "aiocost" => vec![name, "--svg", "/nonexistent-dir/x.svg", "--no-kernel"],
            _ => vec![name, "--svg", "/nonexistent-dir/x.svg", &spec, "--", &t, "1"],
        };
        let out = tool(&args);
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("userbpf: cannot write SVG file /nonexistent-dir/x.svg: No such file or directory"),
            "{args:?}: {err}"
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(!stdout.contains("Tracing") && !stdout.contains("aiocost:"), "{args:?} ran before failing: {stdout}");
    }
}

/// A session NAME in the tests' shared-memory directory (returned) with the object of the eBPF
/// C file `src` loaded into it (JIT), as a loader holds it while `userbpf map dump` reads it.
fn session_with(src: &Path, name: &str) -> (PathBuf, userbpf_runtime::Session, userbpf_runtime::loader::LoadedObject) {
    let dir = shm_dir();
    // SAFETY: (of the environment change) the tests of this binary that open sessions
    // in-process all set the same value.
    unsafe { std::env::set_var("USERBPF_SHM_DIR", &dir) };
    let session = userbpf_runtime::Session::open(name).unwrap();
    let slots = Arc::new(userbpf_runtime::context::CpuSlots::open(&session.layout().cpus()).unwrap());
    let obj = userbpf_testutil::compile_bpf(src, &tmp().join("plots-bpf"));
    let object = userbpf_object::Object::open(&obj).unwrap();
    let opts = userbpf_runtime::loader::LoadOptions {
        engine: userbpf_runtime::Engine::Jit,
        helpers: userbpf_runtime::helpers::registry(),
        only: None,
    };
    let loaded = userbpf_runtime::load_object(&session, object, &opts, slots).unwrap();
    (dir, session, loaded)
}

#[test]
fn map_dump_draws_a_known_histogram_map() {
    let (dir, session, loaded) = session_with(&repo("examples/bpf/latency.bpf.c"), "plots-held");
    // The per-CPU histogram: slot 3 (values 8..15) 5 on CPU 0, slot 4 7+1 over two CPUs,
    // slot 10 ([1K, 2K)) 2; slots 5..9 empty inside the range.
    let hist = &loaded.map("hist").unwrap().map;
    let cpus = hist.nr_cpus() as usize;
    let set = |slot: u32, per_cpu: &[u64]| {
        let mut v = vec![0u8; hist.value_buf_size()];
        for (c, n) in per_cpu.iter().enumerate().take(cpus) {
            v[c * 8..c * 8 + 8].copy_from_slice(&n.to_ne_bytes());
        }
        hist.update_elem(&slot.to_ne_bytes(), &v, 0).unwrap();
    };
    set(3, &[5]);
    set(4, if cpus > 1 { &[7, 1] } else { &[8] });
    set(10, &[2]);

    let dump = |args: &[&str]| {
        Command::new(userbpf())
            .env("USERBPF_SHM_DIR", &dir)
            .args(["--session", "plots-held", "map", "dump"])
            .args(args)
            .output()
            .unwrap()
    };
    let file = svg_file("map.svg");
    let args = ["hist", "--svg", file.to_str().unwrap()];
    let out = dump(&args);
    let text = ok(&args, out);
    assert!(text.contains("key = 10, values = { cpu0 = 2"), "the text is printed too: {text}");
    let svg = panels(&file, |s| s.starts_with("map "));
    assert_eq!(svg.len(), 1, "{svg:?}");
    let (title, bars, labels) = &svg[0];
    assert_eq!(title, "map hist: 15 values");
    assert_eq!(*bars, 3);
    let rows: Vec<&str> = labels.iter().map(String::as_str).filter(|l| l.starts_with('[')).collect();
    assert_eq!(
        rows,
        ["[8, 16)", "[16, 32)", "[32, 64)", "[64, 128)", "[128, 256)", "[256, 512)", "[512, 1K)", "[1K, 2K)"]
    );
    for want in ["value", "count", "5", "8", "2"] {
        assert!(labels.iter().any(|l| l == want), "no {want:?} in {labels:?}");
    }

    // Not a histogram, and a bad path: clear errors, no file.
    let out = dump(&["slowest", "--svg", file.to_str().unwrap()]);
    assert!(!out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        "userbpf: --svg: map `slowest` holds no log2 histogram (drawn: arrays of 8-byte counters named `*hist*`, maps whose BTF value is a struct with a `slots` array or whose BTF key is a struct with a `slot` member)"
    );
    let out = dump(&["hist", "--svg", "/nonexistent-dir/h.svg"]);
    assert!(!out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        "userbpf: cannot write SVG file /nonexistent-dir/h.svg: No such file or directory (os error 2)"
    );
    drop(loaded);
    drop(session);
}

#[test]
fn map_dump_draws_one_histogram_per_key() {
    let (dir, session, loaded) = session_with(&here("bpf/hists.bpf.c"), "plots-keyed");
    // libbpf-tools' layout: disk 7 reads in slots 2 and 5, disk 7 writes in slot 9.
    let hists = &loaded.map("hists").unwrap().map;
    let put = |dev: u32, op: u32, counts: &[(usize, u32)]| {
        let mut key = Vec::new();
        key.extend_from_slice(&dev.to_ne_bytes());
        key.extend_from_slice(&op.to_ne_bytes());
        let mut v = vec![0u8; hists.value_buf_size()];
        for &(slot, c) in counts {
            v[slot * 4..slot * 4 + 4].copy_from_slice(&c.to_ne_bytes());
        }
        hists.update_elem(&key, &v, 0).unwrap();
    };
    put(7, 1, &[(2, 3), (5, 4)]);
    put(7, 2, &[(9, 6)]);
    // A keyed hist(): function 1 in slots 0, 1 and 3; function 2 in slot 4 (per-CPU, summed).
    let lat = &loaded.map("lat").unwrap().map;
    let cpus = lat.nr_cpus() as usize;
    for (func, slot, count) in [(1u32, 0u32, 2u64), (1, 1, 1), (1, 3, 5), (2, 4, 9)] {
        let mut key = Vec::new();
        key.extend_from_slice(&func.to_ne_bytes());
        key.extend_from_slice(&slot.to_ne_bytes());
        let mut v = vec![0u8; lat.value_buf_size()];
        // 1 on the first CPU, the rest on the last.
        if cpus > 1 {
            let last = v.len() / cpus * (cpus - 1);
            v[..8].copy_from_slice(&1u64.to_ne_bytes());
            v[last..last + 8].copy_from_slice(&(count - 1).to_ne_bytes());
        } else {
            v[..8].copy_from_slice(&count.to_ne_bytes());
        }
        lat.update_elem(&key, &v, 0).unwrap();
    }
    let dump = |map: &str, file: &Path| {
        let args = ["--session", "plots-keyed", "map", "dump", map, "--svg", file.to_str().unwrap()];
        let out = Command::new(userbpf()).env("USERBPF_SHM_DIR", &dir).args(args).output().unwrap();
        ok(&args, out)
    };

    let file = svg_file("hists.svg");
    dump("hists", &file);
    let svg = panels(&file, |s| s.starts_with("map "));
    let got: Vec<(&str, usize)> = svg.iter().map(|(t, b, _)| (t.as_str(), *b)).collect();
    assert_eq!(
        got,
        [
            ("map hists { .dev = 7, .op = OP_READ }: 7 values", 2),
            ("map hists { .dev = 7, .op = OP_WRITE }: 6 values", 1)
        ]
    );
    assert!(svg[1].2.iter().any(|l| l == "[512, 1K)"), "{:?}", svg[1].2);

    let file = svg_file("lat.svg");
    dump("lat", &file);
    let svg = panels(&file, |s| s.starts_with("map "));
    let got: Vec<(&str, usize)> = svg.iter().map(|(t, b, _)| (t.as_str(), *b)).collect();
    assert_eq!(got, [("map lat { .func = 1 }: 8 values", 3), ("map lat { .func = 2 }: 9 values", 1)]);
    let rows: Vec<&str> = svg[0].2.iter().map(String::as_str).filter(|l| l.starts_with('[')).collect();
    assert_eq!(rows, ["[0, 2)", "[2, 4)", "[4, 8)", "[8, 16)"]);
    drop(loaded);
    drop(session);
}

#[test]
fn aiocost_draws_times_and_shares_per_interface() {
    // The file on the test's directory (a disk file system: O_DIRECT).
    let data = tmp().join("plots/aiocost.dat");
    let file = svg_file("aiocost.svg");
    let args = [
        "aiocost",
        "-n",
        "8",
        "-b",
        "4",
        "--size-mb",
        "4",
        "--rounds",
        "1",
        "--no-kernel",
        "--file",
        data.to_str().unwrap(),
        "--svg",
        file.to_str().unwrap(),
    ];
    let out = ok(&args, tool(&args));
    let svg = panels(&file, |s| s.starts_with("aiocost: "));
    let titles: Vec<&str> = svg.iter().map(|p| p.0.as_str()).collect();
    assert_eq!(
        titles,
        [
            "aiocost: the benchmark's own time per iteration, median of 1 run",
            "aiocost: each phase's share of an iteration, through userbpf and the kernel"
        ],
        "{out}"
    );
    // Times: 3 interfaces, untraced and userbpf (+ 2 legend swatches).
    assert_eq!(svg[0].1, 3 * 2 + 2, "{out}");
    for want in ["io_uring", "native aio", "posix aio", "untraced", "userbpf", "us per iteration"] {
        assert!(svg[0].2.iter().any(|l| l == want), "no {want:?} in {:?}", svg[0].2);
    }
    // Shares: io_uring's submit, poll, clear; the aio interfaces' submit and poll (+ 3 swatches).
    assert_eq!(svg[1].1, 3 + 2 + 2 + 3, "{out}");
    for want in ["io_uring · userbpf", "native aio · userbpf", "posix aio · userbpf", "submit", "poll", "clear"] {
        assert!(svg[1].2.iter().any(|l| l == want), "no {want:?} in {:?}", svg[1].2);
    }
}

/// A loop device over a file of the test's own, with direct I/O; detached when dropped.
struct Loop(String);

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.0]).status();
    }
}

#[test]
fn iolatency_draws_each_histogram_it_prints() {
    // SAFETY: geteuid has no arguments and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let have = |c: &str| {
        Command::new("sh").args(["-c", &format!("command -v {c}")]).output().is_ok_and(|o| o.status.success())
    };
    if !userbpf_testutil::require(
        root && have("losetup") && Path::new("/sys/kernel/tracing/events/block").exists(),
        "root, losetup and the block tracepoints",
    ) {
        return;
    }
    let img = tmp().join("plots-iolatency.img");
    std::fs::File::create(&img).unwrap().set_len(16 << 20).unwrap();
    let out = Command::new("losetup").args(["--direct-io=on", "-f", "--show"]).arg(&img).output().unwrap();
    assert!(out.status.success(), "losetup: {}", String::from_utf8_lossy(&out.stderr));
    let dev = Loop(String::from_utf8_lossy(&out.stdout).trim().to_string());
    let file = svg_file("iolatency.svg");
    let of = format!("of={}", dev.0);
    let args = [
        "iolatency",
        "--svg",
        file.to_str().unwrap(),
        "--",
        "dd",
        "if=/dev/zero",
        &of,
        "bs=4k",
        "count=200",
        "oflag=direct",
        "status=none",
    ];
    let run = tool(&args);
    let err = String::from_utf8_lossy(&run.stderr).into_owned();
    let out = ok(&args, run);
    // The text's histograms (other processes' I/O may add the kernel's totals of other disks):
    // header, non-empty buckets.
    let mut text: Vec<(String, usize)> = Vec::new();
    for l in out.lines() {
        if l.ends_with(" requests") {
            text.push((l.to_string(), 0));
        } else if l.contains(" -> ")
            && let Some(h) = text.last_mut()
        {
            let c: u64 = l.split(':').nth(1).unwrap().split_whitespace().next().unwrap().parse().unwrap();
            h.1 += (c > 0) as usize;
        }
    }
    let disk = dev.0.trim_start_matches("/dev/");
    // dd's 200 requests, unless the kernel skipped runs of the block programs (reported: the
    // other tests of this binary run beside this one, aiocost's direct reads among them).
    let mine = format!("function libc:write, disk = {disk}, op = write: ");
    let got: Option<u64> =
        text.iter().find_map(|(h, _)| h.strip_prefix(&mine)?.strip_suffix(" requests")?.parse().ok());
    assert!(userbpf_testutil::counted(got, 200, userbpf_testutil::kernel_skipped(&err)), "{out}\n{err}");
    let svg = panels(&file, |s| s.ends_with(" requests"));
    let svg: Vec<(String, usize)> = svg.into_iter().map(|(t, b, _)| (t, b)).collect();
    assert_eq!(svg, text, "the chart's panels (title, bars) against the text's histograms\n{out}");
}
