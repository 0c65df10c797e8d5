#include "common.h"
/* A function may return without setting r0 when the caller does not use it. */
static __attribute__((naked, noinline, used)) int sub(void)
{
	asm volatile("exit;" ::: "memory");
}
NAKED(prog) { asm volatile("call sub; r0 = 0; exit;" ::: "memory"); }
