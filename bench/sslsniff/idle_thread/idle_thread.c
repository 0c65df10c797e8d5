// Preloaded into nginx by the sslsniff benchmark's `thread` configuration: one idle thread in
// every process (made again in a forked child), and nothing else. It measures what being a
// multi-threaded process costs a program by itself: glibc then switches asynchronous
// cancellation on and off around every cancellable system call and takes its malloc arena
// locks. userbpf's agent keeps a thread in each process it runs in; the kernel's uprobes add
// none.
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

static void *idle(void *arg)
{
	(void)arg;
	for (;;)
		pause();
	return 0;
}

static void start_idle(void)
{
	// Every signal blocked while the thread is made (it inherits the mask): the program's
	// signals stay its own threads'.
	sigset_t all, old;
	pthread_t t;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	if (pthread_create(&t, 0, idle, 0) == 0)
		pthread_detach(t);
	pthread_sigmask(SIG_SETMASK, &old, 0);
}

__attribute__((constructor)) static void init(void)
{
	start_idle();
	pthread_atfork(0, 0, start_idle);
}
