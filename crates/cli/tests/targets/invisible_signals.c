// Issue 18's matrix: signals sent to the process. SIGUSR1 has a handler (which notes the
// thread it ran on); SIGUSR2 is blocked in every thread and read from a signalfd; a worker
// thread blocks both. Prints "ready PID", then what arrived where.
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <unistd.h>

static volatile pid_t handled_on;

static void on_usr1(int sig)
{
	(void)sig;
	handled_on = syscall(SYS_gettid);
}

static void *worker(void *arg)
{
	(void)arg;
	for (;;)
		pause();
	return NULL;
}

int main(void)
{
	sigset_t both;
	sigemptyset(&both);
	sigaddset(&both, SIGUSR1);
	sigaddset(&both, SIGUSR2);
	// The worker blocks both (it inherits the mask); the main thread only SIGUSR2.
	pthread_sigmask(SIG_BLOCK, &both, NULL);
	pthread_t t;
	pthread_create(&t, NULL, worker, NULL);
	sigset_t usr2;
	sigemptyset(&usr2);
	sigaddset(&usr2, SIGUSR2);
	sigset_t usr1;
	sigemptyset(&usr1);
	sigaddset(&usr1, SIGUSR1);
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_usr1;
	sa.sa_flags = SA_RESTART;
	sigaction(SIGUSR1, &sa, NULL);
	pthread_sigmask(SIG_UNBLOCK, &usr1, NULL);
	int sfd = signalfd(-1, &usr2, 0);
	printf("ready %d\n", getpid());
	fflush(stdout);
	struct signalfd_siginfo si;
	if (read(sfd, &si, sizeof si) != sizeof si)
		return 1;
	printf("signalfd: %s\n", strsignal(si.ssi_signo));
	while (!handled_on)
		pause();
	printf("SIGUSR1 handled on the main thread: %s\n", handled_on == getpid() ? "yes" : "no");
	return 0;
}
