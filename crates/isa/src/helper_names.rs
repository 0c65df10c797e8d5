//! The kernel's helper ids and names. (placeholder, being written)

/// The kernel's name of helper `id` (without the `bpf_` prefix), if it has one.
pub fn helper_name(_id: u32) -> Option<&'static str> {
    None
}
