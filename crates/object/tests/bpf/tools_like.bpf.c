// A libbpf-tools style object built against a vmlinux.h generated from the running kernel
// (the test generates it with bpftool): tracepoint arguments, task_struct walks and pt_regs
// through CO-RE, config in .rodata, events through a ring buffer.
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>

#define TASK_COMM_LEN 16

struct event {
	__u32 pid;
	__u32 ppid;
	__u64 flags;
	char comm[TASK_COMM_LEN];
	char fname[64];
};

const volatile pid_t targ_pid = 0;
const volatile bool targ_failed = false;

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 10240);
	__type(key, u32);
	__type(value, struct event);
} start SEC(".maps");

static __always_inline bool trace_allowed(u32 pid)
{
	return !targ_pid || targ_pid == pid;
}

SEC("tracepoint/syscalls/sys_enter_openat")
int tp_openat(struct trace_event_raw_sys_enter *ctx)
{
	u32 pid = bpf_get_current_pid_tgid() >> 32;
	struct event ev = {};
	struct task_struct *task;

	if (!trace_allowed(pid))
		return 0;
	task = (struct task_struct *)bpf_get_current_task();
	ev.pid = pid;
	ev.ppid = BPF_CORE_READ(task, real_parent, tgid);
	ev.flags = (__u64)ctx->args[2];
	bpf_get_current_comm(&ev.comm, sizeof(ev.comm));
	bpf_probe_read_user_str(&ev.fname, sizeof(ev.fname), (void *)ctx->args[1]);
	bpf_map_update_elem(&start, &pid, &ev, BPF_ANY);
	return 0;
}

SEC("uprobe")
int BPF_KPROBE(malloc_enter, size_t size)
{
	struct event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e)
		return 0;
	e->pid = bpf_get_current_pid_tgid() >> 32;
	e->flags = size + PT_REGS_PARM2(ctx);
	bpf_ringbuf_submit(e, 0);
	return 0;
}

SEC("uretprobe")
int BPF_KRETPROBE(malloc_exit, void *ret)
{
	u32 pid = bpf_get_current_pid_tgid() >> 32;
	struct event *e = bpf_map_lookup_elem(&start, &pid);
	if (e && (!targ_failed || !ret))
		e->flags = (u64)ret;
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
