// The attach-pause benchmark's target: worker threads call work() in a loop and record the
// longest time between two of their iterations (a pause: the thread stopped by ptrace,
// waiting for a patch, descheduled). The main thread stays blocked in read() on stdin, as a
// server's accept loop would, and answers commands:
//   r  reset the longest pauses (each worker clears its own when it next looks)
//   p  print "MAXGAP_NS CALLS" (the longest pause of any worker since the reset, all calls)
//   q  exit
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_WORKERS 16

static _Atomic unsigned long long maxgap[MAX_WORKERS];
static _Atomic unsigned long long calls[MAX_WORKERS];
static _Atomic int resets;

__attribute__((noinline)) long work(long x)
{
	__asm__ volatile("" : "+r"(x));
	return x * 3 + 1;
}

static unsigned long long now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (unsigned long long)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

static void *worker(void *arg)
{
	int i = (int)(long)arg;
	int seen = atomic_load(&resets);
	unsigned long long last = now_ns(), mine = 0, n = 0;
	long acc = 0;
	for (;;) {
		for (int k = 0; k < 64; k++)
			acc += work(k);
		n += 64;
		unsigned long long t = now_ns();
		int r = atomic_load_explicit(&resets, memory_order_relaxed);
		if (r != seen) {
			seen = r;
			mine = 0;
			atomic_store_explicit(&maxgap[i], 0, memory_order_relaxed);
		} else if (t - last > mine) {
			mine = t - last;
			atomic_store_explicit(&maxgap[i], mine, memory_order_relaxed);
		}
		last = t;
		atomic_store_explicit(&calls[i], n, memory_order_relaxed);
		if (acc == 42)
			puts("");
	}
	return NULL;
}

int main(int argc, char **argv)
{
	int workers = argc > 1 ? atoi(argv[1]) : 2;
	if (workers < 1 || workers > MAX_WORKERS)
		workers = 2;
	setvbuf(stdout, NULL, _IONBF, 0);
	for (int i = 0; i < workers; i++) {
		pthread_t t;
		pthread_create(&t, NULL, worker, (void *)(long)i);
	}
	printf("ready %d\n", getpid());
	char line[64];
	for (;;) {
		ssize_t n = read(0, line, sizeof line - 1);
		if (n <= 0)
			return 0;
		line[n] = 0;
		if (line[0] == 'r') {
			// Each worker clears its own record when it sees the new reset.
			atomic_fetch_add(&resets, 1);
			usleep(20000);
			printf("ok\n");
		} else if (line[0] == 'p') {
			unsigned long long g = 0, c = 0;
			for (int i = 0; i < workers; i++) {
				unsigned long long v = atomic_load(&maxgap[i]);
				g = v > g ? v : g;
				c += atomic_load(&calls[i]);
			}
			printf("%llu %llu\n", g, c);
		} else if (line[0] == 'q') {
			return 0;
		}
	}
}
