//! Sending data to user space: `perf_event_output` and the ring buffer helpers
//! (`ringbuf_output`, `ringbuf_reserve`, `ringbuf_submit`, `ringbuf_discard`,
//! `ringbuf_query`).
//!
//! `ringbuf_submit` and `ringbuf_discard` get only the sample's address. The ring it belongs
//! to is found in a small per-thread table of this thread's outstanding reservations (a
//! program submits or discards, on its own thread, what it reserved), falling back to the
//! registered ring buffers that own the address. Addresses that belong to no ring are
//! ignored.

use std::cell::Cell;

use userbpf_maps::Map;
use userbpf_maps::perf::{BPF_F_CURRENT_CPU, BPF_F_INDEX_MASK};
use userbpf_vm::{HelperRegistry, guard};

use super::maps::{map_at, map_ref, registered_maps};
use super::{EFAULT, EINVAL, helper, readable};
use crate::context::current_cpu;

/// `long bpf_perf_event_output(ctx, map, flags, data, size)`: a sample on the perf ring of
/// the index in `flags` (`BPF_F_CURRENT_CPU`: the run's CPU slot). The kernel's errors
/// (`-EINVAL`, `-E2BIG`, `-ENOENT`, `-ENOSPC`); `-EFAULT` if `data` cannot be read. The data
/// is copied into the ring by the guard's fault-tolerant copy (no separate readability
/// probe): a fault publishes nothing.
#[unsafe(link_section = ".text.hot.userbpf")]
unsafe extern "C" fn perf_event_output(_ctx: u64, map: u64, flags: u64, data: u64, size: u64) -> u64 {
    let Some(Map::PerfEventArray(pa)) = map_ref(map) else { return EINVAL };
    // Only BPF_F_CURRENT_CPU needs the run's slot (a thread-block read).
    let cpu = if flags & BPF_F_INDEX_MASK == BPF_F_CURRENT_CPU { current_cpu() } else { 0 };
    let copy = |dst: *mut u8, src: *const u8, len: usize| {
        // SAFETY: the guard tolerates any `src` (the program's data); `dst` is the record's
        // place in the ring, which `output_with` hands over for `len` bytes.
        unsafe { guard::copy(dst, src, len as u64) == 0 }
    };
    match pa.output_with(flags, cpu, data as *const u8, size, copy) {
        Ok(()) => 0,
        Err(e) => e.to_helper_ret(),
    }
}

/// `long bpf_ringbuf_output(ringbuf, data, size, flags)`: `-EINVAL` for unknown flags,
/// `-EAGAIN` when there is no room.
#[unsafe(link_section = ".text.hot.userbpf")]
unsafe extern "C" fn ringbuf_output(map: u64, data: u64, size: u64, flags: u64, _: u64) -> u64 {
    let Some((Map::RingBuf(rb), _)) = map_at(map) else { return EINVAL };
    if !readable(data, size) {
        return EFAULT;
    }
    // SAFETY: `data` was just checked readable for `size` bytes.
    match unsafe { rb.output(data as *const u8, size, flags) } {
        Ok(()) => 0,
        Err(e) => e.to_helper_ret(),
    }
}

/// Outstanding reservations of this thread: (sample address, address of the Map).
const OUTSTANDING: usize = 16;

thread_local! {
    static RESERVED: [Cell<(u64, u64)>; OUTSTANDING] = const { [const { Cell::new((0, 0)) }; OUTSTANDING] };
}

fn remember(sample: u64, map: u64) {
    RESERVED.with(|t| {
        // Reuse the slot of an older record at the same address, else the first free one,
        // else the oldest is forgotten (slot 0; the fallback still finds its ring).
        let slot =
            t.iter().position(|c| c.get().0 == sample).or_else(|| t.iter().position(|c| c.get().0 == 0)).unwrap_or(0);
        if let Some(c) = t.get(slot) {
            c.set((sample, map));
        }
    });
}

/// The ring that owns `sample`, forgetting the reservation.
fn take_ring(sample: u64) -> Option<&'static userbpf_maps::ringbuf::RingBuf> {
    let from_table = RESERVED.with(|t| {
        let c = t.iter().find(|c| c.get().0 == sample)?;
        let (_, map) = c.get();
        c.set((0, 0));
        Some(map)
    });
    if let Some(map) = from_table
        && let Some((Map::RingBuf(rb), _)) = map_at(map)
        && rb.owns_sample(sample as *const u8)
    {
        return Some(rb);
    }
    registered_maps().find_map(|m| match m {
        Map::RingBuf(rb) if rb.owns_sample(sample as *const u8) => Some(rb),
        _ => None,
    })
}

/// `void *bpf_ringbuf_reserve(ringbuf, size, flags)`: a sample of `size` bytes, or NULL
/// (no room, size too large, or flags other than 0).
#[unsafe(link_section = ".text.hot.userbpf")]
unsafe extern "C" fn ringbuf_reserve(map: u64, size: u64, flags: u64, _: u64, _: u64) -> u64 {
    if flags != 0 {
        return 0;
    }
    let Some((Map::RingBuf(rb), _)) = map_at(map) else { return 0 };
    // SAFETY: the sample is committed by the program's submit or discard, as the kernel's
    // verifier requires of every reservation.
    let p = unsafe { rb.reserve(size) } as u64;
    if p != 0 {
        remember(p, map);
    }
    p
}

fn commit(sample: u64, flags: u64, discard: bool) -> u64 {
    if let Some(rb) = take_ring(sample) {
        // SAFETY: `rb` owns the sample address; commit ignores records that are not
        // reserved (a double submit).
        unsafe { if discard { rb.discard(sample as *mut u8, flags) } else { rb.submit(sample as *mut u8, flags) } }
    }
    0
}

/// `void bpf_ringbuf_submit(data, flags)`.
#[unsafe(link_section = ".text.hot.userbpf")]
unsafe extern "C" fn ringbuf_submit(sample: u64, flags: u64, _: u64, _: u64, _: u64) -> u64 {
    commit(sample, flags, false)
}

/// `void bpf_ringbuf_discard(data, flags)`.
#[unsafe(link_section = ".text.hot.userbpf")]
unsafe extern "C" fn ringbuf_discard(sample: u64, flags: u64, _: u64, _: u64, _: u64) -> u64 {
    commit(sample, flags, true)
}

/// `u64 bpf_ringbuf_query(ringbuf, flags)`: available data, ring size, consumer or producer
/// position; 0 for other flags.
unsafe extern "C" fn ringbuf_query(map: u64, flags: u64, _: u64, _: u64, _: u64) -> u64 {
    let Some((Map::RingBuf(rb), _)) = map_at(map) else { return 0 };
    rb.query(flags)
}

pub(crate) fn register(reg: &mut HelperRegistry) {
    reg.register(helper(25, "perf_event_output", perf_event_output));
    reg.register(helper(130, "ringbuf_output", ringbuf_output));
    reg.register(helper(131, "ringbuf_reserve", ringbuf_reserve));
    reg.register(helper(132, "ringbuf_submit", ringbuf_submit));
    reg.register(helper(133, "ringbuf_discard", ringbuf_discard));
    reg.register(helper(134, "ringbuf_query", ringbuf_query));
}
