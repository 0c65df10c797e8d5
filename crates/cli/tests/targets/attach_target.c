// A process started without userbpf, to attach to. Its main thread blocks in read() on stdin
// the whole time (the thread an injection borrows) and counts any EINTR; a worker thread
// calls work() in a loop, with a busy pause between calls (no system call), until the main
// thread reads a line. Then it prints how many calls were made and the EINTR count.
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

static volatile int stop;
static long calls, sum;

__attribute__((noinline)) long work(long i)
{
	asm volatile("" ::: "memory");
	return i * 2 + 1;
}

static void *worker(void *arg)
{
	(void)arg;
	while (!stop) {
		sum += work(calls++);
		for (volatile int spin = 0; spin < 20000; spin++)
			;
	}
	return NULL;
}

int main(void)
{
	pthread_t t;
	int eintr = 0;
	char buf[64];
	printf("ready %d\n", getpid());
	fflush(stdout);
	pthread_create(&t, NULL, worker, NULL);
	while (read(0, buf, sizeof(buf)) < 0)
		if (errno == EINTR)
			eintr++;
	stop = 1;
	pthread_join(t, NULL);
	printf("calls %ld sum %ld eintr %d\n", calls, sum, eintr);
	return 0;
}
