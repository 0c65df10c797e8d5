// The uprobe benchmark's target: calls bench_fn (in this executable) or lib_fn (in
// libbenchlib.so) N times and prints the ns per call measured around the loop only, so
// process start-up, the agent's attach and the kernel's uprobe registration are excluded.
// Wall time and the thread's CPU time (user + system: a kernel uprobe's trap is charged to
// the thread) are both printed; the CPU time is what the bench uses, as it does not count
// time the thread spent waiting for a CPU on a busy machine.
//
//   target exe|lib N    ->  "ns_per_call=%.3f cpu_ns_per_call=%.3f calls=%ld sum=%ld"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

long lib_fn(long x);

__attribute__((noinline)) long bench_fn(long x)
{
	__asm__ volatile("" : "+r"(x));
	return x * 3 + 1;
}

static double now_ns(clockid_t clock)
{
	struct timespec ts;
	clock_gettime(clock, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char **argv)
{
	if (argc != 3 || (strcmp(argv[1], "exe") && strcmp(argv[1], "lib"))) {
		fprintf(stderr, "usage: %s exe|lib N\n", argv[0]);
		return 2;
	}
	long n = atol(argv[2]), sum = 0;
	int in_exe = !strcmp(argv[1], "exe");
	double t0 = now_ns(CLOCK_MONOTONIC), c0 = now_ns(CLOCK_THREAD_CPUTIME_ID);
	if (in_exe)
		for (long i = 0; i < n; i++)
			sum += bench_fn(i);
	else
		for (long i = 0; i < n; i++)
			sum += lib_fn(i);
	double c1 = now_ns(CLOCK_THREAD_CPUTIME_ID), t1 = now_ns(CLOCK_MONOTONIC);
	printf("ns_per_call=%.3f cpu_ns_per_call=%.3f calls=%ld sum=%ld\n", (t1 - t0) / n, (c1 - c0) / n, n, sum);
	return 0;
}
