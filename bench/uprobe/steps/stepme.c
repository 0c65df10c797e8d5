// The target of steps.sh: waits until bench_fn is patched (when waiting is asked), calls it
// 200,000 times with the same argument, waits for a tracer, then stops itself (SIGSTOP), calls
// bench_fn(7) once and stops again: the tracer single-steps everything in between.
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "stepped.h"

__attribute__((noinline)) long bench_fn(long x)
{
	__asm__ volatile("" : "+r"(x));
	return x * 3 + 1;
}

int main(int argc, char **argv)
{
	int wait = argc > 1 && atoi(argv[1]);
	volatile unsigned char *code = (volatile unsigned char *)(void *)bench_fn;
	while (wait && code[0] != 0xe9)
		usleep(1000);
	long s = 0;
	for (long i = 0; i < 200000; i++)
		s += bench_fn(7 + (i & 0));
	stop_for_tracer();
	s += bench_fn(7);
	raise(SIGSTOP);
	printf("%ld\n", s);
	return 0;
}
