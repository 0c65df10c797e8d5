// Weak kernel symbols, typeless and typed: missing here, they resolve to 0 as libbpf leaves
// missing weak externs.
#include <linux/types.h>
#include <bpf/bpf_helpers.h>

extern const void init_task __ksym __weak;
extern const int bpf_prog_active __ksym __weak;

__u64 where[2];

SEC("uprobe")
int p(void *ctx)
{
	where[0] = (__u64)&init_task;
	where[1] = (__u64)&bpf_prog_active;
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
