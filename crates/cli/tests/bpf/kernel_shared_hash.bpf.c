// One object, both sides, sharing maps that cannot be mapped into a process: a hash, an LRU
// hash, a per-CPU hash and a per-CPU array, used by a kernel tracepoint (task/task_rename)
// and by a uprobe, which reaches them through bpf() under userbpf. The target renames itself
// to "ubpfkI" and then calls observe(I) (tests/targets/renamer.c); N renames give, under
// libbpf in the kernel as under userbpf:
//   hits[0] = N (kernel), hits[1] = N (uprobe), hits[2] = N (the uprobe saw hits[0] == I: the
//   kernel's writes as they happen), hits[3] = N (the uprobe's last BPF_ANY update), hits[4]
//   absent (inserted at odd I, deleted at even I; N even), hits[5] = N (the uprobe's updates
//   with BPF_EXIST after a BPF_NOEXIST insert), lru[0] = lru[1] = N, pc[0] = pc[1] = N and
//   pca[0] = pca[1] = N summed over the CPUs.
#include <linux/bpf.h>
#include <linux/types.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16);
	__type(key, __u32);
	__type(value, __u64);
} hits SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16);
	__type(key, __u32);
	__type(value, __u64);
} lru SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 16);
	__type(key, __u32);
	__type(value, __u64);
} pc SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 4);
	__type(key, __u32);
	__type(value, __u64);
} pca SEC(".maps");

static __always_inline void bump(void *map, __u32 k)
{
	__u64 one = 1, *v = bpf_map_lookup_elem(map, &k);

	if (v)
		__sync_fetch_and_add(v, 1);
	else
		bpf_map_update_elem(map, &k, &one, BPF_NOEXIST);
}

struct task_rename_args {
	__u64 common;
	int pid;
	char oldcomm[16];
	char newcomm[16];
	short oom_score_adj;
};

SEC("tracepoint/task/task_rename")
int on_rename(struct task_rename_args *ctx)
{
	char c[5];

	bpf_probe_read_kernel(c, sizeof(c), ctx->newcomm);
	if (c[0] != 'u' || c[1] != 'b' || c[2] != 'p' || c[3] != 'f' || c[4] != 'k')
		return 0;
	bump(&hits, 0);
	bump(&lru, 0);
	bump(&pc, 0);
	bump(&pca, 0);
	return 0;
}

SEC("uprobe")
int BPF_KPROBE(observe_hit, long i)
{
	__u32 k = 0;
	__u64 *seen, v = i, one = 1;

	bump(&hits, 1);
	seen = bpf_map_lookup_elem(&hits, &k);
	if (seen && *seen == (__u64)i)
		bump(&hits, 2);
	k = 3;
	bpf_map_update_elem(&hits, &k, &v, BPF_ANY);
	k = 4;
	if (i & 1)
		bpf_map_update_elem(&hits, &k, &v, BPF_NOEXIST);
	else
		bpf_map_delete_elem(&hits, &k);
	k = 5;
	if (bpf_map_update_elem(&hits, &k, &one, BPF_NOEXIST)) {
		__u64 *old = bpf_map_lookup_elem(&hits, &k);
		if (old) {
			v = *old + 1;
			bpf_map_update_elem(&hits, &k, &v, BPF_EXIST);
		}
	}
	bump(&lru, 1);
	bump(&pc, 1);
	bump(&pca, 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
