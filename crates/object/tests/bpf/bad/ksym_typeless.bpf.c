// A strong typeless kernel symbol (libbpf resolves it from /proc/kallsyms).
#include <linux/types.h>
#include <bpf/bpf_helpers.h>

extern const void init_task __ksym;

__u64 where;

SEC("uprobe")
int p(void *ctx)
{
	where = (__u64)&init_task;
	return 0;
}
