// `userbpf tool trace`: one event per probe hit, sent through a ring buffer, as BCC's trace
// prints them. The front-end parses the probe specs, fills `probes` (one entry per spec,
// indexed by the link's cookie) with the filter's comparisons and which values to read as
// strings, and formats each event's arguments with the spec's format: the program only
// records values, it never formats.
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#define MAX_PROBES 64
#define MAX_CONDS 4
#define MAX_STRS 3
#define STR_LEN 80

// Operands: 1-6 arg1..arg6, 7 retval.
#define RETVAL 7

enum op { OP_EQ = 1, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE };

struct cond {
	__u8 operand;	// 0: no comparison (the list ends)
	__u8 op;
	__u8 size;	// a cast: the operand's low 1, 2 or 4 bytes (0 or 8: all of it)
	__u8 is_signed;	// sign-extended from `size` bytes, else zero-extended
	__u8 pad[4];
	__s64 value;
};

struct probe_cfg {
	struct cond conds[MAX_CONDS];	// all must hold (signed 64-bit comparisons)
	__u8 strs[MAX_STRS];		// operands to read as strings (0: none)
	__u8 pad[5];
};

struct event {
	__u64 ts;
	__u32 pid;
	__u32 tid;
	__u32 probe;
	__u32 cpu;
	char comm[16];
	__u64 args[6];
	__u64 ret;
	char strs[MAX_STRS][STR_LEN];
};

struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, MAX_PROBES); __type(key, __u32); __type(value, struct probe_cfg); } probes SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_RINGBUF); __uint(max_entries, 4 << 20); } events SEC(".maps");

// Events that found the ring buffer full.
__u64 lost;

static __always_inline __u64 operand(struct pt_regs *ctx, __u8 which)
{
	/* Every register is read at a constant offset into the stack, then one is chosen
	 * there: with a switch of reads (or an array clang can see through), clang computes
	 * the context address from `which`, which the kernel's verifier (and userbpf's) refuse
	 * ("dereference of modified ctx ptr"). */
	volatile __u64 ops[8] = { 0, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx), PT_REGS_PARM3(ctx),
				  PT_REGS_PARM4(ctx), PT_REGS_PARM5(ctx), ctx->r9, PT_REGS_RC(ctx) };

	if (which < 1 || which > RETVAL)
		return 0;
	return ops[which & 7];
}

static __always_inline int emit(struct pt_regs *ctx, int ret)
{
	__u32 idx = (__u32)bpf_get_attach_cookie(ctx);
	struct probe_cfg *cfg = bpf_map_lookup_elem(&probes, &idx);
	struct event *e;
	__u64 id;
	int i;

	if (!cfg)
		return 0;
#pragma unroll
	for (i = 0; i < MAX_CONDS; i++) {
		struct cond *c = &cfg->conds[i];
		__s64 v;
		int ok;

		if (!c->operand)
			break;
		v = (__s64)operand(ctx, c->operand);
		switch (c->size) {
		case 1: v = c->is_signed ? (__s64)(__s8)v : (__s64)(__u8)v; break;
		case 2: v = c->is_signed ? (__s64)(__s16)v : (__s64)(__u16)v; break;
		case 4: v = c->is_signed ? (__s64)(__s32)v : (__s64)(__u32)v; break;
		}
		switch (c->op) {
		case OP_EQ: ok = v == c->value; break;
		case OP_NE: ok = v != c->value; break;
		case OP_LT: ok = v < c->value; break;
		case OP_LE: ok = v <= c->value; break;
		case OP_GT: ok = v > c->value; break;
		case OP_GE: ok = v >= c->value; break;
		default: ok = 0;
		}
		if (!ok)
			return 0;
	}
	e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		__sync_fetch_and_add(&lost, 1);
		return 0;
	}
	id = bpf_get_current_pid_tgid();
	e->ts = bpf_ktime_get_ns();
	e->pid = id >> 32;
	e->tid = (__u32)id;
	e->probe = idx;
	e->cpu = bpf_get_smp_processor_id();
	bpf_get_current_comm(e->comm, sizeof(e->comm));
	if (ret) {
		e->ret = PT_REGS_RC(ctx);
		e->args[0] = e->args[1] = e->args[2] = e->args[3] = e->args[4] = e->args[5] = 0;
	} else {
		e->ret = 0;
		e->args[0] = PT_REGS_PARM1(ctx);
		e->args[1] = PT_REGS_PARM2(ctx);
		e->args[2] = PT_REGS_PARM3(ctx);
		e->args[3] = PT_REGS_PARM4(ctx);
		e->args[4] = PT_REGS_PARM5(ctx);
		e->args[5] = ctx->r9;
	}
#pragma unroll
	for (i = 0; i < MAX_STRS; i++) {
		e->strs[i][0] = 0;
		if (cfg->strs[i])
			bpf_probe_read_user_str(e->strs[i], STR_LEN, (void *)operand(ctx, cfg->strs[i]));
	}
	bpf_ringbuf_submit(e, 0);
	return 0;
}

SEC("uprobe")
int on_entry(struct pt_regs *ctx)
{
	return emit(ctx, 0);
}

SEC("uretprobe")
int on_return(struct pt_regs *ctx)
{
	return emit(ctx, 1);
}

char LICENSE[] SEC("license") = "GPL";
