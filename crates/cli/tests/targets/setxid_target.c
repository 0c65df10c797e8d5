// Usage: setxid_target N: with one worker thread of its own waiting, N calls of
// setresuid(-1, -1, -1) (each makes glibc signal every other thread of the process with
// SIGSETXID, tgkill), then one tgkill and one tkill of signal 0 to itself.
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

static int fds[2];

static void *worker(void *arg)
{
	char c;
	(void)arg;
	return read(fds[0], &c, 1) == 1 ? NULL : (void *)1;
}

int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 10, failed = 0;
	pthread_t t;
	if (pipe(fds) || pthread_create(&t, NULL, worker, NULL))
		return 1;
	for (int i = 0; i < n; i++)
		failed += setresuid(-1, -1, -1) != 0;
	failed += syscall(SYS_tgkill, getpid(), gettid(), 0) != 0;
	failed += syscall(SYS_tkill, gettid(), 0) != 0;
	if (write(fds[1], "x", 1) != 1 || pthread_join(t, NULL))
		return 1;
	printf("setxid_target: %d setresuid calls, %d failed\n", n, failed);
	return 0;
}
