// Usage: forkexec_target N: work() runs N times in each of: a second thread of the parent,
// a child forked while that thread calls it, a child that execs this program again
// (`forkexec_target N exec`), and the parent. Prints what each did.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

__attribute__((noinline)) long work(long x)
{
	__asm__ volatile("" ::: "memory");
	return x * 2 + 1;
}

static int n;

static void *spin(void *arg)
{
	long s = 0;
	for (int i = 0; i < n; i++)
		s += work(i);
	return (void *)s;
}

static int wait_ok(pid_t pid)
{
	int st;
	return waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

int main(int argc, char **argv)
{
	n = argc > 1 ? atoi(argv[1]) : 1000;
	long s = 0;
	if (argc > 2 && strcmp(argv[2], "exec") == 0) {
		for (int i = 0; i < n; i++)
			s += work(i);
		printf("exec child: %d calls\n", n);
		return 0;
	}
	pthread_t t;
	pthread_create(&t, NULL, spin, NULL);
	pid_t c = fork();
	if (c == 0) {
		for (int i = 0; i < n; i++)
			s += work(i);
		printf("forked child: %d calls\n", n);
		fflush(stdout);
		_exit(0);
	}
	int ok = wait_ok(c);
	fflush(stdout);
	pid_t e = fork();
	if (e == 0) {
		execl("/proc/self/exe", argv[0], argv[1], "exec", (char *)NULL);
		_exit(127);
	}
	ok &= wait_ok(e);
	for (int i = 0; i < n; i++)
		s += work(i);
	pthread_join(t, NULL);
	printf("forkexec_target: parent %d calls, children %s\n", n, ok ? "ok" : "FAILED");
	return ok ? 0 : 1;
}
