// The target of the tracepoint-argument tests (bpftrace's `args->` of system call
// tracepoints): makes system calls with known arguments and results, the same in every run.
//
// Protocol: as bt_target.c ("ready PID", "fn mark ADDR", "end"; a line on stdin starts the
// workload, "done" when it is over, exit when stdin closes). mark() is called before the
// workload, so a test can wait until a uprobe on it is attached (bpftrace attaches its probes in
// the script's order: a uprobe placed last is attached after the tracepoints).
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#define PROBE __attribute__((noipa, used))

static volatile unsigned long called;
PROBE void mark(int phase) { called++; __asm__ volatile("" ::"r"(phase)); }

// The descriptor every read of the workload is made on (so a script can pick them out).
#define FD 77

static long workload(void)
{
	char buf[128], path[64];
	long sum = 0;

	mark(1);
	// openat: paths that do not exist, with varied flags and modes.
	for (int i = 0; i < 5; i++) {
		snprintf(path, sizeof(path), "/nonexistent/userbpf-tp/file-%d", i);
		int fd = open(path, i % 2 ? O_RDONLY | O_CLOEXEC : O_WRONLY | O_CREAT, 0640 + i);
		sum += fd;
	}
	int fd = openat(AT_FDCWD, "/nonexistent/userbpf-tp/at", O_RDWR);
	sum += fd;
	// read: 3 reads of 100 bytes of /dev/zero, one of a closed descriptor (-EBADF), 37
	// bytes of a pipe, then its end (0).
	int z = open("/dev/zero", O_RDONLY);
	if (z < 0 || dup2(z, FD) != FD) {
		perror("/dev/zero");
		exit(1);
	}
	close(z);
	for (int i = 0; i < 3; i++)
		sum += read(FD, buf, 100);
	close(FD);
	sum += read(FD, buf, 100);
	int p[2];
	if (pipe(p) != 0 || dup2(p[0], FD) != FD) {
		perror("pipe");
		exit(1);
	}
	close(p[0]);
	memset(buf, 'x', 37);
	if (write(p[1], buf, 37) != 37)
		exit(1);
	sum += read(FD, buf, 100);
	close(p[1]);
	sum += read(FD, buf, 100);
	close(FD);
	// Calls that only this workload makes: getppid 7 times, umask 022 3 times, 077 twice.
	for (int i = 0; i < 7; i++)
		sum += getppid() > 0;
	for (int i = 0; i < 5; i++)
		sum += umask(i < 3 ? 022 : 077);
	// umount2 (whose tracepoints the kernel names sys_enter_umount/sys_exit_umount) 3 times,
	// and umount() (glibc's, which makes the same system call) twice, of a path that does not
	// exist (-ENOENT).
	for (int i = 0; i < 3; i++)
		sum += umount2("/nonexistent/userbpf-tp", 0);
	for (int i = 0; i < 2; i++)
		sum += umount("/nonexistent/userbpf-tp");
	mark(2);
	return sum;
}

int main(void)
{
	char line[64];

	setvbuf(stdout, NULL, _IOLBF, 0);
	printf("ready %d\n", (int)getpid());
	printf("fn mark %p\nend\n", (void *)mark);
	if (!fgets(line, sizeof(line), stdin))
		return 1;
	printf("done %ld\n", workload());
	while (fgets(line, sizeof(line), stdin))
		;
	return 0;
}
