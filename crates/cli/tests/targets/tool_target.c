// Target of the `userbpf tool` tests: known calls. Each number N read from stdin (or, with
// arguments, the arguments themselves) runs one round: tt_alpha N times, tt_beta 2N times,
// tt_gamma 3N times, tt_greet once per i < N with ("name-<i>", i), check_sign once per i < N
// (an int: -1 for odd i, else i). Prints "ready" first and
// "done N" after each round; ends at end of input.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

volatile long sink;

__attribute__((noinline)) long tt_alpha(long n) { sink += n; return n * 2; }
__attribute__((noinline)) long tt_beta(long n) { sink += n; return n + 1; }
__attribute__((noinline)) long tt_gamma(long n) { sink -= n; return -n; }
__attribute__((noinline)) long tt_greet(const char *name, long i) { sink += strlen(name) + i; return i * 10; }
__attribute__((noinline)) int check_sign(long i) { sink += i; return i % 2 ? -1 : (int)i; }

static void round_of(long n)
{
	char name[32];

	for (long i = 0; i < n; i++)
		tt_alpha(i);
	for (long i = 0; i < 2 * n; i++)
		tt_beta(i);
	for (long i = 0; i < 3 * n; i++)
		tt_gamma(i);
	for (long i = 0; i < n; i++) {
		snprintf(name, sizeof name, "name-%ld", i);
		tt_greet(name, i);
	}
	for (long i = 0; i < n; i++)
		check_sign(i);
	printf("done %ld\n", n);
	fflush(stdout);
}

int main(int argc, char **argv)
{
	long n;

	printf("ready\n");
	fflush(stdout);
	if (argc > 1) {
		for (int i = 1; i < argc; i++)
			round_of(atol(argv[i]));
		return 0;
	}
	while (scanf("%ld", &n) == 1)
		round_of(n);
	return 0;
}
