// A libbpf loader run under the syscall server: attaches perf_events.bpf.o's programs with
// bpf_program__attach_uprobe_opts (by function name) and reads the samples with libbpf's own
// perf_buffer and ring_buffer, as an unmodified libbpf tool does.
//
// perf_loader OBJ self N      : probes target_func in this program, calls it N times
// perf_loader OBJ PATH N      : probes target_func in the executable PATH (any process),
//                               prints "ready", waits for N calls from elsewhere
#include <errno.h>
#include <linux/perf_event.h>
#include <sys/syscall.h>
#include <sys/mman.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>

struct sample {
	unsigned long long value, magic;
	unsigned int pid, kind;
};

#define MAGIC 0x5eedf00dULL

static long perf_n, perf_sum, rb_n, rb_sum, lost_n, bad;

__attribute__((noinline)) long target_func(long x)
{
	asm volatile("" ::: "memory");
	return x * 2;
}

static void on_sample(void *ctx, int cpu, void *data, __u32 size)
{
	const struct sample *s = data;

	if (size < sizeof(*s) || s->magic != MAGIC || s->kind != 0)
		bad++;
	perf_n++;
	perf_sum += s->value;
}

static void on_lost(void *ctx, int cpu, __u64 n)
{
	lost_n += n;
}

static int on_rb(void *ctx, void *data, size_t size)
{
	const struct sample *s = data;

	if (size < sizeof(*s) || s->magic != MAGIC || s->kind != 1)
		bad++;
	rb_n++;
	rb_sum += s->value;
	return 0;
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Mode "tp": a syscall tracepoint counted in the loader, and a CPU clock event running a
 * perf_event program until its link is destroyed. */
static int tp_mode(struct bpf_object *obj)
{
	int bss = bpf_map__fd(bpf_object__find_map_by_name(obj, ".bss"));
	volatile unsigned long long *v = mmap(NULL, 4096, PROT_READ, MAP_SHARED, bss, 0);
	if (v == MAP_FAILED)
		return 1;
	/* .bss: hits, tp_hits, ticks */
	struct bpf_link *tp = bpf_program__attach_tracepoint(bpf_object__find_program_by_name(obj, "on_getppid"), "syscalls", "sys_enter_getppid");
	if (!tp) {
		fprintf(stderr, "tracepoint: %s\n", strerror(errno));
		return 1;
	}
	for (int i = 0; i < 7; i++)
		getppid();
	bpf_link__destroy(tp);
	getppid();
	struct perf_event_attr a = { .type = PERF_TYPE_SOFTWARE, .size = sizeof(a), .config = PERF_COUNT_SW_CPU_CLOCK, .sample_period = 1000000 };
	int pfd = syscall(__NR_perf_event_open, &a, -1, 0, -1, PERF_FLAG_FD_CLOEXEC);
	if (pfd < 0) {
		fprintf(stderr, "perf_event_open: %s\n", strerror(errno));
		return 1;
	}
	struct bpf_link *pl = bpf_program__attach_perf_event(bpf_object__find_program_by_name(obj, "on_tick"), pfd);
	if (!pl) {
		fprintf(stderr, "attach_perf_event: %s\n", strerror(errno));
		return 1;
	}
	double deadline = now() + 10;
	while (v[2] < 3 && now() < deadline) {
		/* keep CPU 0 busy enough for the kernel's cpu-clock to tick there */
		for (volatile int k = 0; k < 100000; k++)
			;
	}
	int ticked = v[2] >= 3;
	bpf_link__destroy(pl);
	unsigned long long t1 = v[2];
	usleep(20000);
	printf("tp=%llu ticked=%d stopped=%d\n", v[1], ticked, v[2] == t1);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: %s OBJ self|PATH N\n", argv[0]);
		return 2;
	}
	int self = strcmp(argv[2], "self") == 0;
	long n = atol(argv[3]);
	struct bpf_object *obj = bpf_object__open_file(argv[1], NULL);
	if (!obj) {
		fprintf(stderr, "open: %s\n", strerror(errno));
		return 1;
	}
	struct bpf_map *rodata = bpf_object__find_map_by_name(obj, ".rodata");
	if (!rodata) {
		fprintf(stderr, "no .rodata\n");
		return 1;
	}
	size_t sz;
	unsigned long long *ro = (unsigned long long *)bpf_map__initial_value(rodata, &sz);
	*ro = MAGIC;
	((unsigned int *)(ro + 1))[0] = getpid();
	int err = bpf_object__load(obj);
	if (err) {
		fprintf(stderr, "load: %d\n", err);
		return 1;
	}
	if (strcmp(argv[2], "tp") == 0)
		return tp_mode(obj);
	const char *bin = self ? "/proc/self/exe" : argv[2];
	LIBBPF_OPTS(bpf_uprobe_opts, eo, .func_name = "target_func");
	LIBBPF_OPTS(bpf_uprobe_opts, ro_, .func_name = "target_func", .retprobe = true);
	struct bpf_link *l1 = bpf_program__attach_uprobe_opts(bpf_object__find_program_by_name(obj, "on_entry"), self ? 0 : -1, bin, 0, &eo);
	struct bpf_link *l2 = bpf_program__attach_uprobe_opts(bpf_object__find_program_by_name(obj, "on_return"), self ? 0 : -1, bin, 0, &ro_);
	if (!l1 || !l2) {
		fprintf(stderr, "attach: %s\n", strerror(errno));
		return 1;
	}
	struct perf_buffer *pb = perf_buffer__new(bpf_map__fd(bpf_object__find_map_by_name(obj, "events")), 8, on_sample, on_lost, NULL, NULL);
	struct ring_buffer *rb = ring_buffer__new(bpf_map__fd(bpf_object__find_map_by_name(obj, "rb")), on_rb, NULL, NULL);
	if (!pb || !rb) {
		fprintf(stderr, "buffers: %s\n", strerror(errno));
		return 1;
	}
	long expect = 0;
	for (long i = 1; i <= n; i++)
		expect += i;
	if (self) {
		long sum = 0;
		for (long i = 1; i <= n; i++)
			sum += target_func(i);
		if (sum != 2 * expect)
			bad++;
	} else {
		printf("ready\n");
		fflush(stdout);
	}
	// Wait for the data with the loaders' own poll loops (each poll blocks until a wakeup
	// or the timeout).
	double deadline = now() + 20;
	long polls = 0;
	while ((perf_n < n || rb_n < n) && now() < deadline) {
		if (perf_n < n && perf_buffer__poll(pb, 200) < 0)
			bad++;
		if (rb_n < n && ring_buffer__poll(rb, 200) < 0)
			bad++;
		polls++;
	}
	// .bss through a lookup and through an mmap of the (BPF_F_MMAPABLE) map, as skeletons read it.
	int bss = bpf_map__fd(bpf_object__find_map_by_name(obj, ".bss"));
	unsigned long long hits = 0, zero = 0;
	if (bpf_map_lookup_elem(bss, &zero, &hits))
		bad++;
	unsigned long long *view = mmap(NULL, 4096, PROT_READ, MAP_SHARED, bss, 0);
	if (view == MAP_FAILED) {
		fprintf(stderr, "mmap .bss: %s\n", strerror(errno));
		return 1;
	}
	printf("perf=%ld perf_sum=%ld rb=%ld rb_sum=%ld lost=%ld bad=%ld hits=%llu mmapped_hits=%llu expect_sum=%ld\n",
	       perf_n, perf_sum, rb_n, rb_sum / 2, lost_n, bad, hits, view[0], expect);
	// Closing the links (and their perf events) detaches the programs before close returns.
	bpf_link__destroy(l1);
	bpf_link__destroy(l2);
	if (self) {
		target_func(1000);
		perf_buffer__poll(pb, 100);
		ring_buffer__poll(rb, 100);
		printf("after_detach: hits=%llu perf=%ld rb=%ld\n", view[0], perf_n, rb_n);
	}
	perf_buffer__free(pb);
	ring_buffer__free(rb);
	bpf_object__close(obj);
	return 0;
}
