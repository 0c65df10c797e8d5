// Makes each system call whose number is given on the command line once, with arguments that
// make it fail harmlessly (-1, then zeros), each in a child of its own (some, such as
// uretprobe outside a trampoline, kill the caller). Used to check system call numbers
// against the kernel's tracepoints (tests/syscall_names.rs).
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	char line[8];

	// Wait until the tracer is attached (a line on stdin).
	if (read(0, line, sizeof(line)) <= 0)
		return 1;
	for (int i = 1; i < argc; i++) {
		long nr = atol(argv[i]);
		pid_t p = fork();
		if (p == 0) {
			syscall(nr, -1L, 0L, 0L, 0L, 0L, 0L);
			_exit(0);
		}
		if (p < 0 || waitpid(p, NULL, 0) != p)
			return 1;
	}
	return 0;
}
