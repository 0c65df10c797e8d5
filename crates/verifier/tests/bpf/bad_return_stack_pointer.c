#include "common.h"
static __attribute__((naked, noinline, used)) int sub(void)
{
	asm volatile("r0 = r10; r0 += -8; exit;" ::: "memory");
}
NAKED(prog) { asm volatile("call sub; r0 = 0; exit;" ::: "memory"); }
