// One object, both sides: a kernel tracepoint (task/task_rename) and a uprobe share the
// array `counts`, and a system call tracepoint (in the process, or in the kernel with
// `--syscalls kernel`) counts the renames asked for there too; a hash only the kernel program
// uses counts renames by the first digit of the new name. The target renames itself to "ubpfkI" and then calls observe(I): the uprobe sees
// counts[0] == I when the kernel's writes reach it as they happen.
#include <linux/bpf.h>
#include <linux/types.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 4);
	__type(key, __u32);
	__type(value, __u64);
} counts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16);
	__type(key, __u32);
	__type(value, __u64);
} by_digit SEC(".maps");

/* .bss, shared too: the last argument the uprobe saw (written in the process), the renames
 * the kernel counted (a global variable written by the kernel program, read by the uprobe:
 * `seen_in_bss`). */
__u64 last_observed;
__u64 kernel_renames;
__u64 seen_in_bss;

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
	char c[6];
	__u32 k = 0;
	__u64 one = 1, *v;

	bpf_probe_read_kernel(c, sizeof(c), ctx->newcomm);
	if (c[0] != 'u' || c[1] != 'b' || c[2] != 'p' || c[3] != 'f' || c[4] != 'k')
		return 0;
	v = bpf_map_lookup_elem(&counts, &k);
	if (v)
		__sync_fetch_and_add(v, 1);
	__sync_fetch_and_add(&kernel_renames, 1);
	k = (__u32)c[5];
	v = bpf_map_lookup_elem(&by_digit, &k);
	if (v)
		__sync_fetch_and_add(v, 1);
	else
		bpf_map_update_elem(&by_digit, &k, &one, BPF_NOEXIST);
	return 0;
}

SEC("uprobe")
int BPF_KPROBE(observe_hit, long i)
{
	__u32 k = 0;
	__u64 *renames = bpf_map_lookup_elem(&counts, &k);

	if (!renames)
		return 0;
	/* counts[1]: calls that saw exactly the renames made before them. */
	if (*renames == (__u64)i) {
		k = 1;
		__u64 *ok = bpf_map_lookup_elem(&counts, &k);
		if (ok)
			__sync_fetch_and_add(ok, 1);
	}
	k = 2;
	__u64 *hits = bpf_map_lookup_elem(&counts, &k);
	if (hits)
		__sync_fetch_and_add(hits, 1);
	if (kernel_renames == (__u64)i)
		seen_in_bss++;
	last_observed = i;
	return 0;
}

/* counts[3]: the target's prctl(PR_SET_NAME) calls, from the system call tracepoint: run in
 * the process by default, in the kernel with `--syscalls kernel`. */
struct sys_enter_prctl_args {
	__u64 common;
	int nr;
	__u64 option;
	__u64 arg2;
};

SEC("tracepoint/syscalls/sys_enter_prctl")
int on_prctl(struct sys_enter_prctl_args *ctx)
{
	char name[6];
	__u32 k = 3;
	__u64 *v;

	if (ctx->option != 15 /* PR_SET_NAME */)
		return 0;
	if (bpf_probe_read_user(name, sizeof(name), (void *)ctx->arg2))
		return 0;
	if (name[0] != 'u' || name[1] != 'b' || name[2] != 'p' || name[3] != 'f' || name[4] != 'k')
		return 0;
	v = bpf_map_lookup_elem(&counts, &k);
	if (v)
		__sync_fetch_and_add(v, 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
