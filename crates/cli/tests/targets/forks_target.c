// Usage: forks_target N: forks N children one after the other; each calls getppid() once and
// exits; the parent waits for each. (tests/syscalls.rs: the system calls of the children are
// the program's only, not those of userbpf's fork handlers.)
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 5, ok = 0;
	for (int i = 0; i < n; i++) {
		pid_t c = fork();
		if (c == 0)
			_exit(getppid() > 1 ? 0 : 1);
		int st;
		ok += c > 0 && waitpid(c, &st, 0) == c && WIFEXITED(st) && WEXITSTATUS(st) == 0;
	}
	printf("forks_target: %d of %d children ok\n", ok, n);
	return ok != n;
}
