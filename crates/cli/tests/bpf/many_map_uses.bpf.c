// A system call tracepoint program using one map at 80 places (as libbpf-tools' execsnoop uses
// its maps in an unrolled loop): 80 map loads, one map. The kernel counts the distinct maps of
// a program (at most 64), and so must the trial load userbpf makes in the kernel at
// BPF_PROG_LOAD (tests/load.rs).
#include <linux/bpf.h>
#include <linux/types.h>
#include <bpf/bpf_helpers.h>

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 80);
	__type(key, __u32);
	__type(value, __u64);
} counts SEC(".maps");

SEC("tracepoint/syscalls/sys_enter_getppid")
int many_uses(void *ctx)
{
#pragma unroll
	for (__u32 i = 0; i < 80; i++) {
		__u32 k = i;
		__u64 *v = bpf_map_lookup_elem(&counts, &k);
		if (v)
			__sync_fetch_and_add(v, 1);
	}
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
