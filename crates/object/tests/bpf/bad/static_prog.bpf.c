// A static function as a program: libbpf refuses these.
#include <linux/types.h>
#include <bpf/bpf_helpers.h>

SEC("uprobe")
static int hidden(void *ctx)
{
	return 0;
}
