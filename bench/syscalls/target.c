// The system call tracepoint benchmark's target: getppid() through libc's wrapper (a site
// userbpf rewrites into a jump) and through an inline `syscall` instruction of this program's
// own (left to Syscall User Dispatch), in alternating rounds of N/ROUNDS calls each (so both
// see the same machine). Prints the median nanoseconds per call of each kind's rounds:
// "libc NS inline NS". A second argument "libc" or "inline" runs only that kind (profiling).
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define ROUNDS 21

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

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	long n = (argc > 1 ? atol(argv[1]) : 200000) / ROUNDS;
	const char *only = argc > 2 ? argv[2] : "";
	int libc = only[0] != 'i', inl = only[0] != 'l';
	double tl[ROUNDS], ti[ROUNDS];
	long sum = 0;
	for (long i = 0; i < n; i++) /* warm up */
		sum += (libc ? getppid() : 0) + (inl ? inline_getppid() : 0);
	for (int r = 0; r < ROUNDS; r++) {
		double t0 = now();
		for (long i = 0; i < n && libc; i++)
			sum += getppid();
		double t1 = now();
		for (long i = 0; i < n && inl; i++)
			sum += inline_getppid();
		double t2 = now();
		tl[r] = (t1 - t0) / n;
		ti[r] = (t2 - t1) / n;
	}
	qsort(tl, ROUNDS, sizeof(double), cmp);
	qsort(ti, ROUNDS, sizeof(double), cmp);
	printf("libc %.1f inline %.1f sum %ld\n", tl[ROUNDS / 2], ti[ROUNDS / 2], sum);
	return 0;
}
