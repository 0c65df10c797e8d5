// Calls a helper userbpf does not provide (bpf_get_current_task_btf, id 158).
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

SEC("uprobe")
int uses_task_btf(void *ctx)
{
	return bpf_get_current_task_btf() != 0;
}

char LICENSE[] SEC("license") = "GPL";
