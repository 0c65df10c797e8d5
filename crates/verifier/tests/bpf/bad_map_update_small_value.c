#include "common.h"
NAKED(prog) { asm volatile("r1 = 0; *(u64 *)(r10 - 8) = r1; r2 = r10; r2 += -8; r3 = r10; r3 += -4; r1 = %[arr] ll; r4 = 0; call 2; r0 = 0; exit;" :: [arr]"i"(&arr) : "memory"); }
