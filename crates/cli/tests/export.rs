//! `userbpf export`: a real scrape of `/metrics` over HTTP, checked by Prometheus's own parser
//! (`promtool check metrics`), its values equal to what `userbpf map dump --json` prints for
//! the same maps: a struct-keyed hash (labels from the key's members, the enum by name, the
//! char array as a string), a per-CPU log2 histogram array (cumulative buckets, `_count`), a
//! global-data section (one gauge per variable), and the program's run counters; the maps and
//! the program counters of `userbpf tool calls` in a named session, read live while the tool
//! and its target run (counters grow between scrapes and stay once the target is gone); a
//! config file that renames, filters and decodes; and bad config files refused with the file,
//! the entry and the problem.

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;

use common::{Proc, repo, tmp, userbpf};
use serde_json::Value;

fn userbpf_in(session: &str) -> Command {
    let mut c = Command::new(userbpf());
    c.arg("--session").arg(session).env("USERBPF_SHM_DIR", tmp());
    c
}

fn get(addr: &str, path: &str) -> (String, String) {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: text/plain\r\n\r\n").unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let (head, body) = resp.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no HTTP header end in {resp:?}"));
    (head.to_string(), body.to_string())
}

/// Samples of the text format: (name, labels, value).
fn samples(body: &str) -> Vec<(String, BTreeMap<String, String>, f64)> {
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').unwrap();
            let (name, labels) = match series.split_once('{') {
                Some((n, rest)) => {
                    let inner = rest.strip_suffix('}').unwrap();
                    let mut m = BTreeMap::new();
                    // Label values here hold no `",` sequences.
                    for kv in inner.split("\",") {
                        let (k, v) = kv.split_once("=\"").unwrap();
                        m.insert(k.to_string(), v.trim_end_matches('"').to_string());
                    }
                    (n.to_string(), m)
                }
                None => (series.to_string(), BTreeMap::new()),
            };
            (name, labels, value.parse().unwrap())
        })
        .collect()
}

/// An exporter of `session` with `extra` arguments, and its address.
fn exporter(session: &str, extra: &[&str]) -> (Proc, String) {
    let mut exp = Proc::spawn("export", {
        let mut c = userbpf_in(session);
        c.args(["export", "--listen", "127.0.0.1:0"]).args(extra);
        c
    });
    exp.wait_for("/metrics", "its address");
    let addr = exp.stdout().split("http://").nth(1).unwrap().split('/').next().unwrap().to_string();
    (exp, addr)
}

/// `promtool check metrics` on a scrape's body.
fn promtool_accepts(name: &str, body: &str) {
    let file = tmp().join(format!("{name}.prom"));
    std::fs::write(&file, body).unwrap();
    let check = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::fs::File::open(&file).unwrap())
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "promtool check metrics refused the scrape:\n{}{}\n--- scrape ---\n{body}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
}

fn has_promtool() -> bool {
    userbpf_testutil::require(
        Command::new("promtool").arg("--version").output().is_ok_and(|o| o.status.success()),
        "promtool (Debian's prometheus package)",
    )
}

/// The value of the sample `name` whose labels include `labels`.
fn find(got: &[(String, BTreeMap<String, String>, f64)], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    got.iter()
        .find(|(n, l, _)| n == name && labels.iter().all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v)))
        .map(|s| s.2)
}

fn dump(session: &str, map: &str) -> Value {
    let out = userbpf_in(session).args(["map", "dump", map, "--json"]).output().unwrap();
    assert!(out.status.success(), "map dump {map}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn a_scrape_parses_and_matches_map_dump() {
    if !has_promtool() {
        return;
    }
    let session = format!("export-{}", std::process::id());
    let (mut exp, addr) = exporter(&session, &["--run-stats"]);
    // The maps, filled by a program run 300 times (the exporter keeps the session alive).
    let obj = userbpf_testutil::compile_bpf(&repo("examples/bpf/latency.bpf.c"), &tmp().join("export-objects"));
    let out = userbpf_in(&session).args(["prog", "run"]).arg(&obj).args(["--repeat", "300"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let (head, body) = get(&addr, "/metrics");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("Content-Type: text/plain; version=0.0.4"), "{head}");
    promtool_accepts(&session, &body);
    let got = samples(&body);
    let value = |name: &str, labels: &[(&str, &str)]| -> f64 {
        let want: BTreeMap<String, String> = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        got.iter()
            .find(|(n, l, _)| n == name && *l == want)
            .map(|s| s.2)
            .unwrap_or_else(|| panic!("no {name}{want:?} in the scrape:\n{body}"))
    };

    // The struct-keyed hash: one gauge per key, labelled by its members.
    let slowest = dump(&session, "slowest");
    let rows = slowest.as_array().unwrap();
    assert_eq!(rows.len(), 2, "{slowest}");
    for r in rows {
        let k = &r["key"];
        let pid = k["pid"].to_string();
        let v = value(
            "userbpf_map_slowest",
            &[("pid", &pid), ("kind", k["kind"].as_str().unwrap()), ("comm", k["comm"].as_str().unwrap())],
        );
        assert_eq!(v, r["value"].as_f64().unwrap());
    }
    // The per-CPU histogram: slots summed over CPUs, cumulated into buckets.
    let hist = dump(&session, "hist");
    let mut cum = 0.0;
    for r in hist.as_array().unwrap() {
        let slot = r["key"].as_u64().unwrap();
        cum += r["values"].as_array().unwrap().iter().map(|c| c["value"].as_f64().unwrap()).sum::<f64>();
        let le = ((1u128 << (slot + 1)) - 1).to_string();
        if let Some(s) = got.iter().find(|(n, l, _)| n == "userbpf_map_hist_bucket" && l.get("le") == Some(&le)) {
            assert_eq!(s.2, cum, "bucket le={le}");
        } else {
            // Buckets stop at the last non-empty slot.
            assert_eq!(cum, value("userbpf_map_hist_count", &[]), "slot {slot} missing from the scrape:\n{body}");
        }
    }
    assert_eq!(value("userbpf_map_hist_count", &[]), 300.0 * 1000.0);
    assert_eq!(value("userbpf_map_hist_bucket", &[("le", "+Inf")]), 300.0 * 1000.0);
    // The global-data section: its variable, no key label.
    let bss = dump(&session, "latency.bss");
    assert_eq!(value("userbpf_map_latency_bss_calls", &[]), bss[0]["value"]["calls"].as_f64().unwrap());
    assert_eq!(value("userbpf_map_latency_bss_calls", &[]), 300.0 * 1000.0);
    assert_eq!(value("userbpf_programs", &[]), 1.0);
    assert_eq!(value("userbpf_map_entries", &[("map", "slowest"), ("type", "hash")]), 2.0);
    // The program's counters: `prog run` ran it 300 times and left (its counts stay).
    let prog = [("program", "latency"), ("type", "kprobe")];
    assert_eq!(find(&got, "userbpf_program_runs_total", &prog), Some(300.0), "{body}");
    assert!(find(&got, "userbpf_program_run_time_seconds_total", &prog).is_some_and(|t| t > 0.0), "{body}");
    assert_eq!(find(&got, "userbpf_program_misses_total", &prog), Some(0.0), "{body}");
    assert_eq!(find(&got, "userbpf_program_errors_total", &prog), Some(0.0), "{body}");
    assert_eq!(find(&got, "userbpf_program_processes", &prog), Some(0.0), "{body}");
    assert_eq!(value("userbpf_run_stats_enabled", &[]), 1.0);

    let (head, _) = get(&addr, "/nothing");
    assert!(head.starts_with("HTTP/1.1 404"), "{head}");
    exp.signal(libc::SIGINT);
    assert!(exp.wait_exit("SIGINT").success(), "{}", exp.stderr());
}

#[test]
fn a_running_tool_is_exported_live() {
    if !has_promtool() {
        return;
    }
    let session = format!("export-tool-{}", std::process::id());
    let (mut exp, addr) = exporter(&session, &["--run-stats"]);
    // A second exporter of the same session, shaped by a config file: the counts renamed,
    // their index decoded to the function's name, tt_greet filtered out by the static map
    // (no allow_unknown); a gauge keeping only names matching a regexp.
    let config = tmp().join(format!("{session}.yaml"));
    std::fs::write(
        &config,
        "prefix: demo_
metrics:
  counters:
    - name: calls
      help: Calls per function.
      map: counts
      labels:
        - name: function
          field: key
          decoders:
            - name: uint
            - name: static_map
              static_map: {0: tt_alpha, 1: tt_beta, 2: tt_gamma}
  gauges:
    - name: g_calls
      map: counts
      labels:
        - name: function
          size: 4
          decoders:
            - name: uint
            - name: static_map
              static_map: {0: tt_alpha, 1: tt_beta, 2: tt_gamma, 3: tt_greet}
            - name: regexp
              regexps: ['^tt_g']
",
    )
    .unwrap();
    let (mut shaped, shaped_addr) = exporter(&session, &["--config", config.to_str().unwrap()]);
    // A process started without userbpf, counted by `userbpf tool calls -p` in the session.
    let target =
        userbpf_testutil::compile_c(&common::here("targets/tool_target.c"), &tmp().join("export/tool_target"), &[]);
    let mut t = Proc::spawn("tool_target", Command::new(&target));
    t.wait_for("ready", "its start");
    let dir = tmp().join("export-tools");
    userbpf_testutil::compile_bpf(&repo("tools/calls.bpf.c"), &dir);
    let mut calls = Proc::spawn("calls", {
        let mut c = userbpf_in(&session);
        c.args(["tool", "calls", "-p", &t.pid().to_string(), &format!("{}:tt_*", target.display())])
            .env("USERBPF_TOOLS_DIR", &dir);
        c
    });
    calls.wait_for("Tracing 4 functions", "the probes in place");
    // Functions by index, sorted by name: tt_alpha, tt_beta, tt_gamma, tt_greet.
    for (round, n) in [(1, 5.0), (2, 7.0)] {
        t.send(if round == 1 { "5\n" } else { "2\n" });
        t.wait_for(&format!("done {}", if round == 1 { 5 } else { 2 }), "a round");
        let (_, body) = get(&addr, "/metrics");
        let got = samples(&body);
        let count = |key: &str| {
            got.iter()
                .find(|(name, l, _)| name == "userbpf_map_counts" && l.get("key").map(String::as_str) == Some(key))
                .map(|s| s.2)
        };
        assert_eq!(
            [count("0"), count("1"), count("2"), count("3")],
            [Some(n), Some(2.0 * n), Some(3.0 * n), Some(n)],
            "round {round}:\n{body}"
        );
        // The program's runs: one per call of the four functions, grown since the last round.
        let runs = find(&got, "userbpf_program_runs_total", &[]).unwrap_or_else(|| panic!("no runs:\n{body}"));
        assert_eq!(runs, 7.0 * n, "round {round}:\n{body}");
        assert_eq!(find(&got, "userbpf_program_processes", &[]), Some(1.0), "{body}");
        promtool_accepts(&format!("{session}-{round}"), &body);

        let (_, body) = get(&shaped_addr, "/metrics");
        promtool_accepts(&format!("{session}-shaped-{round}"), &body);
        let got = samples(&body);
        let calls_of = |f: &str| find(&got, "demo_calls_total", &[("function", f)]);
        assert_eq!(
            [calls_of("tt_alpha"), calls_of("tt_beta"), calls_of("tt_gamma"), calls_of("tt_greet")],
            [Some(n), Some(2.0 * n), Some(3.0 * n), None],
            "round {round}:\n{body}"
        );
        let gauge_of = |f: &str| find(&got, "demo_g_calls", &[("function", f)]);
        assert_eq!(
            [gauge_of("tt_alpha"), gauge_of("tt_beta"), gauge_of("tt_gamma"), gauge_of("tt_greet")],
            [None, None, Some(3.0 * n), Some(n)],
            "round {round}:\n{body}"
        );
        assert!(
            body.contains("# HELP demo_calls_total Calls per function.\n# TYPE demo_calls_total counter\n"),
            "{body}"
        );
        assert!(!body.contains("userbpf_map_counts"), "a map the config does not name is exported:\n{body}");
        assert!(body.contains("userbpf_map_entries{map=\"counts\""), "{body}");
    }
    t.close_stdin();
    t.wait_exit("end of input");
    assert!(calls.wait_exit("the process gone").success(), "{}", calls.stderr());
    // The target is gone: its counts stay in the session (Prometheus counters never go down).
    let (_, body) = get(&addr, "/metrics");
    let got = samples(&body);
    assert_eq!(find(&got, "userbpf_program_runs_total", &[]), Some(49.0), "{body}");
    assert_eq!(find(&got, "userbpf_program_processes", &[]), Some(0.0), "{body}");
    for e in [&mut exp, &mut shaped] {
        e.signal(libc::SIGINT);
        assert!(e.wait_exit("SIGINT").success(), "{}", e.stderr());
    }
}

#[test]
fn a_config_file_names_a_histogram_and_decodes_a_struct_key() {
    if !has_promtool() {
        return;
    }
    let session = format!("export-config-{}", std::process::id());
    let config = tmp().join(format!("{session}.yaml"));
    std::fs::write(
        &config,
        "prefix: lat_
metrics:
  gauges:
    - name: slowest
      help: The slowest call per process and kind, in nanoseconds.
      map: slowest
      labels:
        - name: process
          field: comm
          decoders:
            - name: string
        - name: kind
  histograms:
    - name: latency_seconds
      help: Call latency.
      map: hist
      bucket_type: log2
      bucket_multiplier: 0.000000001
    - name: slots
      help: The same map, its slot numbers as linear buckets of width 2.
      map: hist
      bucket_type: linear
      bucket_multiplier: 2
",
    )
    .unwrap();
    let (mut exp, addr) = exporter(&session, &["--config", config.to_str().unwrap()]);
    let obj = userbpf_testutil::compile_bpf(&repo("examples/bpf/latency.bpf.c"), &tmp().join("export-config-objects"));
    let out = userbpf_in(&session).args(["prog", "run"]).arg(&obj).args(["--repeat", "300"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (_, body) = get(&addr, "/metrics");
    promtool_accepts(&session, &body);
    let got = samples(&body);
    for r in dump(&session, "slowest").as_array().unwrap() {
        let k = &r["key"];
        let labels = [("process", k["comm"].as_str().unwrap()), ("kind", k["kind"].as_str().unwrap())];
        assert_eq!(find(&got, "lat_slowest", &labels), r["value"].as_f64(), "{body}");
    }
    // Buckets in seconds: slot k's le is (2^(k+1) - 1) ns.
    let hist = dump(&session, "hist");
    let mut cum = 0.0;
    for r in hist.as_array().unwrap() {
        let slot = r["key"].as_u64().unwrap();
        cum += r["values"].as_array().unwrap().iter().map(|c| c["value"].as_f64().unwrap()).sum::<f64>();
        let le = (2f64.powi(slot as i32 + 1) - 1.0) * 1e-9;
        let bucket = got.iter().find(|(n, l, _)| {
            n == "lat_latency_seconds_bucket"
                && l.get("le").and_then(|x| x.parse::<f64>().ok()).is_some_and(|x| ((x - le) / le).abs() < 1e-12)
        });
        if let Some(b) = bucket {
            assert_eq!(b.2, cum, "bucket le={le}:\n{body}");
            // Linear: slot k is [2k, 2k + 2).
            let le = (2 * (slot + 1)).to_string();
            assert_eq!(find(&got, "lat_slots_bucket", &[("le", &le)]), Some(cum), "slots le={le}:\n{body}");
        } else {
            // Buckets stop at the last non-empty slot.
            assert_eq!(cum, 300.0 * 1000.0, "slot {slot} missing:\n{body}");
        }
    }
    assert_eq!(find(&got, "lat_latency_seconds_count", &[]), Some(300.0 * 1000.0), "{body}");
    assert_eq!(find(&got, "lat_slots_count", &[]), Some(300.0 * 1000.0), "{body}");
    assert_eq!(find(&got, "lat_latency_seconds_bucket", &[("le", "+Inf")]), Some(300.0 * 1000.0), "{body}");
    assert!(
        find(&got, "lat_latency_seconds_sum", &[]).is_some_and(|s| s > 0.0 && s < 300.0 * 1000.0 * 66e-6),
        "{body}"
    );
    // Only the maps the file names: no default gauges of the three maps.
    assert!(
        !body.contains("userbpf_map_slowest")
            && !body.contains("userbpf_map_hist")
            && !body.contains("userbpf_map_latency_bss"),
        "{body}"
    );
    exp.signal(libc::SIGINT);
    assert!(exp.wait_exit("SIGINT").success(), "{}", exp.stderr());
}

#[test]
fn bad_config_files_are_refused_with_the_file_the_entry_and_the_problem() {
    let dir = tmp().join("export-bad-configs");
    std::fs::create_dir_all(&dir).unwrap();
    let cases: &[(&str, &str, &[&str])] = &[
        (
            "typo.yaml",
            "metrics:\n  counters:\n    - name: calls\n      hlep: x\n",
            &["metrics.counters[0]", "unknown field `hlep`"],
        ),
        (
            "decoder.yaml",
            "metrics:\n  counters:\n    - name: calls\n      labels:\n        - name: f\n          decoders:\n            - name: ksym2\n",
            &["metrics.counters[0].labels[0].decoders[0]", "unknown decoder `ksym2`"],
        ),
        (
            "bucket.yaml",
            "metrics:\n  histograms:\n    - name: h\n      bucket_type: log10\n",
            &["metrics.histograms[0]", "unknown variant `log10`"],
        ),
        (
            "name.yaml",
            "metrics:\n  gauges:\n    - name: my-gauge\n",
            &["metrics.gauges[0]", "`my-gauge` is not a Prometheus metric name"],
        ),
        ("syntax.yaml", "metrics: [\n", &["line"]),
        ("empty.yaml", "prefix: x_\n", &["no `metrics` section"]),
    ];
    for (file, text, want) in cases {
        let path = dir.join(file);
        std::fs::write(&path, text).unwrap();
        let out = userbpf_in(&format!("export-bad-{}", std::process::id()))
            .args(["export", "--listen", "127.0.0.1:0", "--config"])
            .arg(&path)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{file}: accepted");
        assert!(err.contains(&path.display().to_string()), "{file}: the error does not name the file: {err}");
        for w in *want {
            assert!(err.contains(w), "{file}: no {w:?} in: {err}");
        }
        assert!(!String::from_utf8_lossy(&out.stdout).contains("serving"), "{file}: it listened");
    }
    let missing = dir.join("missing.yaml");
    let out = userbpf_in("export-bad")
        .args(["export", "--listen", "127.0.0.1:0", "--config"])
        .arg(&missing)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains(&missing.display().to_string()));
}

/// Through `userbpf load`, `bpftool prog show` reports the runs of the session's targets
/// (those gone included) as the kernel reports a program's runs: what the exporter exports.
#[test]
fn bpftool_through_load_shows_the_targets_runs() {
    let have = |tool: &str| Command::new(tool).arg("--version").output().is_ok_and(|o| o.status.success());
    if !userbpf_testutil::require(have("bpftrace") && have("bpftool"), "bpftrace and bpftool") {
        return;
    }
    let session = format!("export-bpftool-{}", std::process::id());
    let (mut exp, addr) = exporter(&session, &["--run-stats"]);
    let target = userbpf_testutil::compile_c(&repo("examples/targets/workload.c"), &tmp().join("export/workload"), &[]);
    let script = format!("uprobe:{}:work {{ @c = count(); }}", target.display());
    let mut bt = Proc::spawn("bpftrace", {
        let mut c = userbpf_in(&session);
        c.args(["load", "--", "bpftrace", "-e", &script]);
        c
    });
    // Attached once the session has the link.
    let t0 = std::time::Instant::now();
    while find(&samples(&get(&addr, "/metrics").1), "userbpf_links", &[]) != Some(1.0) {
        assert!(t0.elapsed().as_secs() < 30, "no link after 30 s: {}", bt.describe());
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = userbpf_in(&session).arg("start").arg("--").arg(&target).arg("1000").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = userbpf_in(&session).args(["load", "--", "bpftool", "-j", "prog", "show"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let progs: Value = serde_json::from_slice(&out.stdout).unwrap();
    let work = progs.as_array().unwrap().iter().find(|p| p["name"] == "work").expect("no program `work`");
    assert_eq!(work["run_cnt"], 1000, "{work}");
    assert!(work["run_time_ns"].as_u64().is_some_and(|t| t > 0), "{work}");
    let got = samples(&get(&addr, "/metrics").1);
    assert_eq!(find(&got, "userbpf_program_runs_total", &[("program", "work")]), Some(1000.0));
    common::interrupt(&mut bt);
    bt.wait_exit("SIGINT");
    assert!(bt.stdout().contains("@c: 1000"), "{}", bt.stdout());
    exp.signal(libc::SIGINT);
    assert!(exp.wait_exit("SIGINT").success(), "{}", exp.stderr());
}
