//! `userbpf map list` and `userbpf map dump` (text, `--json`, and `--svg FILE` for histograms).

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Subcommand;
use serde_json::json;
use userbpf_object::Btf;
use userbpf_runtime::Session;

use crate::dump::{Typed, dump_json, dump_text, hist_layout, histograms};

#[derive(Subcommand)]
pub enum MapCmd {
    /// List the maps of the session.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Print every key and value of a map, by name or id.
    Dump {
        map: String,
        #[arg(long)]
        json: bool,
        /// Also draw the map's log2 histograms into FILE (SVG, one chart per histogram, stacked):
        /// an array of 8-byte counters named `*hist*` is one; a map whose BTF value is a
        /// struct with a `slots` array (libbpf-tools), or whose BTF key is a struct with a
        /// `slot` member, holds one per key. A bar per non-empty slot, labelled with its
        /// range; per-CPU counts summed.
        #[arg(long, value_name = "FILE")]
        svg: Option<PathBuf>,
    },
}

pub fn run(session: &str, cmd: MapCmd) -> Result<()> {
    let s = Session::open(session).with_context(|| format!("opening session {session}"))?;
    match cmd {
        MapCmd::List { json: as_json } => {
            let mut rows = Vec::new();
            for r in s.maps()? {
                let Ok(m) = s.open_map(r.id) else { continue };
                let spec = m.spec().clone();
                // Values that are a kernel map's (shared with kernel programs): its kernel id.
                let kernel_id = s.kernel_backing(r.id).map(|b| b.kernel_id);
                rows.push(json!({"id": r.id, "name": r.name, "type": spec.map_type.name(), "key_size": spec.key_size, "value_size": spec.value_size, "max_entries": spec.max_entries, "flags": spec.map_flags, "object": r.object, "kernel_id": kernel_id}));
            }
            if as_json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                for r in rows {
                    let kernel = r["kernel_id"].as_u64().map(|k| format!("  kernel map id {k}")).unwrap_or_default();
                    println!(
                        "{}: {}  name {}  key {}B  value {}B  max_entries {}  flags {:#x}{kernel}",
                        r["id"],
                        r["type"].as_str().unwrap_or(""),
                        r["name"].as_str().unwrap_or(""),
                        r["key_size"],
                        r["value_size"],
                        r["max_entries"],
                        r["flags"].as_u64().unwrap_or(0)
                    );
                }
            }
            Ok(())
        }
        MapCmd::Dump { map, json: as_json, svg } => {
            let records = s.maps()?;
            let rec = match map.parse::<u32>() {
                Ok(id) => records.iter().find(|r| r.id == id),
                Err(_) => records.iter().find(|r| r.name == map),
            };
            let Some(rec) = rec else { bail!("no map `{map}` in session {session}") };
            let m = s.open_map(rec.id)?;
            let btf = match rec.btf_id {
                Some(id) => Some(Btf::parse(&s.btf(id)?).map_err(|e| anyhow::anyhow!("BTF of map {}: {e}", rec.name))?),
                None => None,
            };
            let t = Typed { btf: btf.as_ref(), key_type: rec.key_type_id, value_type: rec.value_type_id };
            let layout = match &svg {
                Some(path) => {
                    let Some(layout) = hist_layout(&m, &t) else {
                        bail!(
                            "--svg: map `{}` holds no log2 histogram (drawn: arrays of 8-byte counters named `*hist*`, maps whose BTF value is a struct with a `slots` array or whose BTF key is a struct with a `slot` member)",
                            rec.name
                        );
                    };
                    userbpf_plot::check_writable(path)?;
                    Some((path, layout))
                }
                None => None,
            };
            if as_json {
                println!("{}", serde_json::to_string_pretty(&dump_json(&m, &t))?);
            } else {
                for line in dump_text(&m, &t) {
                    println!("{line}");
                }
            }
            if let Some((path, layout)) = layout {
                let charts: Vec<userbpf_plot::Chart> = histograms(&m, &t, layout)
                    .into_iter()
                    .map(|(key, slots)| {
                        let total: u64 = slots.iter().sum();
                        let key = if key.is_empty() { String::new() } else { format!(" {key}") };
                        userbpf_plot::Chart::Hist(userbpf_plot::Log2Hist {
                            title: format!("map {}{key}: {total} values", rec.name),
                            unit: "value".into(),
                            slots,
                        })
                    })
                    .collect();
                userbpf_plot::write_svg(path, &charts)?;
                eprintln!(
                    "userbpf: {} histogram{} of map {} written to {}",
                    charts.len(),
                    if charts.len() == 1 { "" } else { "s" },
                    rec.name,
                    path.display()
                );
            }
            Ok(())
        }
    }
}
