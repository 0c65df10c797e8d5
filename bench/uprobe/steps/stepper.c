// stepper PID: attaches to PID (stepme), waits for its first SIGSTOP, single-steps it to its
// second and prints how many instructions it ran in between.
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ptrace.h>
#include <sys/wait.h>

int main(int argc, char **argv)
{
	if (argc != 2)
		return 2;
	int pid = atoi(argv[1]), st;
	long n = 0;
	if (ptrace(PTRACE_SEIZE, pid, 0, 0)) {
		perror("PTRACE_SEIZE");
		return 1;
	}
	for (;;) {
		if (waitpid(pid, &st, 0) < 0 || !WIFSTOPPED(st)) {
			perror("waitpid");
			return 1;
		}
		if (WSTOPSIG(st) == SIGSTOP)
			break;
		ptrace(PTRACE_CONT, pid, 0, WSTOPSIG(st));
	}
	for (;;) {
		ptrace(PTRACE_SINGLESTEP, pid, 0, 0);
		if (waitpid(pid, &st, 0) < 0 || !WIFSTOPPED(st)) {
			fprintf(stderr, "stepper: the target went away\n");
			return 1;
		}
		if (WSTOPSIG(st) != SIGTRAP)
			break;
		n++;
	}
	printf("%ld\n", n);
	ptrace(PTRACE_DETACH, pid, 0, 0);
	kill(pid, SIGCONT);
	return 0;
}
