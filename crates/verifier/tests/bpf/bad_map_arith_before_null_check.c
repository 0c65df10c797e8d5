#include "common.h"
NAKED(prog) { asm volatile("r1 = 0; *(u32 *)(r10 - 4) = r1; r2 = r10; r2 += -4; r1 = %[hmap] ll; call 1; r0 += 8; if r0 == 0 goto 1f; r0 = *(u64 *)(r0 - 8); 1: r0 = 0; exit;" :: [hmap]"i"(&hmap) : "memory"); }
