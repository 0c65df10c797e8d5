//! `userbpf export`: a real scrape of `/metrics` over HTTP, checked by Prometheus's own parser
//! (`promtool check metrics`), its values equal to what `userbpf map dump --json` prints for
//! the same maps: a struct-keyed hash (labels from the key's members, the enum by name, the
//! char array as a string), a per-CPU log2 histogram array (cumulative buckets, `_count`), a
//! global-data section (one gauge per variable); and the maps of `userbpf tool calls` in a
//! named session, read live while the tool and its target run.

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

fn dump(session: &str, map: &str) -> Value {
    let out = userbpf_in(session).args(["map", "dump", map, "--json"]).output().unwrap();
    assert!(out.status.success(), "map dump {map}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn a_scrape_parses_and_matches_map_dump() {
    if !userbpf_testutil::require(
        Command::new("promtool").arg("--version").output().is_ok_and(|o| o.status.success()),
        "promtool (Debian's prometheus package)",
    ) {
        return;
    }
    let session = format!("export-{}", std::process::id());
    let mut exp = Proc::spawn("export", {
        let mut c = userbpf_in(&session);
        c.args(["export", "--listen", "127.0.0.1:0"]);
        c
    });
    exp.wait_for("/metrics", "its address");
    let addr = exp.stdout().split("http://").nth(1).unwrap().split('/').next().unwrap().to_string();
    // The maps, filled by a program run 300 times (the exporter keeps the session alive).
    let obj = userbpf_testutil::compile_bpf(&repo("examples/bpf/latency.bpf.c"), &tmp().join("export-objects"));
    let out = userbpf_in(&session).args(["prog", "run"]).arg(&obj).args(["--repeat", "300"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let (head, body) = get(&addr, "/metrics");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("Content-Type: text/plain; version=0.0.4"), "{head}");
    let file = tmp().join(format!("{session}.prom"));
    std::fs::write(&file, &body).unwrap();
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

    let (head, _) = get(&addr, "/nothing");
    assert!(head.starts_with("HTTP/1.1 404"), "{head}");
    exp.signal(libc::SIGINT);
    assert!(exp.wait_exit("SIGINT").success(), "{}", exp.stderr());
}

#[test]
fn a_running_tool_is_exported_live() {
    let session = format!("export-tool-{}", std::process::id());
    let mut exp = Proc::spawn("export", {
        let mut c = userbpf_in(&session);
        c.args(["export", "--listen", "127.0.0.1:0"]);
        c
    });
    exp.wait_for("/metrics", "its address");
    let addr = exp.stdout().split("http://").nth(1).unwrap().split('/').next().unwrap().to_string();
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
    }
    t.close_stdin();
    t.wait_exit("end of input");
    assert!(calls.wait_exit("the process gone").success(), "{}", calls.stderr());
    exp.signal(libc::SIGINT);
    assert!(exp.wait_exit("SIGINT").success(), "{}", exp.stderr());
}
