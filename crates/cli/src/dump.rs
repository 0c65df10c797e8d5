//! Printing maps: every key and value, laid out by their BTF types when the map has them
//! (structs, arrays, char arrays as strings, enums by name), per-CPU values CPU by CPU; raw
//! hex bytes otherwise. Text for people, JSON (`--json`, bpftool's shape) for scripts.

use serde_json::{json, Value as Json};
use userbpf_maps::{Map, MapType};
use userbpf_object::btf::format::{format_value, to_json};
use userbpf_object::Btf;

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
                let vals: Vec<String> = per_cpu(map, v).iter().enumerate().map(|(c, v)| format!("cpu{c} = {}", text(t, t.value_type, v))).collect();
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
                    let vals: Vec<Json> = per_cpu(map, v).iter().enumerate().map(|(c, v)| json!({"cpu": c, "value": js(t, t.value_type, v)})).collect();
                    json!({"key": js(t, t.key_type, k), "values": vals})
                } else {
                    json!({"key": js(t, t.key_type, k), "value": js(t, t.value_type, v)})
                }
            })
            .collect(),
    )
}
