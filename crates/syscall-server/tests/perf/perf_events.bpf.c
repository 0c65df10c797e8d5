// Programs for the syscall server's perf tests: a uprobe and a uretprobe that send samples
// through a perf event array and a ring buffer, and count hits in .bss.
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

struct {
	__uint(type, BPF_MAP_TYPE_PERF_EVENT_ARRAY);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(__u32));
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 16384);
} rb SEC(".maps");

struct sample {
	__u64 value;
	__u64 magic;
	__u32 pid;
	__u32 kind;
};

/* .bss and .rodata as single structs, so the loader knows their layout without a skeleton. */
struct {
	__u64 hits;
	__u64 tp_hits;
	__u64 ticks;
} counters = {};

const volatile struct {
	__u64 magic;
	__u32 only_pid;
} cfg = {};

SEC("uprobe")
int BPF_KPROBE(on_entry, long arg)
{
	struct sample s = { .value = arg, .magic = cfg.magic, .pid = bpf_get_current_pid_tgid() >> 32, .kind = 0 };

	__sync_fetch_and_add(&counters.hits, 1);
	bpf_perf_event_output(ctx, &events, BPF_F_CURRENT_CPU, &s, sizeof(s));
	return 0;
}

SEC("uretprobe")
int BPF_KRETPROBE(on_return, long ret)
{
	struct sample *s = bpf_ringbuf_reserve(&rb, sizeof(*s), 0);

	if (!s)
		return 0;
	s->value = ret;
	s->magic = cfg.magic;
	s->pid = bpf_get_current_pid_tgid() >> 32;
	s->kind = 1;
	bpf_ringbuf_submit(s, 0);
	return 0;
}


SEC("tracepoint/syscalls/sys_enter_getppid")
int on_getppid(void *ctx)
{
	if ((bpf_get_current_pid_tgid() >> 32) == cfg.only_pid)
		__sync_fetch_and_add(&counters.tp_hits, 1);
	return 0;
}

SEC("perf_event")
int on_tick(void *ctx)
{
	__sync_fetch_and_add(&counters.ticks, 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
