// User space of userbpf-demo: opens, configures, loads and attaches the skeleton, then reads
// the ring buffer and the perf buffer until interrupted, and prints what it got.
//
//   userbpf-demo BINARY FUNCTION [MIN_N]
//
// Runs unmodified on the kernel or under `userbpf load` (targets under `userbpf start`).
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <bpf/libbpf.h>
#include "userbpf-demo.h"
#include "userbpf-demo.skel.h"

static volatile sig_atomic_t stop;
static unsigned long long ring_events, perf_events, perf_lost;

static void on_signal(int sig)
{
	(void)sig;
	stop = 1;
}

static int on_ring(void *ctx, void *data, size_t size)
{
	const struct call_event *e = data;

	(void)ctx;
	if (size < sizeof(*e)) {
		fprintf(stderr, "userbpf-demo: short ring buffer record (%zu bytes)\n", size);
		return 0;
	}
	ring_events++;
	printf("call seq=%u comm=%s name=%s n=%lld x=%#llx\n", e->seq, e->comm, e->name, e->arg1, e->arg2);
	return 0;
}

static void on_perf(void *ctx, int cpu, void *data, unsigned int size)
{
	const struct ret_event *e = data;

	(void)ctx;
	(void)cpu;
	if (size < sizeof(*e)) {
		fprintf(stderr, "userbpf-demo: short perf record (%u bytes)\n", size);
		return;
	}
	perf_events++;
	printf("return seq=%u ret=%lld\n", e->seq, e->ret);
}

static void on_lost(void *ctx, int cpu, unsigned long long n)
{
	(void)ctx;
	(void)cpu;
	perf_lost += n;
}

int main(int argc, char **argv)
{
	struct userbpf_demo_bpf *skel;
	struct ring_buffer *rb = NULL;
	struct perf_buffer *pb = NULL;
	LIBBPF_OPTS(bpf_uprobe_opts, uo);
	int err = 1;

	if (argc < 3) {
		fprintf(stderr, "usage: %s BINARY FUNCTION [MIN_N]\n", argv[0]);
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	signal(SIGINT, on_signal);
	signal(SIGTERM, on_signal);

	skel = userbpf_demo_bpf__open();
	if (!skel) {
		fprintf(stderr, "userbpf-demo: opening the skeleton: %s\n", strerror(errno));
		return 1;
	}
	skel->rodata->min_n = argc > 3 ? atoll(argv[3]) : 0;
	if (userbpf_demo_bpf__load(skel)) {
		fprintf(stderr, "userbpf-demo: loading: %s\n", strerror(errno));
		goto out;
	}
	uo.func_name = argv[2];
	uo.retprobe = false;
	skel->links.on_call = bpf_program__attach_uprobe_opts(skel->progs.on_call, -1, argv[1], 0, &uo);
	if (!skel->links.on_call) {
		fprintf(stderr, "userbpf-demo: attaching the uprobe to %s:%s: %s\n", argv[1], argv[2], strerror(errno));
		goto out;
	}
	uo.retprobe = true;
	skel->links.on_return = bpf_program__attach_uprobe_opts(skel->progs.on_return, -1, argv[1], 0, &uo);
	if (!skel->links.on_return) {
		fprintf(stderr, "userbpf-demo: attaching the uretprobe to %s:%s: %s\n", argv[1], argv[2], strerror(errno));
		goto out;
	}
	rb = ring_buffer__new(bpf_map__fd(skel->maps.calls_rb), on_ring, NULL, NULL);
	if (!rb) {
		fprintf(stderr, "userbpf-demo: ring buffer: %s\n", strerror(errno));
		goto out;
	}
	pb = perf_buffer__new(bpf_map__fd(skel->maps.returns_pb), 8, on_perf, on_lost, NULL, NULL);
	if (!pb) {
		fprintf(stderr, "userbpf-demo: perf buffer: %s\n", strerror(errno));
		goto out;
	}
	printf("attached to %s:%s\n", argv[1], argv[2]);
	while (!stop) {
		int n = ring_buffer__poll(rb, 50);
		if (n >= 0)
			n = perf_buffer__poll(pb, 50);
		if (n < 0 && n != -EINTR) {
			fprintf(stderr, "userbpf-demo: polling: %s\n", strerror(-n));
			goto out;
		}
	}
	/* What arrived before the signal. */
	ring_buffer__consume(rb);
	perf_buffer__consume(pb);
	printf("calls=%llu returns=%llu dropped=%llu ring_events=%llu perf_events=%llu perf_lost=%llu\n",
	       (unsigned long long)skel->bss->calls, (unsigned long long)skel->bss->returns,
	       (unsigned long long)skel->bss->dropped, ring_events, perf_events, perf_lost);
	err = 0;
out:
	perf_buffer__free(pb);
	ring_buffer__free(rb);
	userbpf_demo_bpf__destroy(skel);
	return err;
}
