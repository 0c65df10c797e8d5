// A program that takes SIGCHLD synchronously, as `script` and other tools do: SIGCHLD blocked,
// then read from a signalfd (and, for the second half, with sigtimedwait). Every thread of the
// process must leave SIGCHLD blocked, or the kernel hands the signal to that thread and the
// program never sees its child's exit. A 5 s timeout turns a lost signal into a failure.
//
// Usage: sigchld_target N   (N children, each waited for; a probed function called around)
#define _GNU_SOURCE
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static volatile unsigned long ticks;

__attribute__((noipa, used)) long tick(long i)
{
	ticks++;
	return i * 2;
}

static pid_t child(void)
{
	pid_t pid = fork();
	if (pid < 0) {
		perror("fork");
		exit(2);
	}
	if (pid == 0)
		_exit(7);
	return pid;
}

static void reap(pid_t pid)
{
	int status;
	if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 7) {
		fprintf(stderr, "sigchld_target: child %d not reaped as expected\n", (int)pid);
		exit(3);
	}
}

int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 10;
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGCHLD);
	if (sigprocmask(SIG_BLOCK, &set, NULL) != 0) {
		perror("sigprocmask");
		return 2;
	}
	int sfd = signalfd(-1, &set, SFD_CLOEXEC);
	if (sfd < 0) {
		perror("signalfd");
		return 2;
	}
	long sum = 0;
	for (int i = 0; i < n; i++) {
		sum += tick(i);
		pid_t pid = child();
		struct pollfd p = { .fd = sfd, .events = POLLIN };
		if (poll(&p, 1, 5000) != 1) {
			fprintf(stderr, "sigchld_target: no SIGCHLD on the signalfd within 5 s (child %d)\n", (int)pid);
			return 1;
		}
		struct signalfd_siginfo si;
		if (read(sfd, &si, sizeof(si)) != (ssize_t)sizeof(si) || si.ssi_signo != SIGCHLD) {
			fprintf(stderr, "sigchld_target: bad signalfd read\n");
			return 1;
		}
		reap(pid);
	}
	for (int i = 0; i < n; i++) {
		sum += tick(i);
		pid_t pid = child();
		struct timespec ts = { 5, 0 };
		siginfo_t info;
		if (sigtimedwait(&set, &info, &ts) != SIGCHLD) {
			fprintf(stderr, "sigchld_target: no SIGCHLD from sigtimedwait within 5 s (child %d)\n", (int)pid);
			return 1;
		}
		reap(pid);
	}
	printf("sigchld_target: %d children seen exiting, %lu ticks, sum %ld\n", 2 * n, ticks, sum);
	return 0;
}
