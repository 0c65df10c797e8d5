// Issue 18's matrix: a daemon-style privilege drop with capabilities kept on its own thread
// (prctl(PR_SET_KEEPCAPS), setresuid, CAP_SETGID raised again with capset, setresgid,
// setgroups; with `plain`: setgroups, setgid and setuid, keeping nothing) while it has one
// thread (as glibc requires: its other threads would not keep their capabilities and the
// replay of setresgid would fail there), then a worker thread, then the checks a careful
// daemon makes: root cannot be regained, and no thread of the process still holds privileges
// (each thread's uids, gids, groups and capability sets, read from /proc/self/task/TID/status,
// equal the main thread's).
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <grp.h>
#include <linux/capability.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

__attribute__((noinline)) int probed(int x)
{
	asm volatile("" : "+r"(x));
	return x + 1;
}

static void *worker(void *arg)
{
	(void)arg;
	for (;;)
		pause();
	return NULL;
}

// The credential lines of /proc/self/task/TID/status, concatenated.
static void creds_of(const char *tid, char *out, size_t len)
{
	char path[64], line[256];
	snprintf(path, sizeof path, "/proc/self/task/%s/status", tid);
	out[0] = 0;
	FILE *f = fopen(path, "r");
	if (!f)
		return;
	while (fgets(line, sizeof line, f))
		if (!strncmp(line, "Uid:", 4) || !strncmp(line, "Gid:", 4) || !strncmp(line, "Groups:", 7) || !strncmp(line, "Cap", 3))
			strncat(out, line, len - strlen(out) - 1);
	fclose(f);
}

static int capset_eff(unsigned long long eff, unsigned long long prm)
{
	struct __user_cap_header_struct h = { _LINUX_CAPABILITY_VERSION_3, 0 };
	struct __user_cap_data_struct d[2] = { { (unsigned)eff, (unsigned)prm, 0 }, { (unsigned)(eff >> 32), (unsigned)(prm >> 32), 0 } };
	return syscall(SYS_capset, &h, d);
}

int main(int argc, char **argv)
{
	probed(1);
	if (argc > 1 && !strcmp(argv[1], "plain")) {
		// The classic order, no capability kept: groups, gid, then uid.
		if (setgroups(0, NULL) != 0 || setgid(65534) != 0 || setuid(65534) != 0)
			return perror("plain drop"), 1;
	} else {
		if (prctl(PR_SET_KEEPCAPS, 1) != 0)
			return perror("keepcaps"), 1;
		if (setresuid(65534, 65534, 65534) != 0)
			return perror("setresuid"), 1;
		unsigned long long setgid = 1ULL << CAP_SETGID;
		if (capset_eff(setgid, setgid) != 0)
			return perror("capset"), 1;
		if (setresgid(65534, 65534, 65534) != 0)
			return perror("setresgid"), 1;
		if (setgroups(0, NULL) != 0)
			return perror("setgroups"), 1;
		if (capset_eff(0, 0) != 0)
			return perror("capset drop"), 1;
	}
	pthread_t t;
	pthread_create(&t, NULL, worker, NULL);
	int regained = setuid(0) == 0;
	int err = errno;
	probed(2);
	printf("uid %d euid %d gid %d egid %d\n", getuid(), geteuid(), getgid(), getegid());
	printf("setuid(0): %s\n", regained ? "succeeded" : strerror(err));
	char main_creds[2048], creds[2048];
	char me[16];
	snprintf(me, sizeof me, "%d", getpid());
	creds_of(me, main_creds, sizeof main_creds);
	printf("%s", main_creds);
	int differ = 0;
	DIR *d = opendir("/proc/self/task");
	struct dirent *e;
	while (d && (e = readdir(d)))
		if (e->d_name[0] != '.') {
			creds_of(e->d_name, creds, sizeof creds);
			if (strcmp(creds, main_creds))
				differ++, fprintf(stderr, "thread %s:\n%s", e->d_name, creds);
		}
	printf("threads with other credentials: %d\n", differ);
	return 0;
}
