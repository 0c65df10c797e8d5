// Usage: acks_target DIR: prints "work ADDR", forks; the child calls work() every millisecond
// until DIR/stop exists, then exits (exit handlers run); the parent prints "child PID", waits
// for it and prints whether it ended well.
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

__attribute__((noinline)) long work(long x)
{
	__asm__ volatile("" ::: "memory");
	return x + 1;
}

int main(int argc, char **argv)
{
	if (argc < 2)
		return 2;
	char stop[4096];
	snprintf(stop, sizeof(stop), "%s/stop", argv[1]);
	printf("work %p\n", (void *)work);
	fflush(stdout);
	pid_t c = fork();
	if (c == 0) {
		long i = 0;
		while (access(stop, F_OK) != 0) {
			work(i++);
			usleep(1000);
		}
		exit(0);
	}
	printf("child %d\n", c);
	fflush(stdout);
	int st;
	int ok = waitpid(c, &st, 0) == c && WIFEXITED(st) && WEXITSTATUS(st) == 0;
	printf("acks_target: child %s\n", ok ? "ok" : "FAILED");
	return !ok;
}
