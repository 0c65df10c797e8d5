// Calls the USDT probe of libusdt_lib.so N times with 0..N-1.
#include <stdio.h>
#include <stdlib.h>

long usdt_lib_fn(long x);

int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 10;
	long s = 0;
	for (int i = 0; i < n; i++)
		s += usdt_lib_fn(i);
	printf("usdt_lib_main: %d calls (%ld)\n", n, s);
	return 0;
}
