// Tail calls, bpf_loop callbacks, global functions, helpers that read the context and
// program memory. Each program returns 0 on success or the line of the failed check.
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#define CHECK(c) do { if (!(c)) return __LINE__; } while (0)

struct { __uint(type, BPF_MAP_TYPE_PROG_ARRAY); __uint(max_entries, 4); __type(key, __u32); __type(value, __u32); } jumps SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, 1); __type(key, __u32); __type(value, __u64); } hits SEC(".maps");

SEC("uprobe")
int tail_target(struct pt_regs *ctx)
{
	__u32 zero = 0;
	__u64 *h = bpf_map_lookup_elem(&hits, &zero);
	if (h)
		__sync_fetch_and_add(h, 1);
	return 1000 + (int)PT_REGS_PARM1(ctx);
}

struct { __uint(type, BPF_MAP_TYPE_PROG_ARRAY); __uint(max_entries, 2); __type(key, __u32); __array(values, int (void *)); } init_jumps SEC(".maps") = { .values = { [1] = (void *)&tail_target } };

SEC("uprobe")
int tail_caller(struct pt_regs *ctx)
{
	bpf_tail_call(ctx, &init_jumps, 0);  /* empty slot: goes on */
	bpf_tail_call(ctx, &init_jumps, 1);  /* never returns */
	return 1;
}

static int add_index(__u32 index, void *data)
{
	__u64 *sum = data;
	*sum += index;
	return *sum > 40 ? 1 : 0;  /* stop once the sum passes 40 */
}

__noinline int global_square(int x)
{
	return x * x;
}

SEC("uprobe")
int loops_and_calls(struct pt_regs *ctx)
{
	__u64 sum = 0;
	long n = bpf_loop(100, add_index, &sum, 0);
	CHECK(n == 10 && sum == 45);           /* 0+1+...+9 = 45 > 40 after the 10th call */
	CHECK(bpf_loop(1, add_index, &sum, 1) == -22);
	CHECK(global_square(7) == 49);
	return 0;
}

SEC("uprobe")
int context_and_strings(struct pt_regs *ctx)
{
	char buf[32], name[8] = "userbpf";
	__u64 args[2] = { 42, (__u64)(long)name };
	long r;

	CHECK(PT_REGS_PARM1(ctx) == 7 && PT_REGS_PARM2(ctx) == 8);
	r = bpf_snprintf(buf, sizeof(buf), "%d:%s", args, sizeof(args));
	CHECK(r == 11 && buf[0] == '4' && buf[3] == 'u' && buf[10] == 0);
	CHECK(bpf_strncmp(buf, 3, "42:") == 0);
	CHECK(bpf_probe_read_user(buf, 8, (void *)8) == -14);  /* EFAULT, never a crash */
	CHECK(buf[0] == 0);
	CHECK(bpf_probe_read_user_str(buf, sizeof(buf), name) == 8);
	bpf_printk("hello from %s, arg %d", name, (int)PT_REGS_PARM1(ctx));
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
