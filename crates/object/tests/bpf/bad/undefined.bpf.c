// A call to a function that is declared but defined nowhere.
#include <linux/types.h>
#include <bpf/bpf_helpers.h>

extern int bar(int x);

SEC("uprobe/foo")
int calls_bar(void *ctx)
{
	return bar(3) + 1;
}
