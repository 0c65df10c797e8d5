//! `userbpf map list` and `userbpf map dump`.

use anyhow::{Context, Result, bail};
use clap::Subcommand;
use serde_json::json;
use userbpf_object::Btf;
use userbpf_runtime::Session;

use crate::dump::{Typed, dump_json, dump_text};

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
        MapCmd::Dump { map, json: as_json } => {
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
            if as_json {
                println!("{}", serde_json::to_string_pretty(&dump_json(&m, &t))?);
            } else {
                for line in dump_text(&m, &t) {
                    println!("{line}");
                }
            }
            Ok(())
        }
    }
}
