// A process traced by a loader: calls target_func(1..N) once it is told to (a line on stdin),
// then waits for a second line before exiting.
#include <stdio.h>
#include <stdlib.h>

__attribute__((noinline)) long target_func(long x)
{
	asm volatile("" ::: "memory");
	return x * 2;
}

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 10, sum = 0;
	char line[64];

	printf("started\n");
	fflush(stdout);
	if (!fgets(line, sizeof line, stdin))
		return 1;
	for (long i = 1; i <= n; i++)
		sum += target_func(i);
	printf("sum=%ld\n", sum);
	fflush(stdout);
	if (!fgets(line, sizeof line, stdin))
		return 0;
	return 0;
}
