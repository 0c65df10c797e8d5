#include "common.h"
/* The caller returns the r0 of a function that never set it. */
static __attribute__((naked, noinline, used)) int sub(void)
{
	asm volatile("exit;" ::: "memory");
}
NAKED(prog) { asm volatile("call sub; exit;" ::: "memory"); }
