//! `userbpf tracelog`: the `bpf_trace_printk` lines of the session's programs as they are
//! written, in the kernel's trace_pipe format, as `bpftool prog tracelog` prints the kernel's.
//! Lines written before anyone reads are kept in the session's trace pipe (a 1 MiB ring: when
//! it is full, new lines are dropped and counted, where the kernel's buffer would overwrite
//! its oldest). Reading consumes them, as reading the kernel's trace_pipe does. Ctrl-C (or
//! SIGTERM) ends it; the session is left as any member leaves it.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use userbpf_maps::Map;
use userbpf_maps::ringbuf::RingBufConsumer;
use userbpf_runtime::Session;

#[derive(Args)]
pub struct TracelogArgs {
    /// Print what is waiting and exit instead of waiting for more lines.
    #[arg(long)]
    no_wait: bool,
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

pub fn run(session: &str, args: TracelogArgs) -> Result<()> {
    let s = Session::open(session).with_context(|| format!("opening session {session}"))?;
    let map = s.trace_pipe().context("opening the session's trace pipe")?;
    let Map::RingBuf(rb) = &map else { bail!("the session's trace pipe is not a ring buffer") };
    let mut consumer = RingBufConsumer::new(rb)?;
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic (async-signal-safe); installed before
        // any other thread exists.
        unsafe { libc::signal(sig, on_stop as *const () as libc::sighandler_t) };
    }
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut failed = None;
    loop {
        let n = consumer.poll(Duration::from_millis(if args.no_wait { 0 } else { 200 }), |line| {
            if failed.is_none()
                && let Err(e) = out.write_all(line)
            {
                failed = Some(e);
            }
        })?;
        if let Some(e) = failed.take() {
            // A closed stdout (`| head`) ends the reading quietly.
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                return Ok(());
            }
            return Err(e.into());
        }
        if n > 0
            && let Err(e) = out.flush()
        {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                return Ok(());
            }
            return Err(e.into());
        }
        if STOP.load(Ordering::SeqCst) || (args.no_wait && n == 0) {
            return Ok(());
        }
    }
}
