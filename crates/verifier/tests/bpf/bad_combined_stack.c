#include "common.h"
/* With a tail call the kernel gives no frame a private stack: three frames of 256, 192 and
 * 96 bytes exceed the 512 bytes they share. */
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} jt SEC(".maps");
static __attribute__((naked, noinline, used)) int leaf(void)
{
	asm volatile("r0 = 0; *(u64 *)(r10 - 96) = r0; exit;" ::: "memory");
}
static __attribute__((naked, noinline, used)) int mid(void)
{
	asm volatile("r0 = 0; *(u64 *)(r10 - 192) = r0; call leaf; exit;" ::: "memory");
}
NAKED(prog) { asm volatile("r6 = r1; r0 = 0; *(u64 *)(r10 - 256) = r0; call mid; r1 = r6; r2 = %[jt] ll; r3 = 0; call 12; r0 = 0; exit;" :: [jt]"i"(&jt) : "memory"); }
