// System call dispatch under stress: 4 threads making getppid() 20000 times each, every
// 1000th call with every signal blocked (pthread_sigmask: SIGSYS must stay deliverable); 50
// SIGUSR1s (raise: delivered before it returns) whose handler, installed with a full
// sa_mask, calls getppid(); a forked child making 1000 calls. Prints the handler's count and
// the child's status.
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile long usr1;

static void on_usr1(int sig)
{
	usr1++;
	getppid();
}

static void *work(void *arg)
{
	sigset_t all;
	sigfillset(&all);
	for (int i = 0; i < 20000; i++) {
		getppid();
		if (i % 1000 == 0) {
			pthread_sigmask(SIG_BLOCK, &all, NULL);
			getppid();
			pthread_sigmask(SIG_UNBLOCK, &all, NULL);
		}
	}
	return NULL;
}

int main(void)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_usr1;
	sigfillset(&sa.sa_mask);
	sigaction(SIGUSR1, &sa, NULL);
	pthread_t t[4];
	for (int i = 0; i < 4; i++)
		pthread_create(&t[i], NULL, work, NULL);
	for (int i = 0; i < 50; i++)
		raise(SIGUSR1);
	pid_t p = fork();
	if (p == 0) {
		for (int i = 0; i < 1000; i++)
			getppid();
		_exit(0);
	}
	int st = 0;
	waitpid(p, &st, 0);
	for (int i = 0; i < 4; i++)
		pthread_join(t[i], NULL);
	printf("syscalls_stress: %ld signals handled, child status %d\n", usr1, st);
	return 0;
}
