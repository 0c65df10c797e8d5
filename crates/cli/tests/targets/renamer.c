// Renames itself N times ("ubpfkI", prctl PR_SET_NAME: the task/task_rename tracepoint),
// calling observe(I) after each rename.
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>

__attribute__((noinline)) long observe(long i)
{
	__asm__ volatile("" : : "r"(i) : "memory");
	return i;
}

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 10, sum = 0;
	char name[16];

	for (long i = 1; i <= n; i++) {
		snprintf(name, sizeof(name), "ubpfk%ld", i);
		prctl(PR_SET_NAME, name, 0, 0, 0);
		sum += observe(i);
	}
	printf("renamer: %ld renames, sum %ld\n", n, sum);
	return 0;
}
