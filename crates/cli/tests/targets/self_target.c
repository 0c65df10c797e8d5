// A target for "system call tracepoints see every call, and nothing of the agent's": follows
// bt_target.c's protocol (prints "ready PID", "fn malloc ADDR" and "end", waits for a line on
// stdin, runs the workload, prints "done N", waits for stdin to close). The workload sits
// between two getpgid() calls (the markers the scripts count from and to) and makes calls
// that glibc makes with inline `syscall` instructions (fopen's openat, opendir, the locale
// files' openat/close, __close_nocancel), plus a few mallocs of its own and a dlopen/dlclose
// of a library, and a thread (its calls from its first, glibc's in start_thread, and
// clone3's return in both): under userbpf the agent syncs its links on this thread then (its own
// opens and allocations, which no probe must see). The library is LIB, defined when compiling.
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <locale.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void *thread_main(void *arg)
{
	return (void *)(long)getppid();
}

static long workload(const char *lib)
{
	long n = 0;
	char line[256];
	getpgid(0);
	FILE *f = fopen("/etc/hostname", "r");
	if (f) {
		while (fgets(line, sizeof(line), f))
			n += strlen(line);
		fclose(f);
	}
	DIR *d = opendir("/");
	if (d) {
		while (readdir(d))
			n++;
		closedir(d);
	}
	if (setlocale(LC_ALL, "C.UTF-8"))
		n++;
	setlocale(LC_ALL, "C");
	for (int i = 1; i <= 7; i++) {
		char *volatile p = malloc(i * 8);
		n += p != NULL;
		free(p);
	}
	void *h = dlopen(lib, RTLD_NOW);
	if (h) {
		n++;
		dlclose(h);
	}
	pthread_t t;
	if (pthread_create(&t, NULL, thread_main, NULL) == 0 && pthread_join(t, NULL) == 0)
		n++;
	getpgid(0);
	return n;
}

int main(void)
{
	char line[64];
	setvbuf(stdout, NULL, _IOLBF, 0);
	// glibc's one-time set-up at the first pthread_create (its cancellation signal's handler
	// installed and unblocked) happens here, as under userbpf, where the agent's watcher
	// thread was the first: the workload's thread is the second in both.
	pthread_t t;
	if (pthread_create(&t, NULL, thread_main, NULL) || pthread_join(t, NULL))
		return 1;
	printf("ready %d\n", (int)getpid());
	printf("fn malloc %p\nend\n", (void *)malloc);
	if (!fgets(line, sizeof(line), stdin))
		return 1;
	printf("done %ld\n", workload(LIB));
	while (fgets(line, sizeof(line), stdin))
		;
	return 0;
}
