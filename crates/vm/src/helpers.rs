//! Helper functions callable by `call IMM` (and `callx REG`), registered by id.

use std::fmt;

/// A helper as the VM calls it: r1..r5 in, r0 out, the C calling convention (which is also
/// how the JIT calls it, directly).
pub type HelperFn = unsafe extern "C" fn(u64, u64, u64, u64, u64) -> u64;

/// One registered helper.
#[derive(Clone, Copy)]
pub struct Helper {
    /// The kernel's id (`BPF_FUNC_*`), or an id of userbpf's own above the kernel's range.
    pub id: u32,
    /// The name without `bpf_`, as the kernel spells it (`map_lookup_elem`).
    pub name: &'static str,
    pub func: HelperFn,
    /// The helper may end the run: it calls [`request_exit`](crate::request_exit)
    /// (`bpf_tail_call`) or runs callbacks with [`callback::invoke`](crate::callback::invoke)
    /// (`bpf_loop`, `bpf_for_each_map_elem`, ...), whose errors end the run. After such a
    /// helper returns, both executors check for a pending exit or error and, if there is one,
    /// end the run at once (every frame). Other helpers cost nothing extra.
    pub may_exit: bool,
}

impl Helper {
    /// A helper that does not end the run (`may_exit` false).
    pub const fn new(id: u32, name: &'static str, func: HelperFn) -> Helper {
        Helper { id, name, func, may_exit: false }
    }
}

impl fmt::Debug for Helper {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Helper({} bpf_{}{})", self.id, self.name, if self.may_exit { ", may exit" } else { "" })
    }
}

/// Helpers by id. Ids are small (the kernel's run to about 220), so the table is dense: a
/// lookup is one index, and the JIT's `callx` reads the same table.
#[derive(Clone, Default, Debug)]
pub struct HelperRegistry {
    by_id: Vec<Option<Helper>>,
    /// `fn_table[id]` = address of the helper, or 0. Read by JIT code for `callx`.
    fn_table: Vec<usize>,
}

/// Largest helper id a registry accepts.
pub const MAX_HELPER_ID: u32 = 1 << 16;

impl HelperRegistry {
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers (or replaces) a helper.
    ///
    /// # Panics
    /// If `helper.id` is above [`MAX_HELPER_ID`]: ids are chosen by code, not by input.
    pub fn register(&mut self, helper: Helper) {
        assert!(helper.id <= MAX_HELPER_ID, "helper id {} too large", helper.id);
        let id = helper.id as usize;
        if self.by_id.len() <= id {
            self.by_id.resize(id + 1, None);
            self.fn_table.resize(id + 1, 0);
        }
        self.fn_table[id] = helper.func as usize;
        self.by_id[id] = Some(helper);
    }

    pub fn get(&self, id: u32) -> Option<&Helper> {
        self.by_id.get(id as usize).and_then(|h| h.as_ref())
    }

    /// The helper for a runtime id (as `callx` has it in a register).
    pub fn get_u64(&self, id: u64) -> Option<&Helper> {
        usize::try_from(id).ok().and_then(|i| self.by_id.get(i)).and_then(|h| h.as_ref())
    }

    pub fn iter(&self) -> impl Iterator<Item = &Helper> {
        self.by_id.iter().flatten()
    }

    /// Dense table of helper addresses by id (0 where none), for JIT code.
    pub fn fn_table(&self) -> &[usize] {
        &self.fn_table
    }
}
