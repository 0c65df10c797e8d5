// A process traced by a loader: calls target_func(1..N) once it is told to (a line on stdin),
// PACE microseconds apart if given (a steady stream), then waits for a second
// line before exiting.
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_us(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

__attribute__((noinline)) long target_func(long x)
{
	asm volatile("" ::: "memory");
	return x * 2;
}

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 10, sum = 0;
	double pace = argc > 2 ? atof(argv[2]) : 0;
	char line[64];

	printf("started\n");
	fflush(stdout);
	if (!fgets(line, sizeof line, stdin))
		return 1;
	double start = now_us();
	for (long i = 1; i <= n; i++) {
		double wait = start + pace * (i - 1) - now_us();
		if (wait > 0) {
			struct timespec ts = { 0, (long)(wait * 1e3) };
			nanosleep(&ts, NULL);
		}
		sum += target_func(i);
	}
	printf("sum=%ld\n", sum);
	fflush(stdout);
	if (!fgets(line, sizeof line, stdin))
		return 0;
	return 0;
}
