// A shared library with a USDT probe (tests/usdt.rs loads it through usdt_lib_main.c).
#include <sys/sdt.h>

__attribute__((noinline)) long usdt_lib_fn(long x)
{
	STAP_PROBE1(lib, hit, x);
	return x * 2;
}
