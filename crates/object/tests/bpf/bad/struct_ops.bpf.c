// A struct_ops map: programs a kernel subsystem calls (here a made-up ops table).
#include <linux/types.h>
#include <bpf/bpf_helpers.h>

struct my_ops {
	int (*init)(void);
	int flags;
};

SEC("struct_ops/my_init")
int my_init(void)
{
	return 0;
}

SEC(".struct_ops")
struct my_ops my_ops_table = {
	.init = (void *)my_init,
	.flags = 1,
};

char LICENSE[] SEC("license") = "GPL";
