// The target of the loader tests (bpftrace one-liners, libbpf programs): calls functions with
// known arguments, strings and return values a fixed number of times, the same in every run.
//
// Protocol (so that a test can attach before the workload runs, in either order): the target
// prints "ready PID" and one "fn NAME 0xADDR" line per probed function, then waits for a line on
// stdin; it runs the workload, prints "done", and waits for stdin to close before exiting (so a
// tracer can still read /proc/PID/maps to symbolise user stacks). With "--now" it runs at once
// and exits (for `bpftrace -c`).
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define PROBE __attribute__((noipa, used))

// Every probed function first counts its call (so none is just a few bytes long: userbpf's
// inline hooks need the function's first 5 bytes to be straight-line code).
static volatile unsigned long called[16];
#define COUNT(i) (called[i]++)

// Single-threaded phase.
PROBE long add(long a, long b) { COUNT(0); return a + b; }
PROBE long six(long a, long b, long c, long d, long e, long f) { COUNT(1); return a * 100000 + b * 10000 + c * 1000 + d * 100 + e * 10 + f; }
PROBE int greet(const char *name, int n, unsigned x, const char *tag) { COUNT(2); return (int)strlen(name) + n + (int)x + (int)strlen(tag); }
PROBE void mark(int phase) { COUNT(3); __asm__ volatile("" ::"r"(phase)); }
PROBE int leaf(int path) { COUNT(4); return path * 2; }
PROBE int inner(int path) { COUNT(5); return leaf(path) + 1; }
PROBE int middle(int path) { COUNT(6); return inner(path) + 1; }
PROBE int outer_a(void) { COUNT(7); return middle(1) + 1; }
PROBE int outer_b(void) { COUNT(8); return inner(2) + 1; }

// Multi-threaded phase.
PROBE long tadd(long t, long i) { COUNT(9); return t * 1000 + i; }
PROBE long nap(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
	COUNT(10);
	while (nanosleep(&ts, &ts) != 0)
		;
	return ms;
}

#define THREADS 4
#define TADDS 50

static void *worker(void *arg)
{
	long t = (long)arg;
	for (long i = 0; i < TADDS; i++)
		tadd(t, i);
	// 12, 24 and 48 ms: each in the middle of a power-of-two bucket of milliseconds.
	for (long k = 0; k < 3; k++)
		nap(12L << ((k + t) % 3));
	return NULL;
}

static long workload(void)
{
	long sum = 0;
	char name[32], tag[8];

	for (long i = 0; i < 20; i++)
		sum += add(i, 2 * i);
	for (long i = 0; i < 12; i++)
		sum += six(i % 3, i % 2, 7, -1, 0x1234, i);
	for (int i = 0; i < 8; i++) {
		// Strings on the stack, written here: the kernel's probe reads see them resident.
		snprintf(name, sizeof(name), "item-%d", i * 7);
		snprintf(tag, sizeof(tag), "t%dxyz", i % 3);
		sum += greet(name, i, 0xa0u + (unsigned)i, tag);
	}
	for (int i = 0; i < 3; i++)
		sum += outer_a();
	for (int i = 0; i < 5; i++)
		sum += outer_b();
	mark(1);
	for (long i = 0; i < 10; i++)
		sum += add(100 + i, i);
	mark(2);

	pthread_t th[THREADS];
	for (long t = 0; t < THREADS; t++)
		if (pthread_create(&th[t], NULL, worker, (void *)t) != 0) {
			perror("pthread_create");
			exit(1);
		}
	for (long t = 0; t < THREADS; t++)
		pthread_join(th[t], NULL);
	return sum;
}

int main(int argc, char **argv)
{
	char line[64];

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc > 1 && strcmp(argv[1], "--now") == 0) {
		printf("target: sum %ld\n", workload());
		return 0;
	}
	printf("ready %d\n", (int)getpid());
	printf("fn add %p\nfn six %p\nfn greet %p\nfn mark %p\nfn leaf %p\nfn inner %p\nfn middle %p\n"
	       "fn outer_a %p\nfn outer_b %p\nfn tadd %p\nfn nap %p\nend\n",
	       (void *)add, (void *)six, (void *)greet, (void *)mark, (void *)leaf, (void *)inner, (void *)middle,
	       (void *)outer_a, (void *)outer_b, (void *)tadd, (void *)nap);
	if (!fgets(line, sizeof(line), stdin))
		return 1;
	printf("done %ld\n", workload());
	while (fgets(line, sizeof(line), stdin))
		;
	return 0;
}
