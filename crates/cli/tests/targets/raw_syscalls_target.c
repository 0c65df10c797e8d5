// System calls made by inline `syscall` instructions, outside libc. Usage:
// raw_syscalls_target N: getppid N times that way in the main thread, in a thread created
// afterwards (which blocks every signal first) and in a forked child; libc's getppid() once; a raw rt_sigprocmask that blocks
// SIGUSR1 (checked through libc), a signal handler returning through a raw rt_sigreturn, the
// program's own SIGSYS handlers (through libc and raw), a raw sigaltstack, and a raw write
// of a line.
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static long raw6(long nr, long a, long b, long c, long d)
{
	long r;
	register long r10 __asm__("r10") = d;
	__asm__ volatile("syscall" : "=a"(r) : "a"(nr), "D"(a), "S"(b), "d"(c), "r"(r10) : "rcx", "r11", "memory");
	return r;
}

static int n;
static long mismatches;

// A signal restorer of the program's own: rt_sigreturn from outside libc.
void own_restorer(void);
__asm__(".text\n.globl own_restorer\nown_restorer:\n\tmov $15, %eax\n\tsyscall\n");
static volatile int usr2_hits, sys_hits, sys2_hits;
static void on_usr2(int sig) { usr2_hits++; }
static void on_sys(int sig) { sys_hits++; }
static void on_sys2(int sig) { sys2_hits++; }
static char altstack[65536];
struct kernel_sigaction {
	void (*handler)(int);
	unsigned long flags;
	void (*restorer)(void);
	unsigned long mask;
};

static void *thread_main(void *arg)
{
	long pid = (long)arg;
	// A worker that blocks every signal (as servers do) still makes raw system calls.
	sigset_t all;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL);
	for (int i = 0; i < n; i++)
		if (raw6(SYS_getppid, 0, 0, 0, 0) != pid)
			__sync_fetch_and_add(&mismatches, 1);
	return NULL;
}

int main(int argc, char **argv)
{
	n = argc > 1 ? atoi(argv[1]) : 100;
	long pid = getppid();
	for (int i = 0; i < n; i++)
		if (raw6(SYS_getppid, 0, 0, 0, 0) != pid)
			mismatches++;
	pthread_t t;
	pthread_create(&t, NULL, thread_main, (void *)pid);
	pthread_join(t, NULL);
	fflush(stdout);
	pid_t c = fork();
	if (c == 0) {
		long me = raw6(SYS_getppid, 0, 0, 0, 0);
		for (int i = 1; i < n; i++)
			if (raw6(SYS_getppid, 0, 0, 0, 0) != me)
				_exit(1);
		_exit(me == pid ? 1 : 0);
	}
	int st;
	if (waitpid(c, &st, 0) != c || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
		mismatches++;
	unsigned long set = 1UL << (SIGUSR1 - 1);
	if (raw6(SYS_rt_sigprocmask, SIG_BLOCK, (long)&set, 0, 8) != 0)
		mismatches++;
	sigset_t now;
	sigprocmask(SIG_BLOCK, NULL, &now);
	if (!sigismember(&now, SIGUSR1))
		mismatches++;
	// A handler installed by a raw rt_sigaction whose restorer makes a raw rt_sigreturn.
	struct kernel_sigaction ka = { on_usr2, 0x04000000 /* SA_RESTORER */, own_restorer, 0 };
	if (raw6(SYS_rt_sigaction, SIGUSR2, (long)&ka, 0, 8) != 0)
		mismatches++;
	raise(SIGUSR2);
	raise(SIGUSR2);
	if (usr2_hits != 2)
		mismatches++;
	// The program's own SIGSYS handler gets the SIGSYS it raises; raw calls still trap.
	signal(SIGSYS, on_sys);
	raise(SIGSYS);
	if (sys_hits != 1)
		mismatches++;
	struct kernel_sigaction ks = { on_sys2, 0x04000000, own_restorer, 0 };
	if (raw6(SYS_rt_sigaction, SIGSYS, (long)&ks, 0, 8) != 0)
		mismatches++;
	raise(SIGSYS);
	if (sys2_hits != 1 || sys_hits != 1)
		mismatches++;
	// A raw sigaltstack stays set.
	stack_t ss = { .ss_sp = altstack, .ss_size = sizeof(altstack), .ss_flags = 0 }, cur;
	if (raw6(SYS_sigaltstack, (long)&ss, 0, 0, 0) != 0)
		mismatches++;
	if (sigaltstack(NULL, &cur) != 0 || cur.ss_sp != altstack || cur.ss_size != sizeof(altstack))
		mismatches++;
	const char line[] = "raw write\n";
	if (raw6(SYS_write, 1, (long)line, strlen(line), 0) != (long)strlen(line))
		mismatches++;
	printf("raw_syscalls_target: %d raw getppid calls in each of 3 processes/threads, %ld mismatches\n", n, mismatches);
	return 0;
}
