// A process started without userbpf, to attach to: calls work() in a loop (a pause between
// calls, blocked in nanosleep) until its stdin closes; prints how many calls it made and
// whether any sleep was interrupted (EINTR).
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

__attribute__((noinline)) long work(long i)
{
	asm volatile("" ::: "memory");
	return i * 2 + 1;
}

int main(void)
{
	long calls = 0, sum = 0;
	int eintr = 0;
	printf("ready %d\n", getpid());
	fflush(stdout);
	for (;;) {
		sum += work(calls++);
		struct timespec ts = { 0, 500 * 1000 };
		while (nanosleep(&ts, &ts) != 0)
			if (errno == EINTR)
				eintr++;
		struct pollfd p = { 0, POLLIN, 0 };
		if (poll(&p, 1, 0) > 0)
			break;
	}
	printf("calls %ld sum %ld eintr %d\n", calls, sum, eintr);
	return 0;
}
