// The target of the privilege-drop tests (droproot.rs): started as root, it drops to nobody
// as daemons do (setgroups, setresgid, setresuid) when told, and calls `tick()` as often as
// told, so a probe added after the drop can be counted exactly.
//
// Protocol: prints "ready PID" and "fn tick 0xADDR", then reads commands on stdin, one a line:
//   drop          drop to nobody (65534) for good; prints "dropped UID GID"
//   run N         calls tick() N times; prints "ran N"
//   forkdrop N    forks a child that drops to nobody at once (before its agent thread can
//                 have run, as su's child does), waits for SIGUSR1, calls tick() N times,
//                 prints "child dropped UID", then "child ran N" and exits; the parent
//                 prints "child PID"
//   reap          waits for the child; prints "reaped STATUS"
//   quit          exits
#define _GNU_SOURCE
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile unsigned long ticks;

__attribute__((noipa, used)) long tick(long i)
{
	ticks++;
	__asm__ volatile("" ::"r"(i));
	return i + 1;
}

static void drop_to_nobody(void)
{
	if (setgroups(0, NULL) != 0 || setresgid(65534, 65534, 65534) != 0 || setresuid(65534, 65534, 65534) != 0) {
		perror("dropping privileges");
		exit(2);
	}
}

static volatile sig_atomic_t go;
static void on_usr1(int sig) { (void)sig; go = 1; }

int main(void)
{
	char line[128];
	pid_t child = 0;

	setvbuf(stdout, NULL, _IOLBF, 0);
	printf("ready %d\nfn tick %p\n", getpid(), (void *)tick);
	while (fgets(line, sizeof(line), stdin)) {
		long n;
		if (strncmp(line, "drop", 4) == 0 && (line[4] == '\n' || line[4] == 0)) {
			drop_to_nobody();
			printf("dropped %d %d\n", getuid(), getgid());
		} else if (sscanf(line, "run %ld", &n) == 1) {
			for (long i = 0; i < n; i++)
				tick(i);
			printf("ran %ld\n", n);
		} else if (sscanf(line, "forkdrop %ld", &n) == 1) {
			sigset_t set, old;
			sigemptyset(&set);
			sigaddset(&set, SIGUSR1);
			signal(SIGUSR1, on_usr1);
			sigprocmask(SIG_BLOCK, &set, &old);
			child = fork();
			if (child == 0) {
				drop_to_nobody();
				printf("child dropped %d\n", getuid());
				while (!go)
					sigsuspend(&old);
				for (long i = 0; i < n; i++)
					tick(i);
				printf("child ran %ld\n", n);
				fflush(stdout);
				_exit(0);
			}
			sigprocmask(SIG_SETMASK, &old, NULL);
			printf("child %d\n", child);
		} else if (strncmp(line, "reap", 4) == 0) {
			int st = 0;
			waitpid(child, &st, 0);
			printf("reaped %d\n", st);
		} else if (strncmp(line, "quit", 4) == 0) {
			break;
		}
	}
	return 0;
}
