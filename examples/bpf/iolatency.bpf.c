// Block I/O latency down to the user function (`userbpf tool iolatency -- CMD`): a uprobe on
// each of the application's I/O functions (fio's td_io_queue, libc's pwrite64, pread64,
// fdatasync, ...; the link's cookie names the function) marks the calling thread in `marks`,
// an array shared with the kernel (its values mapped into the process); the block tracepoints
// run in the kernel: block_bio_queue (in the submitting thread) reads the mark and remembers
// the function and the operation of the request's first sector (block_split hands them to
// the rest of a bio split into several requests), block_rq_issue its start,
// block_rq_complete adds the latency to a log2 histogram per function, device and
// operation, and to the kernel's totals (every request, attributed or not).
//
// The outermost probed function keeps the mark (td_io_queue calling pwrite64: td_io_queue),
// and its return clears it.
#include <linux/bpf.h>
#include <linux/types.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>

#define MARKS 65536
#define SLOTS 40
/* The function id of the kernel's totals. */
#define KERNEL_TOTAL 0xffffffff

struct mark {
	__u32 tid;
	__u32 func;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MARKS);
	__type(key, __u32);
	__type(value, struct mark);
} marks SEC(".maps");

struct req_key {
	__u32 dev;
	__u32 pad;
	__u64 sector;
};

struct queued {
	__u32 func;
	__u32 op;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct req_key);
	__type(value, struct queued);
} queued SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct req_key);
	__type(value, __u64);
} issued SEC(".maps");

struct hist_key {
	__u32 func;
	__u32 dev;
	__u32 op;
	__u32 slot;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__type(key, struct hist_key);
	__type(value, __u64);
} hist SEC(".maps");

/* Operations, from the first letters of the tracepoint's rwbs. */
enum op { OP_OTHER = 0, OP_READ = 1, OP_WRITE = 2, OP_FLUSH = 3, OP_DISCARD = 4 };

SEC("uprobe")
int io_enter(struct pt_regs *ctx)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	__u32 k = tid & (MARKS - 1);
	struct mark *m = bpf_map_lookup_elem(&marks, &k);

	if (!m)
		return 0;
	/* An outer probed function already marked this thread: it keeps the request. */
	if (m->tid == tid && m->func)
		return 0;
	m->func = (__u32)bpf_get_attach_cookie(ctx);
	m->tid = tid;
	return 0;
}

SEC("uretprobe")
int io_leave(struct pt_regs *ctx)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	__u32 k = tid & (MARKS - 1);
	struct mark *m = bpf_map_lookup_elem(&marks, &k);

	if (m && m->tid == tid && m->func == (__u32)bpf_get_attach_cookie(ctx))
		m->func = 0;
	return 0;
}

/* The fields every kernel since 4.x has at these offsets (dev, sector; rwbs of
 * block_bio_queue). */
struct bio_queue_args {
	__u64 common;
	__u32 dev;
	__u32 pad;
	__u64 sector;
	__u32 nr_sector;
	char rwbs[8];
};

struct rq_args {
	__u64 common;
	__u32 dev;
	__u32 pad;
	__u64 sector;
};

static __u32 op_of(const char *rwbs)
{
	char c = rwbs[0];

	if (c == 'F')
		return OP_FLUSH;
	if (c == 'R')
		return OP_READ;
	if (c == 'W')
		return OP_WRITE;
	if (c == 'D')
		return OP_DISCARD;
	return OP_OTHER;
}

SEC("tracepoint/block/block_bio_queue")
int bio_queue(struct bio_queue_args *ctx)
{
	struct req_key key = { .dev = ctx->dev, .sector = ctx->sector };
	struct queued q = { .op = op_of(ctx->rwbs) };
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	__u32 k = tid & (MARKS - 1);
	struct mark *m = bpf_map_lookup_elem(&marks, &k);

	if (m && m->tid == tid)
		q.func = m->func;
	bpf_map_update_elem(&queued, &key, &q, BPF_ANY);
	return 0;
}

/* block_split: dev, sector (the front part's), new_sector (the rest's), at these offsets
 * since 4.x. */
struct split_args {
	__u64 common;
	__u32 dev;
	__u32 pad;
	__u64 sector;
	__u64 new_sector;
};

/* A bio larger than the device takes is split: the rest goes on as requests of its own, from
 * new_sector, without another block_bio_queue; it keeps the bio's function and operation. */
SEC("tracepoint/block/block_split")
int bio_split(struct split_args *ctx)
{
	struct req_key key = { .dev = ctx->dev, .sector = ctx->sector };
	struct queued *q = bpf_map_lookup_elem(&queued, &key);
	struct queued rest;

	if (!q)
		return 0;
	rest = *q;
	key.sector = ctx->new_sector;
	bpf_map_update_elem(&queued, &key, &rest, BPF_ANY);
	return 0;
}

SEC("tracepoint/block/block_rq_issue")
int rq_issue(struct rq_args *ctx)
{
	struct req_key key = { .dev = ctx->dev, .sector = ctx->sector };
	__u64 ts = bpf_ktime_get_ns();

	bpf_map_update_elem(&issued, &key, &ts, BPF_ANY);
	return 0;
}

static void count(__u32 func, __u32 dev, __u32 op, __u32 slot)
{
	struct hist_key hk = { .func = func, .dev = dev, .op = op, .slot = slot };
	__u64 one = 1, *v = bpf_map_lookup_elem(&hist, &hk);

	if (!v) {
		if (bpf_map_update_elem(&hist, &hk, &one, BPF_NOEXIST) == 0)
			return;
		/* Another CPU inserted the bucket first: count into it. */
		v = bpf_map_lookup_elem(&hist, &hk);
		if (!v)
			return;
	}
	__sync_fetch_and_add(v, 1);
}

SEC("tracepoint/block/block_rq_complete")
int rq_complete(struct rq_args *ctx)
{
	struct req_key key = { .dev = ctx->dev, .sector = ctx->sector };
	__u64 *start = bpf_map_lookup_elem(&issued, &key);
	struct queued *q;
	__u64 us;
	__u32 slot = 0, func = 0, op = OP_OTHER;

	if (!start)
		return 0;
	us = (bpf_ktime_get_ns() - *start) / 1000;
	bpf_map_delete_elem(&issued, &key);
	q = bpf_map_lookup_elem(&queued, &key);
	if (q) {
		func = q->func;
		op = q->op;
		bpf_map_delete_elem(&queued, &key);
	}
	/* log2 slot: [2^slot, 2^(slot+1)) microseconds, 0 for [0, 2). */
	for (int i = 0; i < SLOTS - 1; i++) {
		if (us < 2)
			break;
		us >>= 1;
		slot++;
	}
	count(KERNEL_TOTAL, key.dev, op, slot);
	if (func)
		count(func, key.dev, op, slot);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
