//! The handshake by which a loader waits until every agent of the session acted on a change
//! of the session's links, both halves.
//!
//! - The loader, after changing links, publishes a new generation ([`publish`]: a fresh id
//!   of the session, so increasing, renamed into `links/gen`, which every agent's inotify
//!   watch of `links/` sees) and waits, bounded, until every live agent acknowledged it
//!   ([`wait`]). It also rewrites `links/nudge` a little later ([`nudge`]), for an agent
//!   whose watch was set up after it listed `links/`.
//! - An agent that implements the protocol keeps an acknowledgement file `agents/PID.START`
//!   ([`Ack`]). Every sync reads the generation ([`current`]) *before* listing `links/`
//!   and, once it acted on the listing, writes the number it read into its file
//!   ([`Ack::write`]: temporary file + rename, the loader never reads half).
//!
//! So when the loader's LINK_CREATE, ioctl or close returns, the probes it changed are in
//! place in every running target, as the kernel's are. An agent that can no longer
//! acknowledge (its watcher ended, its process exits) removes its file ([`Ack::remove`],
//! [`remove_ack_of`]) and the loader stops waiting for it; a file of a process that is gone
//! (pid and start time no longer match) is ignored.

use std::fs;
use std::io;
use std::time::{Duration, Instant};

use super::layout::{self, Layout};
use super::{Session, start_time};

// ---- the loader's half ----

/// Publishes a new links generation after a change of `session`'s links; returns it, or
/// `None` when no agent of the session acknowledges (nothing to wait for) or it could not be
/// written.
pub fn publish(session: &Session) -> Option<u32> {
    let l = session.layout();
    if fs::read_dir(l.agents_dir()).map_or(true, |mut d| d.next().is_none()) {
        return None;
    }
    let generation = session.alloc_id().ok()?;
    layout::write_atomic(&l.links_gen(), generation.to_string().as_bytes()).ok()?;
    Some(generation)
}

/// Publishes a new links generation even when no agent acknowledges yet (one being
/// injected into a process reads it at its start, and its first acknowledgement then
/// covers it); returns it.
pub fn advance(session: &Session) -> std::io::Result<u32> {
    let generation = session.alloc_id().map_err(std::io::Error::other)?;
    layout::write_atomic(&session.layout().links_gen(), generation.to_string().as_bytes())?;
    Ok(generation)
}

/// Waits (at most `limit`) until every live agent's acknowledgement file other than
/// process `skip`'s (the caller's own agent, synced directly) holds at least `gen`. Returns
/// whether they all did.
pub fn wait(l: &Layout, generation: u32, skip: u32, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if pending(l, generation, skip).is_none() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The pid of a live agent (not `skip`) that has not acknowledged `gen` yet, if any.
pub fn pending(l: &Layout, generation: u32, skip: u32) -> Option<u32> {
    let rd = fs::read_dir(l.agents_dir()).ok()?;
    for e in rd.flatten() {
        let Some((pid, start)) = e.file_name().to_str().and_then(Layout::parse_agent) else { continue };
        if pid == skip || start_time(pid) != Some(start) {
            continue; // the caller, or a process that is gone
        }
        let acked = fs::read_to_string(e.path()).ok().and_then(|t| t.trim().parse::<u32>().ok()).unwrap_or(0);
        if acked < generation {
            return Some(pid);
        }
    }
    None
}

/// The generation process `pid`'s agent acknowledged last, if it keeps an acknowledgement
/// file (and is the process that made it: a pid reused by another process has none).
pub fn acked_by(l: &Layout, pid: u32) -> Option<u32> {
    let start = start_time(pid)?;
    fs::read_to_string(l.agent(pid, start)).ok().and_then(|t| t.trim().parse().ok())
}

/// Rewrites `links/nudge` (an event in `links/` that is not a link): every agent looks at the
/// links again.
pub fn nudge(l: &Layout) {
    let _ = layout::write_atomic(&l.links_nudge(), b"");
}

// ---- the agent's half ----

/// The links generation now (none published yet: 0).
pub fn current(l: &Layout) -> u32 {
    super::broker::read_to_string(&l.links_gen()).ok().and_then(|t| t.trim().parse().ok()).unwrap_or(0)
}

/// An agent's acknowledgement file.
#[derive(Debug)]
pub struct Ack {
    path: std::path::PathBuf,
    /// The generation last written.
    done: u32,
}

impl Ack {
    /// Creates this process's file, holding 0 (the loader waits for this agent from now on:
    /// its first sync follows).
    pub fn create(l: &Layout) -> io::Result<Ack> {
        let me = std::process::id();
        let start = start_time(me).ok_or_else(|| io::Error::other("no start time of this process"))?;
        layout::make_dir(&l.agents_dir())?;
        let mut a = Ack { path: l.agent(me, start), done: 0 };
        a.write(0)?;
        Ok(a)
    }

    /// Records that the sync which read generation `gen` (with [`current`], before listing
    /// `links/`) is done.
    pub fn write(&mut self, generation: u32) -> io::Result<()> {
        layout::write_atomic(&self.path, generation.to_string().as_bytes())?;
        self.done = generation;
        Ok(())
    }

    /// The generation last written.
    pub fn done(&self) -> u32 {
        self.done
    }

    /// The file (`agents/PID.START`).
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// Removes the file: the loader stops waiting for this agent.
    pub fn remove(self) {
        let _ = super::broker::remove_file(&self.path);
    }
}

/// Removes the acknowledgement file of this process, if any (one a previous image left
/// before an exec, or this process's at its exit).
pub fn remove_ack_of_self(l: &Layout) {
    let me = std::process::id();
    if let Some(start) = start_time(me) {
        remove_ack_of(l, me, start);
    }
}

/// Removes process `pid`'s (started at `start`) acknowledgement file.
pub fn remove_ack_of(l: &Layout, pid: u32, start: u64) {
    let _ = super::broker::remove_file(&l.agent(pid, start));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loader_waits_until_the_agent_acknowledges() {
        let root = std::env::temp_dir().join(format!("userbpf-handshake-unit-{}", std::process::id()));
        fs::create_dir_all(&root).unwrap();
        let s = Session::open_in(&root, "handshake").unwrap();
        let l = s.layout().clone();
        // No agent: nothing published, nothing to wait for.
        assert_eq!(publish(&s), None);
        assert_eq!(current(&l), 0);

        let mut ack = Ack::create(&l).unwrap();
        let generation = publish(&s).expect("an agent acknowledges: a generation is published");
        assert!(generation > 0);
        assert_eq!(current(&l), generation);
        let me = std::process::id();
        // The loader's own agent is skipped.
        assert!(wait(&l, generation, me, Duration::ZERO));
        // Another loader waits for it: not acknowledged yet.
        assert_eq!(pending(&l, generation, 0), Some(me));
        assert!(!wait(&l, generation, 0, Duration::from_millis(20)));

        // The agent syncs in another thread: reads the generation, acts, acknowledges.
        let agent = std::thread::spawn({
            let l = l.clone();
            move || {
                let seen = current(&l);
                std::thread::sleep(Duration::from_millis(20));
                ack.write(seen).unwrap();
                ack
            }
        });
        assert!(wait(&l, generation, 0, Duration::from_secs(10)), "acknowledged");
        let ack = agent.join().unwrap();
        assert_eq!(ack.done(), generation);

        // A later generation is pending again until acknowledged; a removed file ends the wait.
        let gen2 = publish(&s).unwrap();
        assert!(gen2 > generation);
        assert_eq!(pending(&l, gen2, 0), Some(me));
        ack.remove();
        assert!(wait(&l, gen2, 0, Duration::ZERO), "no agent left to wait for");
        assert_eq!(publish(&s), None);

        // A file of a process that is gone is not waited for.
        fs::write(l.agent(999_999_999, 1), b"0").unwrap();
        assert!(pending(&l, u32::MAX, 0).is_none());
        nudge(&l);
        assert!(l.links_nudge().exists());
        drop(s);
        let _ = fs::remove_dir_all(&root);
    }
}
