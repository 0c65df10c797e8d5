//! Printing maps: every key and value, laid out by their BTF types when the map has them
//! (structs, arrays, char arrays as strings, enums by name), per-CPU values CPU by CPU; raw
//! hex bytes otherwise. Text for people, JSON (`--json`, bpftool's shape) for scripts, and
//! for log2 histogram maps bpftrace's bars, as text or (`--svg`, drawn by crate
//! `userbpf-plot`) as charts: [`hist_layout`] recognises the arrays of counters named `*hist*`
//! and, from BTF, maps of one histogram per key (a value struct with a `slots` array, as
//! libbpf-tools keep them; a key struct with a `slot` member).

use serde_json::{Value as Json, json};
use userbpf_maps::{Map, MapType};
use userbpf_object::Btf;
use userbpf_object::btf::format::{format_value, to_json};

/// How to print one map's keys and values.
pub struct Typed<'a> {
    pub btf: Option<&'a Btf>,
    pub key_type: Option<u32>,
    pub value_type: Option<u32>,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect::<Vec<_>>().join(" ")
}

fn text(t: &Typed<'_>, ty: Option<u32>, data: &[u8]) -> String {
    match (t.btf, ty) {
        (Some(btf), Some(id)) => format_value(btf, id, data).unwrap_or_else(|_| hex(data)),
        // Keys of arrays (global data sections have no key type) are indices.
        (_, None) if data.len() == 4 => u32::from_ne_bytes([data[0], data[1], data[2], data[3]]).to_string(),
        _ => hex(data),
    }
}

fn js(t: &Typed<'_>, ty: Option<u32>, data: &[u8]) -> Json {
    match (t.btf, ty) {
        (Some(btf), Some(id)) => to_json(btf, id, data).unwrap_or_else(|_| json!(hex(data))),
        _ => json!(data.iter().map(|b| format!("{b:#04x}")).collect::<Vec<_>>()),
    }
}

/// Whether a map type has keys to iterate.
pub fn iterable(map: &Map) -> bool {
    !matches!(
        map.map_type(),
        MapType::BPF_MAP_TYPE_RINGBUF
            | MapType::BPF_MAP_TYPE_PERF_EVENT_ARRAY
            | MapType::BPF_MAP_TYPE_QUEUE
            | MapType::BPF_MAP_TYPE_STACK
            | MapType::BPF_MAP_TYPE_BLOOM_FILTER
    )
}

/// Every (key, value) of a map; per-CPU values are the concatenated per-CPU slots.
pub fn entries(map: &Map) -> Vec<(Vec<u8>, Vec<u8>)> {
    let spec = map.spec();
    let mut out = Vec::new();
    if !iterable(map) {
        return out;
    }
    let mut key: Option<Vec<u8>> = None;
    let mut next = vec![0u8; spec.key_size as usize];
    // Bounded: at most max_entries keys (plus slack for concurrent inserts).
    for _ in 0..(spec.max_entries as u64 + 16) {
        if map.get_next_key(key.as_deref(), &mut next).is_err() {
            break;
        }
        let mut value = vec![0u8; map.value_buf_size()];
        if map.lookup_elem(&next, &mut value).is_ok() {
            out.push((next.clone(), value));
        }
        key = Some(next.clone());
    }
    out
}

fn per_cpu(map: &Map, value: &[u8]) -> Vec<Vec<u8>> {
    let vs = map.spec().value_size as usize;
    let stride = vs.div_ceil(8) * 8;
    (0..map.nr_cpus() as usize).map(|c| value[c * stride..c * stride + vs].to_vec()).collect()
}

/// The map as text lines: `key = K, value = V` (per-CPU: `values = { cpu0 = V, ... }`).
pub fn dump_text(map: &Map, t: &Typed<'_>) -> Vec<String> {
    if !iterable(map) {
        return vec![format!("({} maps have no keys to print)", map.map_type().name())];
    }
    let percpu = map.map_type().is_percpu();
    entries(map)
        .iter()
        .map(|(k, v)| {
            let key = text(t, t.key_type, k);
            if percpu {
                let vals: Vec<String> = per_cpu(map, v)
                    .iter()
                    .enumerate()
                    .map(|(c, v)| format!("cpu{c} = {}", text(t, t.value_type, v)))
                    .collect();
                format!("key = {key}, values = {{ {} }}", vals.join(", "))
            } else {
                format!("key = {key}, value = {}", text(t, t.value_type, v))
            }
        })
        .collect()
}

/// The map as bpftool's JSON: `[{"key": K, "value": V}]`, per-CPU `"values": [{"cpu": N, "value": V}]`.
pub fn dump_json(map: &Map, t: &Typed<'_>) -> Json {
    let percpu = map.map_type().is_percpu();
    Json::Array(
        entries(map)
            .iter()
            .map(|(k, v)| {
                if percpu {
                    let vals: Vec<Json> = per_cpu(map, v)
                        .iter()
                        .enumerate()
                        .map(|(c, v)| json!({"cpu": c, "value": js(t, t.value_type, v)}))
                        .collect();
                    json!({"key": js(t, t.key_type, k), "values": vals})
                } else {
                    json!({"key": js(t, t.key_type, k), "value": js(t, t.value_type, v)})
                }
            })
            .collect(),
    )
}

/// Whether a map holds a log2 histogram as bpftrace keeps one: an array (per-CPU or not) of
/// 8-byte counters keyed by slot, with `hist` in its name. Slot k counts values in
/// [2^k, 2^(k+1)) (slot 0: 0 and 1).
pub fn is_log2_hist(map: &Map) -> bool {
    let s = map.spec();
    matches!(map.map_type(), MapType::BPF_MAP_TYPE_ARRAY | MapType::BPF_MAP_TYPE_PERCPU_ARRAY)
        && s.key_size == 4
        && s.value_size == 8
        && s.name.contains("hist")
}

fn slot_bound(k: u32) -> String {
    let v = 1u64.checked_shl(k).unwrap_or(u64::MAX);
    match v {
        v if v >= 1 << 30 && v % (1 << 30) == 0 => format!("{}G", v >> 30),
        v if v >= 1 << 20 && v % (1 << 20) == 0 => format!("{}M", v >> 20),
        v if v >= 1 << 10 && v % (1 << 10) == 0 => format!("{}K", v >> 10),
        v => v.to_string(),
    }
}

/// How a map holds log2 histograms (slot k: values in [2^k, 2^(k+1)), slot 0: 0 and 1).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum HistLayout {
    /// [`is_log2_hist`]: the whole map is one histogram, keyed by slot.
    Array,
    /// The value is a struct with an integer array member `slots` (libbpf-tools' `struct
    /// hist`): one histogram per key. `offset`/`elem` in bytes, `n` slots.
    ValueSlots { offset: usize, elem: usize, n: usize },
    /// The key is a struct with an integer member `slot` and the value an integer (a keyed
    /// `hist()`, iolatency's `hist_key`): one histogram per key without its slot.
    KeySlot { offset: usize, size: usize },
}

fn int_size(btf: &Btf, id: u32) -> Option<usize> {
    let t = btf.resolve(id).ok()?;
    t.int().map(|i| i.size as usize).filter(|s| matches!(s, 1 | 2 | 4 | 8))
}

fn le_uint(b: &[u8]) -> u64 {
    let mut x = [0u8; 8];
    x[..b.len().min(8)].copy_from_slice(&b[..b.len().min(8)]);
    u64::from_ne_bytes(x)
}

/// Whether (and how) a map holds log2 histograms, from its shape and BTF.
pub fn hist_layout(map: &Map, t: &Typed<'_>) -> Option<HistLayout> {
    if is_log2_hist(map) {
        return Some(HistLayout::Array);
    }
    if !iterable(map) {
        return None;
    }
    let btf = t.btf?;
    let spec = map.spec();
    if let Some(vt) = t.value_type
        && let Some((m, bits)) = btf.find_member(vt, "slots")
        && bits % 8 == 0
        && m.bitfield_size == 0
        && let Some(a) = btf.resolve(m.type_id).ok().and_then(|x| x.array())
        && let Some(elem) = int_size(btf, a.elem_type)
        && (bits / 8) as usize + elem * a.nelems as usize <= spec.value_size as usize
        && a.nelems > 0
    {
        return Some(HistLayout::ValueSlots { offset: (bits / 8) as usize, elem, n: a.nelems as usize });
    }
    if let Some(kt) = t.key_type
        && let Some((m, bits)) = btf.find_member(kt, "slot")
        && bits % 8 == 0
        && m.bitfield_size == 0
        && let Some(size) = int_size(btf, m.type_id)
        && (bits / 8) as usize + size <= spec.key_size as usize
        && matches!(spec.value_size, 4 | 8)
    {
        return Some(HistLayout::KeySlot { offset: (bits / 8) as usize, size });
    }
    None
}

/// The histograms of a map laid out as `layout`: (title, counts by slot), per-CPU counts
/// summed, in the order of the keys' bytes. Titles: the key as text (for [`HistLayout::KeySlot`], its members
/// other than `slot`); empty for [`HistLayout::Array`].
pub fn histograms(map: &Map, t: &Typed<'_>, layout: HistLayout) -> Vec<(String, Vec<u64>)> {
    let percpu = map.map_type().is_percpu();
    let values = |v: &[u8]| if percpu { per_cpu(map, v) } else { vec![v[..map.spec().value_size as usize].to_vec()] };
    let mut out: Vec<(String, Vec<u64>)> = Vec::new();
    match layout {
        HistLayout::Array => out.push((String::new(), log2_counts(map))),
        HistLayout::ValueSlots { offset, elem, n } => {
            let mut all = entries(map);
            all.sort();
            for (k, v) in all {
                let mut slots = vec![0u64; n];
                for v in values(&v) {
                    for (i, c) in slots.iter_mut().enumerate() {
                        *c += le_uint(&v[offset + i * elem..offset + (i + 1) * elem]);
                    }
                }
                out.push((text(t, t.key_type, &k), slots));
            }
        }
        HistLayout::KeySlot { offset, size } => {
            let btf = t.btf;
            let key_type = t.key_type;
            let mut by_key: Vec<(Vec<u8>, Vec<u64>)> = Vec::new();
            for (k, v) in entries(map) {
                let slot = le_uint(&k[offset..offset + size]) as usize;
                if slot >= 128 {
                    continue; // not a log2 slot of a 64-bit value
                }
                let mut rest = k.clone();
                rest[offset..offset + size].fill(0);
                let count: u64 = values(&v).iter().map(|v| le_uint(v)).sum();
                let i = match by_key.iter().position(|(r, _)| *r == rest) {
                    Some(i) => i,
                    None => {
                        by_key.push((rest.clone(), Vec::new()));
                        by_key.len() - 1
                    }
                };
                let slots = &mut by_key[i].1;
                if slots.len() <= slot {
                    slots.resize(slot + 1, 0);
                }
                slots[slot] += count;
            }
            by_key.sort();
            for (rest, slots) in by_key {
                // The key's members but the slot, as `{ .func = 1, .dev = 7 }`.
                let members: Vec<String> = match (btf, key_type) {
                    (Some(btf), Some(kt)) => btf
                        .members(kt)
                        .iter()
                        .filter(|m| btf.name_of(m.name_off) != "slot" && m.bit_offset % 8 == 0)
                        .filter_map(|m| {
                            let off = (m.bit_offset / 8) as usize;
                            let size = btf.resolve_size(m.type_id).ok()? as usize;
                            let v = format_value(btf, m.type_id, rest.get(off..off + size)?).ok()?;
                            Some(format!(".{} = {v}", btf.name_of(m.name_off)))
                        })
                        .collect(),
                    _ => Vec::new(),
                };
                out.push((format!("{{ {} }}", members.join(", ")), slots));
            }
        }
    }
    out
}

/// The counts of a log2 histogram map ([`is_log2_hist`]) by slot, per-CPU slots summed.
pub fn log2_counts(map: &Map) -> Vec<u64> {
    let mut slots = Vec::new();
    for (k, v) in entries(map) {
        let slot = u32::from_ne_bytes([k[0], k[1], k[2], k[3]]) as usize;
        if slots.len() <= slot {
            slots.resize(slot + 1, 0);
        }
        slots[slot] += v.chunks(8).map(|c| u64::from_ne_bytes(c.try_into().unwrap_or([0; 8]))).sum::<u64>();
    }
    slots
}

/// Draws a log2 histogram map the way bpftrace prints `hist()`: one line per slot from the
/// first to the last non-empty one, `[lo, hi)  count |@@@@   |`, bars 52 wide.
pub fn hist_lines(map: &Map) -> Vec<String> {
    let counts: Vec<(u32, u64)> = entries(map)
        .iter()
        .map(|(k, v)| {
            let slot = u32::from_ne_bytes([k[0], k[1], k[2], k[3]]);
            let total = v.chunks(8).map(|c| u64::from_ne_bytes(c.try_into().unwrap_or([0; 8]))).sum();
            (slot, total)
        })
        .collect();
    hist_lines_of(&counts)
}

/// [`hist_lines`] of log2 slot counts `(slot, count)` in slot order, wherever they come from.
pub fn hist_lines_of(counts: &[(u32, u64)]) -> Vec<String> {
    let Some(first) = counts.iter().position(|&(_, c)| c > 0) else { return Vec::new() };
    let last = counts.iter().rposition(|&(_, c)| c > 0).unwrap_or(first);
    let max = counts.iter().map(|&(_, c)| c).max().unwrap_or(1).max(1);
    counts[first..=last]
        .iter()
        .map(|&(k, c)| {
            let range =
                if k == 0 { "[0, 2)".to_string() } else { format!("[{}, {})", slot_bound(k), slot_bound(k + 1)) };
            let bar = "@".repeat((c * 52 / max) as usize);
            format!("{range:<16} {c:>8} |{bar:<52}|")
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::slot_bound;

    #[test]
    fn slot_names_as_bpftrace_prints_them() {
        assert_eq!(slot_bound(3), "8");
        assert_eq!(slot_bound(10), "1K");
        assert_eq!(slot_bound(21), "2M");
        assert_eq!(slot_bound(31), "2G");
    }
}
