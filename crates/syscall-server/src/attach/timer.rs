//! Timers: CPU/task clock events run their program from a timer thread in the loader.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use userbpf_runtime::context::RunContext;
use userbpf_runtime::{Engine, LoadedProgram};

use super::{Running, attached, io_errno};
use crate::objects;
use crate::perf_event::Spec;

fn prepared(prog_id: u32) -> Result<Arc<LoadedProgram>, i32> {
    let server = crate::server::server();
    let mut g = server.attach.programs.lock().unwrap_or_else(|e| e.into_inner());
    let cache = g.get_or_insert_with(HashMap::new);
    if let Some(p) = cache.get(&prog_id) {
        return Ok(p.clone());
    }
    let s = objects::session()?;
    let slots = server.slots().map_err(|e| e.errno)?;
    let rec = s.progs().map_err(io_errno)?.into_iter().find(|p| p.id == prog_id).ok_or(libc::EBADF)?;
    let engine =
        if std::env::var("USERBPF_INTERPRETER").is_ok_and(|v| v == "1") { Engine::Interpreter } else { Engine::Jit };
    let prog = userbpf_runtime::loader::prepare_record(s, &rec, userbpf_runtime::helpers::registry(), engine, slots)
        .map_err(|e| {
            eprintln!("userbpf: program {prog_id}: {e}");
            libc::EINVAL
        })?;
    let prog = Arc::new(prog);
    if !userbpf_runtime::program_table::register(prog.clone()) {
        eprintln!("userbpf: {}", userbpf_runtime::program_table::full_message(&rec.name));
        return Err(libc::ENOMEM);
    }
    cache.insert(prog_id, prog.clone());
    Ok(prog)
}

/// `struct bpf_perf_event_data`: `pt_regs` (21 words), `sample_period`, `addr`.
#[repr(C)]
struct PerfEventData {
    regs: [u64; 21],
    sample_period: u64,
    addr: u64,
}

fn period_of(event: u32) -> Option<Duration> {
    match crate::perf_event::event_spec(event)? {
        Spec::Clock { period, freq: false, .. } => Some(Duration::from_nanos(period.max(1000))),
        Spec::Clock { period, freq: true, .. } => Some(Duration::from_nanos((1_000_000_000 / period.max(1)).max(1000))),
        _ => None,
    }
}

pub(super) fn start_timer(event: u32, prog_id: u32, cookie: u64) -> Result<Running, i32> {
    let prog = prepared(prog_id)?;
    let period = period_of(event).ok_or(libc::EINVAL)?;
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let cpu = match crate::perf_event::event_spec(event) {
        Some(Spec::Clock { cpu, .. }) => cpu,
        _ => -1,
    };
    let t = userbpf_hook::quiet::spawn(format!("userbpf-timer-{event}"), move || {
        if cpu >= 0 && (cpu as usize) < libc::CPU_SETSIZE as usize {
            // A per-CPU clock samples its CPU: the program runs there (its CPU slot, what
            // bpf_get_smp_processor_id returns, is that CPU's when free).
            // SAFETY: a zeroed cpu_set_t is empty; CPU_SET and sched_setaffinity work on it.
            unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(cpu as usize, &mut set);
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
            }
        }
        let mut period = period;
        let mut next = Instant::now() + period;
        loop {
            let now = Instant::now();
            if now < next {
                std::thread::park_timeout(next - now);
            }
            if flag.load(Ordering::SeqCst) {
                return;
            }
            if Instant::now() < next {
                // Unparked early: the period may have changed.
                if let Some(p) = period_of(event)
                    && p != period
                {
                    next = next - period + p;
                    period = p;
                }
                continue;
            }
            let mut data = PerfEventData { regs: [0; 21], sample_period: period.as_nanos() as u64, addr: 0 };
            let info = RunContext { regs: data.regs.as_ptr() as u64, cookie, ..Default::default() };
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                prog.run((&mut data as *mut PerfEventData).cast(), std::mem::size_of::<PerfEventData>(), info)
            }));
            next += period;
            let now = Instant::now();
            if next < now {
                // Fell behind (a slow program, a stopped process): no burst of catch-up runs.
                next = now + period;
            }
        }
    })
    .map_err(|_| libc::EAGAIN)?;
    Ok(Running::Timer(stop, t.thread().clone()))
}

/// Tells event `id`'s timer its period changed.
pub fn refresh_timer(id: u32) {
    attached(|m| {
        for a in m.values() {
            if a.event == id
                && let Running::Timer(_, t) = &a.running
            {
                t.unpark();
            }
        }
    });
}
