#include "common.h"
struct {
	__uint(type, BPF_MAP_TYPE_PERF_EVENT_ARRAY);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(__u32));
} events SEC(".maps");
SEC("uprobe") int prog(struct pt_regs *ctx) {
	__u64 d[3] = { PT_REGS_PARM1(ctx), 2, 3 };
	bpf_perf_event_output(ctx, &events, BPF_F_CURRENT_CPU, d, sizeof(d));
	return 0;
}
