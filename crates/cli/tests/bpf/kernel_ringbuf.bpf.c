// A kernel tracepoint writing the new names of renamed tasks into a ring buffer
// (tests/passthrough.rs: read by a libbpf loader, on the kernel and through userbpf load).
#include <linux/bpf.h>
#include <linux/types.h>
#include <bpf/bpf_helpers.h>

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 64 * 1024);
} events SEC(".maps");

struct task_rename_args {
	__u64 common;
	int pid;
	char oldcomm[16];
	char newcomm[16];
	short oom_score_adj;
};

SEC("tracepoint/task/task_rename")
int on_rename(struct task_rename_args *ctx)
{
	char *e;

	if (ctx->newcomm[0] != 'u' || ctx->newcomm[1] != 'b' || ctx->newcomm[2] != 'p' || ctx->newcomm[3] != 'f' ||
	    ctx->newcomm[4] != 'k')
		return 0;
	e = bpf_ringbuf_reserve(&events, 16, 0);
	if (!e)
		return 0;
	bpf_probe_read_kernel(e, 16, ctx->newcomm);
	bpf_ringbuf_submit(e, 0);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
