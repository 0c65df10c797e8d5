// Linked with libdl_lib.so (a DT_NEEDED entry, not dlopen): the dynamic loader runs the
// library's constructor, which calls lib_work once, before main; main then calls it N times.
#include <stdio.h>
#include <stdlib.h>

long lib_work(long x);

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 10, sum = 0;
	for (long i = 0; i < n; i++)
		sum += lib_work(i);
	printf("linked_target: %ld calls (%ld)\n", n, sum);
	return 0;
}
