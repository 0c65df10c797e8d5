// Calls work() (a probe's target) a few times on its main thread, then dies of a SIGSEGV in
// its own code: `userbpf run` must say which program last ran on that thread.
#include <stdio.h>

__attribute__((noinline)) int work(int x)
{
	__asm__ volatile("" ::: "memory");
	return x * 3;
}

int main(void)
{
	int sum = 0;
	for (int i = 0; i < 5; i++)
		sum += work(i);
	printf("crash_target: sum %d\n", sum);
	fflush(stdout);
	*(volatile int *)(long)(sum - sum) = 1;
	return 0;
}
