//! After a change of the session's links: the loader's own agent syncs, the agents of the
//! session's running targets are waited for (the handshake of
//! `userbpf_runtime::session::handshake`), and a nudge follows for agents that were starting.

use std::sync::Once;
use std::time::{Duration, Instant};

use userbpf_runtime::session::handshake;

use crate::objects;

/// Syncs the loader's own agent (attaches links for this process, detaches removed ones).
/// After a change of the session's links: the loader's own agent syncs now, and the agents
/// of the session's running targets are waited for (bounded), so that, as with the kernel,
/// a probe is live in every process when the ioctl, LINK_CREATE or close returns.
pub(super) fn sync_agent() {
    match userbpf_agent::Agent::start() {
        Ok(a) => a.lock().unwrap_or_else(|e| e.into_inner()).sync(),
        Err(e) => {
            eprintln!("userbpf: the loader's agent did not start ({e}): probes on the loader itself will not run")
        }
    }
    if let Ok(s) = objects::session()
        && let Some(generation) = handshake::publish(s)
    {
        handshake::wait(s.layout(), generation, std::process::id(), Duration::from_secs(1));
    }
    nudge_later();
}

/// A target whose agent was starting while links changed may have listed `links/` before
/// the change and set up its inotify watch after it: such an agent would never see the
/// change. So the loader rewrites `links/nudge` (an event in `links/`, ignored as a link)
/// 0.2 s and 1 s after the last change, and every agent looks at the links again.
fn nudge_later() {
    static THREAD: Once = Once::new();
    let st = &crate::server::server().attach;
    *st.last_change.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
    st.changed.notify_one();
    THREAD.call_once(|| {
        let _ = userbpf_hook::quiet::spawn("userbpf-nudge", || {
            let mut done_for: Option<Instant> = None;
            let mut step = 0;
            loop {
                let g = st.last_change.lock().unwrap_or_else(|e| e.into_inner());
                let last = *g;
                if last != done_for {
                    step = 0;
                    done_for = last;
                }
                let Some(t) = last else {
                    drop(st.changed.wait(g));
                    continue;
                };
                let at = t + if step == 0 { Duration::from_millis(200) } else { Duration::from_secs(1) };
                let now = Instant::now();
                if step >= 2 {
                    drop(st.changed.wait(g));
                    continue;
                }
                if now < at {
                    drop(st.changed.wait_timeout(g, at - now));
                    continue;
                }
                drop(g);
                if let Ok(s) = objects::session() {
                    handshake::nudge(s.layout());
                }
                step += 1;
            }
        });
    });
}
