// The entries and returns of execve: the kernel reports an execve's return (0) in the new
// image, under its new name (tests/syscalls.rs).
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

struct exit_common {
	__u64 common;
	long nr;
	long ret;
};

struct counts {
	long enter, exit, exit_ok, exit_in_true;
};
struct counts counts;

SEC("tracepoint/syscalls/sys_enter_execve")
int on_enter(void *ctx)
{
	__sync_fetch_and_add(&counts.enter, 1);
	return 0;
}

SEC("tracepoint/syscalls/sys_exit_execve")
int on_exit(struct exit_common *ctx)
{
	char comm[16];

	__sync_fetch_and_add(&counts.exit, 1);
	if (ctx->ret == 0)
		__sync_fetch_and_add(&counts.exit_ok, 1);
	bpf_get_current_comm(comm, sizeof(comm));
	if (comm[0] == 't' && comm[1] == 'r' && comm[2] == 'u' && comm[3] == 'e' && comm[4] == 0)
		__sync_fetch_and_add(&counts.exit_in_true, 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
