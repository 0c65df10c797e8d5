// Issue 18's matrix: a daemon. Double fork and setsid, then every descriptor is closed
// (`close_range`, or `loop`: close() of each up to the limit; `vfork`: the daemon vforks a
// child that execs this program again, which closes them with close_range), and the daemon
// calls probed() N times, opens OUT (its first descriptor) and writes there what it saw: its
// first descriptor, its open descriptors, whether it leads its session, and calls made. The
// parent exits once the first child did.
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

__attribute__((noinline)) int probed(int x)
{
	asm volatile("" : "+r"(x));
	return x + 1;
}

int main(int argc, char **argv)
{
	if (argc < 4)
		return fprintf(stderr, "usage: %s OUT N close_range|loop|vfork\n", argv[0]), 2;
	const char *out = argv[1];
	int n = atoi(argv[2]);
	if (!strcmp(argv[3], "exec"))
		goto work;
	pid_t p = fork();
	if (p < 0)
		return 1;
	if (p > 0) {
		int st;
		waitpid(p, &st, 0);
		return 0;
	}
	setsid();
	if (fork() != 0)
		_exit(0);
	if (!strcmp(argv[3], "vfork")) {
		if (vfork() == 0) {
			execl("/proc/self/exe", argv[0], argv[1], argv[2], "exec", (char *)NULL);
			_exit(127);
		}
		_exit(0);
	}
work:
	if (!strcmp(argv[3], "loop")) {
		struct rlimit r;
		getrlimit(RLIMIT_NOFILE, &r);
		for (int fd = 0; fd < (int)r.rlim_cur; fd++)
			close(fd);
	} else {
		syscall(SYS_close_range, 0, ~0U, 0);
	}
	int calls = 0;
	for (int i = 0; i < n; i++)
		calls += probed(i) == i + 1;
	char tmp[4096];
	snprintf(tmp, sizeof tmp, "%s.tmp", out);
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd < 0)
		return 1;
	int count = 0;
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	while (d && (e = readdir(d)))
		if (e->d_name[0] != '.' && atoi(e->d_name) != dirfd(d))
			count++;
	dprintf(fd, "first descriptor %d\nopen descriptors %d\nsession leader %s\ncalls %d\n", fd, count, getsid(0) == getpid() ? "yes" : "no", calls);
	close(fd);
	rename(tmp, out);
	return 0;
}
