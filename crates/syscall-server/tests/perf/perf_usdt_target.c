// A process with a semaphore-guarded USDT probe: app:guarded fires only while a tracer has
// raised its semaphore. Calls guarded(1..N) when told to (a line on stdin), reports how many
// fired, then waits for a second line.
#define _SDT_HAS_SEMAPHORES 1
#include <stdio.h>
#include <stdlib.h>
#include <sys/sdt.h>

unsigned short app_guarded_semaphore __attribute__((section(".probes"))) = 0;

__attribute__((noinline)) long guarded(long n)
{
	if (__builtin_expect(app_guarded_semaphore, 0)) {
		STAP_PROBE1(app, guarded, n);
		return 1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 10, fired = 0;
	char line[64];

	printf("started\n");
	fflush(stdout);
	if (!fgets(line, sizeof line, stdin))
		return 1;
	for (long i = 1; i <= n; i++)
		fired += guarded(i);
	printf("fired=%ld\n", fired);
	fflush(stdout);
	if (!fgets(line, sizeof line, stdin))
		return 0;
	printf("semaphore=%d\n", app_guarded_semaphore);
	fflush(stdout);
	return 0;
}
