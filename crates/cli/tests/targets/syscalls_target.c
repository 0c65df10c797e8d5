// A target for system call tracepoints: per iteration, open("/dev/null") + write 5 bytes +
// close, a failing openat, getppid() and syscall(SYS_getppid). Usage: syscalls_target N.
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 10;
	long failed = 0;
	for (int i = 0; i < n; i++) {
		int fd = open("/dev/null", O_WRONLY);
		if (write(fd, "hello", 5) != 5)
			return 1;
		close(fd);
		if (openat(AT_FDCWD, "/nonexistent/userbpf", O_RDONLY) < 0)
			failed++;
		getppid();
		syscall(SYS_getppid);
	}
	printf("syscalls_target: %d iterations, %ld failed opens\n", n, failed);
	return 0;
}
