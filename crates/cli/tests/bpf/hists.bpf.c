// Histogram maps keyed by more than the slot, filled by the plots test (tests/plots.rs):
// libbpf-tools' layout (a value struct with a `slots` array per key, as biolatency keeps
// them) and a keyed hist() (a key struct with a `slot` member, as iolatency keeps them).
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

enum op { OP_READ = 1, OP_WRITE = 2 };

struct disk_key { __u32 dev; enum op op; };
struct hist { __u32 slots[27]; };
struct lat_key { __u32 func; __u32 slot; };

struct { __uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, 16); __type(key, struct disk_key); __type(value, struct hist); } hists SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_PERCPU_HASH); __uint(max_entries, 256); __type(key, struct lat_key); __type(value, __u64); } lat SEC(".maps");

SEC("uprobe")
int nothing(void *ctx)
{
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
