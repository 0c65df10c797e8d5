// Global data sections, static and global subprograms shared by programs in different sections,
// and a bpf_loop callback (BPF_PSEUDO_FUNC).
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

int counter = 7;                                 /* .data */
const volatile int limit = 42;                   /* .rodata */
__u64 hits[4];                                   /* .bss */
char greeting[16] SEC(".data.foo") = "hello";    /* .data.foo */
static int static_scratch;                       /* .bss (static) */

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16);
	__type(key, __u32);
	__type(value, __u64);
} counts SEC(".maps");

static __noinline int add_twice(int x)
{
	static_scratch += x;
	return x + x + limit;
}

__noinline int global_helper(int x)
{
	__u32 k = x;
	__u64 *v = bpf_map_lookup_elem(&counts, &k);
	if (v)
		*v += 1;
	return add_twice(x) + counter;
}

static int loop_cb(__u32 idx, void *ctx)
{
	hits[idx & 3] += 1;
	return 0;
}

SEC("uprobe")
int prog_one(void *ctx)
{
	hits[0] = global_helper(1);
	bpf_loop(4, loop_cb, 0, 0);
	return greeting[0];
}

SEC("tracepoint/syscalls/sys_enter_openat")
__noinline int prog_two(void *ctx)
{
	counter++;
	return add_twice(3) + global_helper(2);
}

/* Calls another entry program (a global function in another section): appended like a
 * subprogram, together with what it calls. */
SEC("usdt")
int prog_three(void *ctx)
{
	return prog_two(ctx) + 1;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
