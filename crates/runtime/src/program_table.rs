//! Programs of this process by id, for helpers that name a program by id at run time
//! (`bpf_tail_call` through a prog array). Reads are lock-free: a fixed open-addressing
//! table of (id, pointer) pairs written once per program.
//!
//! A registered program stays alive until the process exits (its `Arc` is leaked into the
//! table): a run on another thread may still be using it, and nothing on the hot path can
//! tell when it stops.

use std::sync::Arc;
use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};

use crate::program::LoadedProgram;

const SLOTS: usize = 4096;

struct Slot {
    id: AtomicU32,
    prog: AtomicPtr<LoadedProgram>,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Slot = Slot { id: AtomicU32::new(0), prog: AtomicPtr::new(std::ptr::null_mut()) };
static TABLE: [Slot; SLOTS] = [EMPTY; SLOTS];

/// How many programs the table holds (for the process's life).
pub const MAX_PROGRAMS: usize = SLOTS;

/// Why [`register`] failed, for an error message.
pub fn full_message(name: &str) -> String {
    format!(
        "program `{name}`: this process already holds {MAX_PROGRAMS} programs (they stay mapped while it lives), \
         no room for another"
    )
}

/// Makes `prog` findable by its id. Returns false if the table is full (4096 programs).
pub fn register(prog: Arc<LoadedProgram>) -> bool {
    let id = prog.id;
    if id == 0 {
        return false;
    }
    let start = (id as usize).wrapping_mul(0x9e37_79b9) % SLOTS;
    for k in 0..SLOTS {
        let slot = &TABLE[(start + k) % SLOTS];
        match slot.id.compare_exchange(0, id, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {
                slot.prog.store(Arc::into_raw(prog) as *mut LoadedProgram, Ordering::Release);
                return true;
            }
            Err(existing) if existing == id => {
                slot.prog.store(Arc::into_raw(prog) as *mut LoadedProgram, Ordering::Release);
                return true;
            }
            Err(_) => {}
        }
    }
    false
}

/// The program with this id in this process.
pub fn get(id: u32) -> Option<&'static LoadedProgram> {
    if id == 0 {
        return None;
    }
    let start = (id as usize).wrapping_mul(0x9e37_79b9) % SLOTS;
    for k in 0..SLOTS {
        let slot = &TABLE[(start + k) % SLOTS];
        match slot.id.load(Ordering::Acquire) {
            0 => return None,
            x if x == id => {
                let p = slot.prog.load(Ordering::Acquire);
                // SAFETY: pointers in the table come from Arc::into_raw and are never freed.
                return unsafe { p.as_ref() };
            }
            _ => {}
        }
    }
    None
}
