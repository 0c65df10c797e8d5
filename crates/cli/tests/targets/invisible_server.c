// Issue 18's matrix: a multi-threaded server. A listening TCP socket on loopback, a pool of
// worker threads taking connections (accept in each), client threads sending requests that
// the workers answer (each answer calls probed()); prints what was served.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define WORKERS 4
#define CLIENTS 4
#define REQUESTS 50

__attribute__((noinline)) int probed(int x)
{
	asm volatile("" : "+r"(x));
	return x + 1;
}

static int lfd;
static struct sockaddr_in addr;
static int served[WORKERS];

static void *worker(void *arg)
{
	int id = (int)(long)arg;
	for (;;) {
		int c = accept(lfd, NULL, NULL);
		if (c < 0)
			return NULL;
		int v;
		while (read(c, &v, sizeof v) == sizeof v) {
			v = probed(v);
			// Counted before the answer: the client (and then main) sees it counted.
			__atomic_add_fetch(&served[id], 1, __ATOMIC_SEQ_CST);
			write(c, &v, sizeof v);
		}
		close(c);
	}
}

static void *client(void *arg)
{
	long sum = 0;
	int s = socket(AF_INET, SOCK_STREAM, 0);
	if (connect(s, (struct sockaddr *)&addr, sizeof addr) != 0)
		return (void *)-1L;
	for (int i = 0; i < REQUESTS; i++) {
		int v = i + (int)(long)arg * 1000, r = 0;
		write(s, &v, sizeof v);
		if (read(s, &r, sizeof r) != sizeof r || r != v + 1)
			return (void *)-1L;
		sum += r;
	}
	close(s);
	return (void *)sum;
}

int main(void)
{
	lfd = socket(AF_INET, SOCK_STREAM, 0);
	addr.sin_family = AF_INET;
	addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	socklen_t len = sizeof addr;
	if (bind(lfd, (struct sockaddr *)&addr, sizeof addr) || listen(lfd, 16) || getsockname(lfd, (struct sockaddr *)&addr, &len))
		return perror("listen"), 1;
	pthread_t w[WORKERS], c[CLIENTS];
	for (long i = 0; i < WORKERS; i++)
		pthread_create(&w[i], NULL, worker, (void *)i);
	long total = 0;
	for (long i = 0; i < CLIENTS; i++)
		pthread_create(&c[i], NULL, client, (void *)i);
	for (int i = 0; i < CLIENTS; i++) {
		void *r;
		pthread_join(c[i], &r);
		total += (long)r;
	}
	int all = 0;
	for (int i = 0; i < WORKERS; i++)
		all += __atomic_load_n(&served[i], __ATOMIC_SEQ_CST);
	printf("served %d requests, answers sum %ld\n", all, total);
	return 0;
}
