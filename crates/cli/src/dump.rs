//! Printing maps: every key and value, laid out by their BTF types when the map has them
//! (structs, arrays, char arrays as strings, enums by name), per-CPU values CPU by CPU; raw
//! hex bytes otherwise. Text for people, JSON (`--json`, bpftool's shape) for scripts, and
//! for log2 histogram maps ([`is_log2_hist`]) bpftrace's bars, as text or (`--svg`, drawn by
//! crate `userbpf-plot`) as a chart.

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
