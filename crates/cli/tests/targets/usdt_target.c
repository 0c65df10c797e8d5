// A USDT target: probes with register, memory and constant arguments (this file, without
// semaphores) and a semaphore-guarded probe (usdt_guarded.c, built with _SDT_HAS_SEMAPHORES).
// Usage: usdt_target N. Prints how often the guarded probe found its semaphore raised.
#include <stdio.h>
#include <stdlib.h>
#include <sys/sdt.h>

long guarded(long n);

__attribute__((noinline)) long work(int i, unsigned char small)
{
	volatile long mem = -3L * i;       /* on the stack: a memory operand */
	long reg = (long)i * 1000;
	STAP_PROBE3(app, three, i, mem, -7);
	DTRACE_PROBE2(app, two, small, reg);
	return mem + reg;
}

int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 10;
	long acc = 0, enabled = 0;
	for (int i = 0; i < n; i++) {
		acc += work(i, (unsigned char)(i + 250));
		enabled += guarded(i);
	}
	printf("usdt_target: %d iterations, guarded probe enabled %ld times (acc %ld)\n", n, enabled, acc);
	return 0;
}
