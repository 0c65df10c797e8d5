// Some system calls of targets/forks_target.c and its children, by number (tests/syscalls.rs):
// the program's own (clone, getppid, wait4), and none of those userbpf's fork handlers make
// in a child (getpid, openat, ftruncate, membarrier).
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

struct raw_enter {
	__u64 common;
	long id;
	unsigned long args[6];
};

struct counts {
	long clone, getppid, wait4, getpid, openat, ftruncate, membarrier;
};
struct counts counts;

SEC("tracepoint/raw_syscalls/sys_enter")
int on_enter(struct raw_enter *ctx)
{
	switch (ctx->id) {
	case 56: __sync_fetch_and_add(&counts.clone, 1); break;
	case 110: __sync_fetch_and_add(&counts.getppid, 1); break;
	case 61: __sync_fetch_and_add(&counts.wait4, 1); break;
	case 39: __sync_fetch_and_add(&counts.getpid, 1); break;
	case 257: __sync_fetch_and_add(&counts.openat, 1); break;
	case 77: __sync_fetch_and_add(&counts.ftruncate, 1); break;
	case 324: __sync_fetch_and_add(&counts.membarrier, 1); break;
	}
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
