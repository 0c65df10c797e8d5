// A kfunc (strong __ksym extern function): refused, user space has no kernel to resolve it.
#include <linux/types.h>
#include <bpf/bpf_helpers.h>

extern void *bpf_task_acquire(void *p) __ksym;

SEC("uprobe")
int uses_kfunc(void *ctx)
{
	return bpf_task_acquire(ctx) != 0;
}
