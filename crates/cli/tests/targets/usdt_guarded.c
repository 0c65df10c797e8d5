// The semaphore-guarded probe of usdt_target.c: app:guarded fires only while a tracer has
// raised app_guarded_semaphore.
#define _SDT_HAS_SEMAPHORES 1
#include <sys/sdt.h>

unsigned short app_guarded_semaphore __attribute__((section(".probes"))) = 0;

__attribute__((noinline)) long guarded(long n)
{
	if (__builtin_expect(app_guarded_semaphore, 0)) {
		STAP_PROBE2(app, guarded, n, 0x1234567890L);
		return 1;
	}
	return 0;
}
