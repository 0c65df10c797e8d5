//! `userbpf session list`: the sessions of this user, who uses them and what they hold.

use anyhow::Result;
use clap::Subcommand;
use serde_json::json;
use userbpf_runtime::Session;

#[derive(Subcommand)]
pub enum SessionCmd {
    /// List this user's sessions (those whose processes are all gone are removed first).
    List {
        #[arg(long)]
        json: bool,
    },
}

pub fn run(cmd: SessionCmd) -> Result<()> {
    match cmd {
        SessionCmd::List { json: as_json } => {
            let sessions = Session::list();
            if as_json {
                let rows: Vec<_> = sessions
                    .iter()
                    .map(|s| {
                        let members: Vec<_> = s.members.iter().map(|(pid, comm)| json!({"pid": pid, "comm": comm})).collect();
                        json!({"name": s.name, "dir": s.dir, "members": members, "progs": s.progs, "maps": s.maps, "links": s.links, "pinned": s.pinned, "busy": s.busy})
                    })
                    .collect();
                println!("{}", serde_json::to_string_pretty(&rows)?);
                return Ok(());
            }
            for s in sessions {
                if s.busy {
                    println!("{}  (busy: being changed right now)", s.name);
                    continue;
                }
                let members: Vec<String> = s.members.iter().map(|(pid, comm)| format!("{pid} ({comm})")).collect();
                let users = if members.is_empty() { "no process".to_string() } else { members.join(", ") };
                print!("{}  progs {}  maps {}  links {}  used by {users}", s.name, s.progs, s.maps, s.links);
                if !s.pinned.is_empty() {
                    print!("  pinned {}", s.pinned.join(", "));
                }
                println!();
            }
            Ok(())
        }
    }
}
