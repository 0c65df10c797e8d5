// CO-RE against kernel types as libbpf-tools write them with vmlinux.h: struct pt_regs
// (preserve_access_index, as vmlinux.h declares it) and a minimal flavor of task_struct.
#include <linux/types.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

struct pt_regs {
	long unsigned int r15, r14, r13, r12, bp, bx, r11, r10, r9, r8;
	long unsigned int ax, cx, dx, si, di, orig_ax, ip, cs, flags, sp, ss;
} __attribute__((preserve_access_index));

struct task_struct___min {
	int pid;
	int tgid;
} __attribute__((preserve_access_index));

__u64 out[4];

SEC("uprobe")
int regs(struct pt_regs *ctx)
{
	out[0] = ctx->di;
	out[1] = ctx->si;
	return 0;
}

SEC("kprobe/do_nanosleep")
int task(struct task_struct___min *t)
{
	out[2] = BPF_CORE_READ(t, tgid);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
