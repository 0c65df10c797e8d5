// Calls work() (a probe's target) a few times on its main thread, then dies of a SIGSEGV in
// its own code: `userbpf run` must say which program last ran on that thread. With `drop`, it
// first drops root for nobody (after its agent joined the session: a process that can no
// longer create files in root's session when it faults).
#include <stdio.h>
#include <string.h>
#include <unistd.h>

__attribute__((noinline)) int work(int x)
{
	__asm__ volatile("" ::: "memory");
	return x * 3;
}

int main(int argc, char **argv)
{
	int sum = 0;
	if (argc > 1 && !strcmp(argv[1], "drop") && (setgid(65534) || setuid(65534))) {
		perror("crash_target: dropping root");
		return 1;
	}
	for (int i = 0; i < 5; i++)
		sum += work(i);
	printf("crash_target: sum %d\n", sum);
	fflush(stdout);
	*(volatile int *)(long)(sum - sum) = 1;
	return 0;
}
