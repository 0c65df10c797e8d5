// A running process to inject into: the main thread blocks in read() on stdin, a second
// thread sleeps in a loop with nanosleep; both report an interrupted call (EINTR) if they
// ever see one. On a line from stdin it prints what it read and whether the injected
// library's function ran (argv[1]: the library, found if loaded with RTLD_NOLOAD).
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static volatile int eintr;

static void *sleeper(void *arg)
{
	(void)arg;
	for (;;) {
		struct timespec ts = { 0, 2 * 1000 * 1000 };
		while (nanosleep(&ts, &ts) != 0)
			if (errno == EINTR)
				eintr++;
	}
	return NULL;
}

int main(int argc, char **argv)
{
	pthread_t t;
	pthread_create(&t, NULL, sleeper, NULL);
	printf("ready %d\n", getpid());
	fflush(stdout);
	char buf[64];
	ssize_t n;
	while ((n = read(0, buf, sizeof(buf) - 1)) < 0)
		if (errno == EINTR)
			eintr++;
	buf[n > 0 ? n : 0] = 0;
	void *lib = argc > 1 ? dlopen(argv[1], RTLD_NOW | RTLD_NOLOAD) : NULL;
	const char *(*got)(void) = lib ? (const char *(*)(void))dlsym(lib, "injected_arg") : NULL;
	printf("read %s", buf);
	printf("injected %s\n", got ? got() : "(not loaded)");
	printf("eintr %d\n", eintr);
	return 0;
}
