// A target for "system call tracepoints see every call, and nothing of the agent's": follows
// bt_target.c's protocol (prints "ready PID", "fn malloc ADDR" and "end", waits for a line on
// stdin, runs the workload, prints "done N", waits for stdin to close). The workload sits
// between two getpgid() calls (the markers the scripts count from and to) and makes calls
// that glibc makes with inline `syscall` instructions (fopen's openat, opendir, the locale
// files' openat/close, __close_nocancel), plus a few mallocs of its own and a dlopen/dlclose
// of a library (argv[1]): under userbpf the agent syncs its links on this thread then (its own
// opens and allocations, which no probe must see). The library is LIB, defined when compiling.
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <locale.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
	getpgid(0);
	return n;
}

int main(void)
{
	char line[64];
	setvbuf(stdout, NULL, _IOLBF, 0);
	printf("ready %d\n", (int)getpid());
	printf("fn malloc %p\nend\n", (void *)malloc);
	if (!fgets(line, sizeof(line), stdin))
		return 1;
	printf("done %ld\n", workload(LIB));
	while (fgets(line, sizeof(line), stdin))
		;
	return 0;
}
