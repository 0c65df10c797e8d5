// The system call tracepoint benchmark's target: N calls of getppid() through libc's wrapper
// (a site userbpf rewrites into a jump) and N through an inline `syscall` instruction of this
// program's own (left to Syscall User Dispatch), timed separately. Prints the nanoseconds per
// call of each: "libc NS inline NS".
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static long inline_getppid(void)
{
	long r;
	__asm__ volatile("syscall" : "=a"(r) : "a"(110L) : "rcx", "r11", "memory");
	return r;
}

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e9 + t.tv_nsec;
}

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 200000;
	/* "libc" or "inline" as a second argument: only that loop (for profiling). */
	const char *only = argc > 2 ? argv[2] : "";
	long sum = 0;
	for (long i = 0; i < n / 10; i++) /* warm up */
		sum += getppid() + inline_getppid();
	double t0 = now();
	for (long i = 0; i < n && only[0] != 'i'; i++)
		sum += getppid();
	double t1 = now();
	for (long i = 0; i < n && only[0] != 'l'; i++)
		sum += inline_getppid();
	double t2 = now();
	printf("libc %.1f inline %.1f sum %ld\n", (t1 - t0) / n, (t2 - t1) / n, sum);
	return 0;
}
