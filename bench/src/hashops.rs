//! `hashop-bench`: a hash map's program-side operations called directly (the functions the
//! JIT calls, `userbpf_maps::hash::ProgOps`), in BCC sslsniff's pattern, for instruction
//! counts under callgrind and nanoseconds per operation outside it.
//!
//! sslsniff's probes on `SSL_read`/`SSL_write` use two `BPF_HASH`es with 4-byte keys (the
//! thread id) and 8-byte values: the entry probe inserts the thread's key into both (`update`
//! with `BPF_ANY` of a key not present), the return probe looks both up and deletes both. One
//! "cycle" here is those six operations on one thread's key, as one thread making SSL calls
//! does. Three phases, each N rounds at a time:
//!
//! - `insert + delete`: the two updates of new keys, then the two deletes;
//! - `lookup`: the two lookups of present keys;
//! - `sslsniff cycle`: all six, in sslsniff's order.
//!
//! Usage: `hashop-bench [hash|percpu_hash|lru_hash] [N] [REPS]`. Prints ns per operation per
//! phase (the median of REPS runs of N rounds, the load average noted). Under callgrind
//! (`valgrind --tool=callgrind target/release/hashop-bench hash 100000 1`), the inclusive
//! instruction counts of `prog_update`, `prog_lookup` and `prog_delete` divided by their
//! calls (4N updates, 4N lookups, 4N deletes with REPS 1) are the instructions per operation.

use std::hint::black_box;
use std::path::PathBuf;
use std::time::Instant;

use userbpf_maps::hash::ProgOps;
use userbpf_maps::{BPF_ANY, Map, MapSpec, MapType};

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

struct Maps {
    dir: PathBuf,
    _bufs: Map,
    _start: Map,
    bufs: ProgOps,
    start: ProgOps,
}

impl Drop for Maps {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn maps(t: MapType) -> Maps {
    let dir = PathBuf::from("/dev/shm").join(format!("userbpf-hashop-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("creating the map directory");
    let mk = |name: &str| {
        let spec = MapSpec {
            map_type: t,
            key_size: 4,
            value_size: 8,
            max_entries: 10240,
            map_flags: 0,
            map_extra: 0,
            name: name.into(),
        };
        Map::create(&dir.join(name), &spec).unwrap_or_else(|e| panic!("creating {name}: {e}"))
    };
    let (b, s) = (mk("bufs"), mk("start_ns"));
    let (bufs, start) = (b.prog_ops().expect("hash ops"), s.prog_ops().expect("hash ops"));
    Maps { dir, _bufs: b, _start: s, bufs, start }
}

/// The calls, as the JIT makes them (CPU slot 0: this is the only thread using the maps).
struct Calls<'a> {
    m: &'a Maps,
    key: u32,
    val: u64,
}

impl Calls<'_> {
    #[inline(never)]
    fn insert(&self) -> u64 {
        let (k, v) = (&self.key as *const u32 as u64, &self.val as *const u64 as u64);
        // SAFETY: live maps; key and value readable for the maps' sizes; slot 0 held by no
        // one else (this thread is the maps' only user).
        unsafe {
            (self.m.bufs.update)(self.m.bufs.arg, k, v, BPF_ANY, 0)
                | (self.m.start.update)(self.m.start.arg, k, v, BPF_ANY, 0)
        }
    }
    #[inline(never)]
    fn lookup(&self) -> u64 {
        let k = &self.key as *const u32 as u64;
        // SAFETY: as in `insert`.
        unsafe {
            let a = (self.m.bufs.lookup)(self.m.bufs.arg, k, 0, 0, 0);
            let b = (self.m.start.lookup)(self.m.start.arg, k, 0, 0, 0);
            // Both present: read the values as sslsniff does.
            if a == 0 || b == 0 {
                return 1;
            }
            black_box((a as *const u64).read() ^ (b as *const u64).read());
            0
        }
    }
    #[inline(never)]
    fn delete(&self) -> u64 {
        let k = &self.key as *const u32 as u64;
        // SAFETY: as in `insert`.
        unsafe {
            (self.m.bufs.delete)(self.m.bufs.arg, k, 0, 0, 0) | (self.m.start.delete)(self.m.start.arg, k, 0, 0, 0)
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let t = match args.get(1).map(String::as_str) {
        None | Some("hash") => MapType::BPF_MAP_TYPE_HASH,
        Some("percpu_hash") => MapType::BPF_MAP_TYPE_PERCPU_HASH,
        Some("lru_hash") => MapType::BPF_MAP_TYPE_LRU_HASH,
        Some(o) => {
            eprintln!("hashop-bench: unknown map type {o:?} (hash, percpu_hash, lru_hash)");
            std::process::exit(2);
        }
    };
    let n: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1_000_000);
    let reps: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(9);
    let load0 = loadavg();
    let m = maps(t);
    // SAFETY: gettid has no arguments.
    let c = Calls { m: &m, key: unsafe { libc::syscall(libc::SYS_gettid) } as u32, val: 0x7f00_1234_5678 };
    let mut fails = 0u64;
    // Each phase runs N rounds of `f` (`ops` operations a round); ns per operation.
    let mut phase = |name: &str, ops: u64, f: &dyn Fn(&Calls) -> u64| {
        let mut v = Vec::new();
        for _ in 0..reps {
            let t0 = Instant::now();
            for _ in 0..n {
                fails += f(&c);
            }
            v.push(t0.elapsed().as_nanos() as f64);
        }
        println!("{name:>16}: {:7.2} ns per operation", median(v) / (ops * n) as f64);
    };
    phase("insert + delete", 4, &|c| c.insert() | c.delete());
    c.insert();
    phase("lookup", 2, &|c| c.lookup());
    c.delete();
    phase("sslsniff cycle", 6, &|c| c.insert() | c.lookup() | c.delete());
    println!("load average {load0} at the start, {} at the end; failed calls: {fails}", loadavg());
    if fails != 0 {
        std::process::exit(1);
    }
}
