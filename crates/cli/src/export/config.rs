//! `userbpf export --config FILE`: which maps become which metrics, in ebpf_exporter's spirit
//! (a YAML file of counters, gauges and histograms, each naming its map, help text and labels
//! decoded from the key), with the key's BTF where ebpf_exporter counts bytes:
//!
//! ```yaml
//! prefix: app_                 # before every metric name (optional)
//! other_maps: false            # also export maps not named here, by the defaults (optional)
//! metrics:
//!   counters:                  # gauges: the same keys
//!     - name: calls_total      # a counter's name gets `_total` if it lacks it
//!       help: Calls per function.
//!       map: counts            # default: the name (without `_total`)
//!       value: hits            # a struct value's member (default: the value's only integer)
//!       labels:
//!         - name: function
//!           field: key         # the key's BTF member (default: the label's name); `key`: all of it
//!           decoders:          # applied in order (default: the BTF's rendering)
//!             - name: uint
//!             - name: static_map
//!               static_map: {0: alpha, 1: beta}
//!               allow_unknown: false
//!   histograms:
//!     - name: latency_seconds
//!       map: hist
//!       bucket_type: log2      # or linear
//!       bucket_multiplier: 0.000000001
//!       bucket_field: slot     # default: the key when it is not a struct, else its last member
//!       labels: []             # the key's other members
//! ```
//!
//! A label reads a BTF member of the key (`field`), or `size` bytes at `offset` (default: where
//! the previous label ended) for keys without BTF, as ebpf_exporter reads them. Decoders: the
//! first of a chain may read the bytes (`uint`, `int`, `hex`, `string`, `inet_ip`, `syscall`:
//! a system call's name from its number); the others rewrite the text (`static_map`: a table,
//! samples whose value is not in it are left out unless `allow_unknown`; `regexp`: only samples
//! whose value matches one of `regexps` are kept). Samples whose labels end up equal are summed.
//!
//! Histograms: slot k of a `log2` map counts values in [2^k, 2^(k+1)) (bpftrace's and BCC's
//! slots; slot 0 holds 0 and 1): `le` = (2^(k+1) - 1) × multiplier; slot k of a `linear` map
//! counts values in [k, k+1) × multiplier: `le` = (k + 1) × multiplier.
//!
//! Everything that can be checked without the session is checked at load: a bad file is an
//! error naming the file, the entry (`metrics.counters[1].labels[0]`) and the problem, before
//! the exporter listens. What needs the map (its presence, its BTF members) is checked at each
//! scrape: a metric that cannot be made is left out and the reason printed once.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use anyhow::{Result, bail};
use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    prefix: String,
    #[serde(default)]
    other_maps: bool,
    metrics: Option<Metrics>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Metrics {
    #[serde(default)]
    counters: Vec<Scalar>,
    #[serde(default)]
    gauges: Vec<Scalar>,
    #[serde(default)]
    histograms: Vec<Hist>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Scalar {
    name: String,
    help: Option<String>,
    map: Option<String>,
    value: Option<String>,
    #[serde(default)]
    labels: Vec<LabelFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Hist {
    name: String,
    help: Option<String>,
    map: Option<String>,
    bucket_type: BucketType,
    #[serde(default = "one")]
    bucket_multiplier: f64,
    bucket_field: Option<String>,
    #[serde(default)]
    labels: Vec<LabelFile>,
}

fn one() -> f64 {
    1.0
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LabelFile {
    name: String,
    field: Option<String>,
    size: Option<usize>,
    offset: Option<usize>,
    #[serde(default)]
    decoders: Vec<DecoderFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DecoderFile {
    name: String,
    static_map: Option<BTreeMap<String, String>>,
    #[serde(default)]
    allow_unknown: bool,
    regexps: Option<Vec<String>>,
}

/// How a histogram's slots map to values.
#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BucketType {
    Log2,
    Linear,
}

/// A metric's kind.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram { buckets: BucketType, multiplier: f64 },
}

/// Where a label's bytes are in the key.
#[derive(Clone, Debug, PartialEq)]
pub enum Source {
    /// A BTF member of the key by name (`key`: the whole key when it is not a struct).
    Field(String),
    /// `size` bytes at `offset` (None: after the previous label).
    Bytes { offset: Option<usize>, size: usize },
}

/// One step of a label's decoding.
#[derive(Clone, Debug)]
pub enum Decoder {
    Uint,
    Int,
    Hex,
    String,
    InetIp,
    Syscall,
    StaticMap { table: BTreeMap<String, String>, allow_unknown: bool },
    Regexp(Vec<regex::Regex>),
}

impl Decoder {
    /// Whether it reads the label's bytes (then it must come first).
    pub fn reads_bytes(&self) -> bool {
        matches!(
            self,
            Decoder::Uint | Decoder::Int | Decoder::Hex | Decoder::String | Decoder::InetIp | Decoder::Syscall
        )
    }
}

#[derive(Clone, Debug)]
pub struct Label {
    pub name: String,
    pub source: Source,
    pub decoders: Vec<Decoder>,
}

#[derive(Clone, Debug)]
pub struct Metric {
    /// Full name (prefix included).
    pub name: String,
    pub help: String,
    pub map: String,
    pub kind: Kind,
    /// The value's member (counters, gauges).
    pub value: Option<String>,
    /// The key's member holding the slot (histograms).
    pub bucket_field: Option<String>,
    pub labels: Vec<Label>,
    /// Where in the file it was defined (`metrics.counters[0]`), for messages.
    pub at: String,
}

#[derive(Clone, Debug, Default)]
pub struct Config {
    pub metrics: Vec<Metric>,
    /// Maps the config does not name are exported by the defaults too.
    pub other_maps: bool,
}

impl Config {
    /// Whether map `name` is named by a metric.
    pub fn names_map(&self, name: &str) -> bool {
        self.metrics.iter().any(|m| m.map == name)
    }
}

/// Whether `s` is a valid Prometheus metric name (`[a-zA-Z_:][a-zA-Z0-9_:]*`).
fn metric_name_ok(s: &str) -> bool {
    let mut c = s.chars();
    c.next().is_some_and(|f| f.is_ascii_alphabetic() || f == '_' || f == ':')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_' || x == ':')
}

/// Whether `s` is a valid label name (`[a-zA-Z_][a-zA-Z0-9_]*`, not starting with `__`).
fn label_name_ok(s: &str) -> bool {
    let mut c = s.chars();
    c.next().is_some_and(|f| f.is_ascii_alphabetic() || f == '_')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_')
        && !s.starts_with("__")
}

/// Reads and checks a config file.
pub fn load(path: &Path) -> Result<Config> {
    let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

/// Parses and checks the text of a config file (errors name the entry and the problem).
pub fn parse(text: &str) -> Result<Config> {
    let file: File = serde_yaml::from_str(text).map_err(|e| anyhow::anyhow!("{e}"))?;
    let Some(metrics) = file.metrics else {
        bail!(
            "no `metrics` section: name the maps to export under metrics.counters, metrics.gauges or metrics.histograms"
        )
    };
    let mut out = Config { metrics: Vec::new(), other_maps: file.other_maps };
    let scalars = metrics
        .counters
        .into_iter()
        .enumerate()
        .map(|(i, m)| (format!("metrics.counters[{i}]"), Kind::Counter, m))
        .chain(metrics.gauges.into_iter().enumerate().map(|(i, m)| (format!("metrics.gauges[{i}]"), Kind::Gauge, m)));
    for (at, kind, m) in scalars {
        let mut name = format!("{}{}", file.prefix, m.name);
        let map = m.map.clone().unwrap_or_else(|| m.name.strip_suffix("_total").unwrap_or(&m.name).to_string());
        if kind == Kind::Counter && !name.ends_with("_total") {
            name.push_str("_total");
        }
        check_name(&at, &name)?;
        let labels = labels(&at, m.labels, false)?;
        let help = m.help.unwrap_or_else(|| format!("Values of map {map}."));
        out.metrics.push(Metric { name, help, map, kind, value: m.value, bucket_field: None, labels, at });
    }
    for (i, h) in metrics.histograms.into_iter().enumerate() {
        let at = format!("metrics.histograms[{i}]");
        let name = format!("{}{}", file.prefix, h.name);
        check_name(&at, &name)?;
        if !(h.bucket_multiplier.is_finite() && h.bucket_multiplier > 0.0) {
            bail!("{at}: bucket_multiplier {} must be a positive number", h.bucket_multiplier);
        }
        let labels = labels(&at, h.labels, true)?;
        if let Some(b) = &h.bucket_field
            && labels.iter().any(|l| l.source == Source::Field(b.clone()))
        {
            bail!("{at}: bucket_field `{b}` is also a label");
        }
        let map = h.map.clone().unwrap_or_else(|| h.name.clone());
        let help = h.help.unwrap_or_else(|| format!("Histogram map {map}."));
        out.metrics.push(Metric {
            name,
            help,
            map,
            kind: Kind::Histogram { buckets: h.bucket_type, multiplier: h.bucket_multiplier },
            value: None,
            bucket_field: h.bucket_field,
            labels,
            at,
        });
    }
    let mut seen = HashSet::new();
    for m in &out.metrics {
        if !seen.insert(m.name.clone()) {
            bail!("{}: metric name `{}` is used twice", m.at, m.name);
        }
    }
    if out.metrics.is_empty() {
        bail!("`metrics` names no map: add entries under metrics.counters, metrics.gauges or metrics.histograms");
    }
    Ok(out)
}

fn check_name(at: &str, name: &str) -> Result<()> {
    if !metric_name_ok(name) {
        bail!(
            "{at}: `{name}` is not a Prometheus metric name (letters, digits, `_` and `:`, not starting with a digit)"
        );
    }
    if name.starts_with("userbpf_") {
        bail!("{at}: `{name}`: names starting with `userbpf_` are the exporter's own");
    }
    Ok(())
}

fn labels(at: &str, list: Vec<LabelFile>, histogram: bool) -> Result<Vec<Label>> {
    let mut out: Vec<Label> = Vec::new();
    for (i, l) in list.into_iter().enumerate() {
        let at = format!("{at}.labels[{i}]");
        if !label_name_ok(&l.name) {
            bail!(
                "{at}: `{}` is not a Prometheus label name (letters, digits and `_`, not starting with a digit or `__`)",
                l.name
            );
        }
        if histogram && l.name == "le" {
            bail!("{at}: `le` is the histogram's own label");
        }
        if out.iter().any(|o| o.name == l.name) {
            bail!("{at}: label `{}` is defined twice", l.name);
        }
        let source = match (l.field, l.size) {
            (Some(_), Some(_)) => bail!("{at}: give `field` (a BTF member of the key) or `size` (bytes), not both"),
            (Some(f), None) => {
                if l.offset.is_some() {
                    bail!("{at}: `offset` goes with `size`, not with `field`");
                }
                Source::Field(f)
            }
            (None, Some(size)) => {
                if size == 0 || size > 64 {
                    bail!("{at}: size {size}: a label reads 1 to 64 bytes");
                }
                Source::Bytes { offset: l.offset, size }
            }
            (None, None) => {
                if l.offset.is_some() {
                    bail!("{at}: `offset` needs `size`");
                }
                Source::Field(l.name.clone())
            }
        };
        let mut decoders = Vec::new();
        for (j, d) in l.decoders.into_iter().enumerate() {
            let dat = format!("{at}.decoders[{j}]");
            let extra = |what: &str, present: bool| -> Result<()> {
                if present {
                    bail!("{dat}: `{what}` belongs to the {what} decoder, not to `{}`", d.name);
                }
                Ok(())
            };
            if d.name != "static_map" {
                extra("static_map", d.static_map.is_some())?;
                if d.allow_unknown {
                    bail!("{dat}: `allow_unknown` belongs to the static_map decoder, not to `{}`", d.name);
                }
            }
            if d.name != "regexp" {
                extra("regexps", d.regexps.is_some())?;
            }
            let dec = match d.name.as_str() {
                "uint" => Decoder::Uint,
                "int" => Decoder::Int,
                "hex" => Decoder::Hex,
                "string" => Decoder::String,
                "inet_ip" => Decoder::InetIp,
                "syscall" => Decoder::Syscall,
                "static_map" => {
                    let Some(table) = d.static_map else {
                        bail!("{dat}: the static_map decoder needs a `static_map` table")
                    };
                    Decoder::StaticMap { table, allow_unknown: d.allow_unknown }
                }
                "regexp" => {
                    let Some(res) = d.regexps.filter(|r| !r.is_empty()) else {
                        bail!("{dat}: the regexp decoder needs a non-empty `regexps` list")
                    };
                    let mut v = Vec::new();
                    for (k, r) in res.iter().enumerate() {
                        v.push(regex::Regex::new(r).map_err(|e| anyhow::anyhow!("{dat}.regexps[{k}]: {e}"))?);
                    }
                    Decoder::Regexp(v)
                }
                other => bail!(
                    "{dat}: unknown decoder `{other}` (known: uint, int, hex, string, inet_ip, syscall, static_map, regexp)"
                ),
            };
            if dec.reads_bytes() && j > 0 {
                bail!("{dat}: `{}` reads the key's bytes, so it comes first in the list", d.name);
            }
            if let (Decoder::InetIp, Source::Bytes { size, .. }) = (&dec, &source)
                && *size != 4
                && *size != 16
            {
                bail!("{dat}: inet_ip reads 4 (IPv4) or 16 (IPv6) bytes, not {size}");
            }
            if let (Decoder::Uint | Decoder::Int | Decoder::Syscall, Source::Bytes { size, .. }) = (&dec, &source)
                && !matches!(size, 1 | 2 | 4 | 8)
            {
                bail!("{dat}: {} reads 1, 2, 4 or 8 bytes, not {size}", d.name);
            }
            decoders.push(dec);
        }
        out.push(Label { name: l.name, source, decoders });
    }
    Ok(out)
}

/// The integer of 1, 2, 4 or 8 bytes (native order).
fn uint_of(b: &[u8]) -> Option<u64> {
    Some(match b.len() {
        1 => b[0] as u64,
        2 => u16::from_ne_bytes(b.try_into().ok()?) as u64,
        4 => u32::from_ne_bytes(b.try_into().ok()?) as u64,
        8 => u64::from_ne_bytes(b.try_into().ok()?),
        _ => return None,
    })
}

fn int_of(b: &[u8]) -> Option<i64> {
    Some(match b.len() {
        1 => b[0] as i8 as i64,
        2 => i16::from_ne_bytes(b.try_into().ok()?) as i64,
        4 => i32::from_ne_bytes(b.try_into().ok()?) as i64,
        8 => i64::from_ne_bytes(b.try_into().ok()?),
        _ => return None,
    })
}

/// Decodes a label: `bytes` are the label's bytes in the key, `text` what the key's BTF
/// renders them as. None: the sample is left out (a static_map miss, no regexp match);
/// Err: the decoder cannot read these bytes.
pub fn decode(decoders: &[Decoder], bytes: &[u8], text: String) -> Result<Option<String>, String> {
    let mut v = text;
    for d in decoders {
        v = match d {
            Decoder::Uint => {
                uint_of(bytes).ok_or_else(|| format!("uint reads 1, 2, 4 or 8 bytes, not {}", bytes.len()))?.to_string()
            }
            Decoder::Int => {
                int_of(bytes).ok_or_else(|| format!("int reads 1, 2, 4 or 8 bytes, not {}", bytes.len()))?.to_string()
            }
            Decoder::Hex => match uint_of(bytes) {
                Some(x) => format!("{x:#x}"),
                None => bytes.iter().map(|b| format!("{b:02x}")).collect(),
            },
            Decoder::String => {
                let n = bytes.iter().position(|&c| c == 0).unwrap_or(bytes.len());
                String::from_utf8_lossy(&bytes[..n]).into_owned()
            }
            Decoder::InetIp => match bytes.len() {
                4 => std::net::Ipv4Addr::from(<[u8; 4]>::try_from(bytes).unwrap_or_default()).to_string(),
                16 => std::net::Ipv6Addr::from(<[u8; 16]>::try_from(bytes).unwrap_or_default()).to_string(),
                n => return Err(format!("inet_ip reads 4 or 16 bytes, not {n}")),
            },
            Decoder::Syscall => {
                let nr =
                    uint_of(bytes).ok_or_else(|| format!("syscall reads 1, 2, 4 or 8 bytes, not {}", bytes.len()))?;
                u32::try_from(nr)
                    .ok()
                    .and_then(userbpf_hook::syscalls::name)
                    .map(str::to_string)
                    .unwrap_or_else(|| format!("syscall_{nr}"))
            }
            Decoder::StaticMap { table, allow_unknown } => match table.get(&v) {
                Some(x) => x.clone(),
                None if *allow_unknown => v,
                None => return Ok(None),
            },
            Decoder::Regexp(res) => {
                if !res.iter().any(|r| r.is_match(&v)) {
                    return Ok(None);
                }
                v
            }
        };
    }
    Ok(Some(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        format!("{:#}", parse(text).unwrap_err())
    }

    #[test]
    fn a_full_config_parses() {
        let c = parse(
            "prefix: app_\nmetrics:\n  counters:\n    - name: calls\n      map: counts\n      labels:\n        - name: function\n          field: key\n          decoders:\n            - name: uint\n            - name: static_map\n              static_map: {0: alpha, 1: beta}\n  histograms:\n    - name: latency_seconds\n      map: hist\n      bucket_type: log2\n      bucket_multiplier: 0.000000001\n",
        )
        .unwrap();
        assert_eq!(c.metrics.len(), 2);
        assert_eq!(c.metrics[0].name, "app_calls_total");
        assert_eq!(c.metrics[0].map, "counts");
        assert_eq!(c.metrics[0].labels[0].source, Source::Field("key".into()));
        assert_eq!(c.metrics[1].kind, Kind::Histogram { buckets: BucketType::Log2, multiplier: 1e-9 });
        assert!(!c.other_maps);
    }

    #[test]
    fn bad_configs_name_the_entry_and_the_problem() {
        let e = err("metrics:\n  counters:\n    - name: x\n      nmae: y\n");
        assert!(e.contains("unknown field `nmae`"), "{e}");
        let e = err(
            "metrics:\n  counters:\n    - name: x\n      labels:\n        - name: f\n          decoders:\n            - name: bogus\n",
        );
        assert!(e.contains("metrics.counters[0].labels[0].decoders[0]: unknown decoder `bogus`"), "{e}");
        let e = err("metrics:\n  gauges:\n    - name: 9x\n");
        assert!(e.contains("metrics.gauges[0]: `9x` is not a Prometheus metric name"), "{e}");
        let e = err("metrics:\n  histograms:\n    - name: h\n      bucket_type: cubic\n");
        assert!(e.contains("unknown variant `cubic`"), "{e}");
        let e = err("metrics:\n  histograms:\n    - name: h\n      bucket_type: log2\n      bucket_multiplier: -1\n");
        assert!(e.contains("metrics.histograms[0]: bucket_multiplier -1 must be a positive number"), "{e}");
        let e = err(
            "metrics:\n  counters:\n    - name: x\n      labels:\n        - name: f\n          decoders:\n            - name: static_map\n            - name: uint\n",
        );
        assert!(e.contains("decoders[0]: the static_map decoder needs a `static_map` table"), "{e}");
        let e = err(
            "metrics:\n  counters:\n    - name: x\n      labels:\n        - name: f\n          decoders:\n            - name: regexp\n              regexps: ['(']\n",
        );
        assert!(e.contains("metrics.counters[0].labels[0].decoders[0].regexps[0]: regex parse error"), "{e}");
        let e = err("metrics:\n  counters:\n    - name: a\n    - name: a_total\n");
        assert!(e.contains("metrics.counters[1]: metric name `a_total` is used twice"), "{e}");
        let e = err("metrics: {}\n");
        assert!(e.contains("names no map"), "{e}");
    }

    #[test]
    fn the_demo_config_parses() {
        let c = parse(include_str!("../../../../examples/export/latency.yaml")).unwrap();
        let names: Vec<&str> = c.metrics.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["app_slowest_call", "app_call_latency_seconds"]);
    }

    #[test]
    fn decoders_chain() {
        let map = Decoder::StaticMap { table: [("1".to_string(), "one".to_string())].into(), allow_unknown: false };
        assert_eq!(decode(&[Decoder::Uint, map.clone()], &1u32.to_ne_bytes(), String::new()), Ok(Some("one".into())));
        assert_eq!(decode(&[Decoder::Uint, map], &2u32.to_ne_bytes(), String::new()), Ok(None));
        assert_eq!(decode(&[Decoder::InetIp], &[127, 0, 0, 1], String::new()), Ok(Some("127.0.0.1".into())));
        assert_eq!(decode(&[Decoder::String], b"ab\0cd", String::new()), Ok(Some("ab".into())));
        assert_eq!(decode(&[Decoder::Int], &(-3i16).to_ne_bytes(), String::new()), Ok(Some("-3".into())));
        assert_eq!(decode(&[Decoder::Syscall], &257u64.to_ne_bytes(), String::new()), Ok(Some("openat".into())));
        let re = Decoder::Regexp(vec![regex::Regex::new("^tt_").unwrap()]);
        assert_eq!(decode(std::slice::from_ref(&re), &[], "tt_alpha".into()), Ok(Some("tt_alpha".into())));
        assert_eq!(decode(&[re], &[], "main".into()), Ok(None));
        assert!(decode(&[Decoder::Uint], &[1, 2, 3], String::new()).is_err());
    }
}
