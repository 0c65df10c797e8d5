// A target for the examples: calls work() many times, with inputs of varying cost.
#include <stdio.h>
#include <stdlib.h>

__attribute__((noinline)) long work(long n)
{
	long s = 0;
	for (long i = 0; i < n; i++)
		s += i * i % 7;
	return s;
}

int main(int argc, char **argv)
{
	long iters = argc > 1 ? atol(argv[1]) : 100000, total = 0;

	for (long i = 0; i < iters; i++)
		total += work((i * 7919) % 4096);
	printf("workload: %ld calls of work(), total %ld\n", iters, total);
	return 0;
}
