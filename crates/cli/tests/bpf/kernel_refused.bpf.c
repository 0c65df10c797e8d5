// Kernel programs the kernel refuses or runs (tests/kernel.rs picks one at a time with
// --not-load): a map value read out of bounds (the verifier's refusal), fentry (refused by
// this kernel), kprobe (no kprobes on this kernel), tp_btf and raw_tp (run), and a queue
// used by a kernel program and a uprobe (its push and pop are not passed to the kernel from
// user space: not shareable).
#include <linux/bpf.h>
#include <linux/types.h>
#include <bpf/bpf_helpers.h>

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} m SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_QUEUE);
	__uint(max_entries, 4);
	__type(value, __u64);
} q SEC(".maps");

SEC("tracepoint/task/task_rename")
int oob_value(void *ctx)
{
	__u32 k = 0;
	__u64 *v = bpf_map_lookup_elem(&m, &k);

	if (!v)
		return 0;
	return v[1];
}

SEC("fentry/do_nanosleep")
int fentry_prog(void *ctx)
{
	return 0;
}

SEC("kprobe/do_nanosleep")
int kprobe_prog(void *ctx)
{
	return 0;
}

static int bump(void)
{
	__u32 k = 0;
	__u64 *v = bpf_map_lookup_elem(&m, &k);

	if (v)
		__sync_fetch_and_add(v, 1);
	return 0;
}

SEC("tp_btf/task_rename")
int btf_prog(__u64 *ctx)
{
	return bump();
}

SEC("raw_tp/task_rename")
int raw_prog(__u64 *ctx)
{
	return bump();
}

SEC("tracepoint/task/task_rename")
int shared_queue(void *ctx)
{
	__u64 one = 1;

	bpf_map_push_elem(&q, &one, BPF_ANY);
	return 0;
}

SEC("uprobe")
int queue_user(void *ctx)
{
	__u64 v;

	return bpf_map_peek_elem(&q, &v) == 0;
}

char LICENSE[] SEC("license") = "GPL";
