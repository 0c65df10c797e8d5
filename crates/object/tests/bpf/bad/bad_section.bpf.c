// A uprobe section naming a binary but no function.
#include <linux/types.h>
#include <bpf/bpf_helpers.h>

SEC("uprobe/usr/bin/true")
int p(void *ctx)
{
	return 0;
}
