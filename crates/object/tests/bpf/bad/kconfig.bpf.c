// A strong kconfig extern nobody provides a value for.
#include <linux/types.h>
#include <bpf/bpf_helpers.h>

extern int CONFIG_USERBPF_SURELY_MISSING __kconfig;

SEC("uprobe")
int p(void *ctx)
{
	return CONFIG_USERBPF_SURELY_MISSING;
}
