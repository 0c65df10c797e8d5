// A busy multi-threaded process to attach to and detach from, many times. Its main thread
// blocks in read() on stdin between commands (the thread an injection borrows) and a second
// thread blocks in read() on a pipe nobody writes to; both count EINTR. A spinning thread
// calls other() without end (a thread always running, never probed). Three workers wait for
// a command: "go N" has each call work() N times, then the main thread prints "done"; "wait"
// makes it print "done" only after the last "go" finished; "fork" forks a child that calls
// work() every 200 µs until killed and prints "child PID"; "quit" prints the calls and the
// EINTR counts and exits. Built with -DWITH_USDT, each call of work() by a worker is followed
// by a USDT probe (busy:tick, its argument the loop index).
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef WITH_USDT
#include <sys/sdt.h>
#else
#define DTRACE_PROBE1(p, n, a) ((void)(a))
#endif

#define WORKERS 3

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER, fin = PTHREAD_COND_INITIALIZER;
static long round_no, todo, finished, calls, sum;
static volatile int quit;
static int eintr_main, eintr_pipe;
static int pipefd[2];

__attribute__((noinline)) long work(long i)
{
	asm volatile("" ::: "memory");
	return i * 2 + 1;
}

__attribute__((noinline)) long other(long i)
{
	asm volatile("" ::: "memory");
	return i ^ 5;
}

static void *worker(void *arg)
{
	long seen = 0, local = 0;
	(void)arg;
	for (;;) {
		pthread_mutex_lock(&mu);
		while (round_no == seen && !quit)
			pthread_cond_wait(&cv, &mu);
		if (quit) {
			pthread_mutex_unlock(&mu);
			return NULL;
		}
		seen = round_no;
		long n = todo;
		pthread_mutex_unlock(&mu);
		for (long i = 0; i < n; i++) {
			local += work(i);
			DTRACE_PROBE1(busy, tick, i);
		}
		pthread_mutex_lock(&mu);
		calls += n;
		sum += local;
		finished++;
		pthread_cond_broadcast(&fin);
		pthread_mutex_unlock(&mu);
	}
}

static void *spinner(void *arg)
{
	long i = 0, s = 0;
	(void)arg;
	while (!quit)
		s += other(i++);
	return (void *)s;
}

static void *piper(void *arg)
{
	char c;
	(void)arg;
	while (read(pipefd[0], &c, 1) < 0)
		if (errno == EINTR)
			eintr_pipe++;
	return NULL;
}

static void wait_round(void)
{
	pthread_mutex_lock(&mu);
	while (finished < WORKERS * round_no)
		pthread_cond_wait(&fin, &mu);
	pthread_mutex_unlock(&mu);
}

int main(void)
{
	pthread_t t[WORKERS], s, p;
	char line[128];
	size_t have = 0;
	if (pipe(pipefd))
		return 1;
	for (int i = 0; i < WORKERS; i++)
		pthread_create(&t[i], NULL, worker, NULL);
	pthread_create(&s, NULL, spinner, NULL);
	pthread_create(&p, NULL, piper, NULL);
	printf("ready %d\n", getpid());
	fflush(stdout);
	for (;;) {
		ssize_t r = read(0, line + have, sizeof(line) - 1 - have);
		if (r < 0 && errno == EINTR) {
			eintr_main++;
			continue;
		}
		if (r <= 0)
			break;
		have += r;
		line[have] = 0;
		char *nl;
		while ((nl = strchr(line, '\n'))) {
			*nl = 0;
			if (!strncmp(line, "go ", 3)) {
				pthread_mutex_lock(&mu);
				todo = atol(line + 3);
				round_no++;
				pthread_cond_broadcast(&cv);
				pthread_mutex_unlock(&mu);
			} else if (!strcmp(line, "wait")) {
				wait_round();
				printf("done\n");
				fflush(stdout);
			} else if (!strcmp(line, "fork")) {
				/* A child that calls work() until it is killed. */
				pid_t c = fork();
				if (c == 0)
					for (long i = 0;; i++) {
						work(i);
						usleep(200);
					}
				printf("child %d\n", (int)c);
				fflush(stdout);
			} else if (!strcmp(line, "quit")) {
				wait_round();
				printf("calls %ld eintr %d %d\n", calls, eintr_main, eintr_pipe);
				fflush(stdout);
				return 0;
			}
			have -= nl + 1 - line;
			memmove(line, nl + 1, have + 1);
		}
	}
	return 0;
}
