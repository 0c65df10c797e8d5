#include "common.h"
NAKED(prog) { ASM("r1 = *(u64 *)(r1 + 112); r2 = r1; if r1 > 7 goto 1f; r2 <<= 3; r3 = r10; r3 += -64; r3 += r2; r0 = 0; *(u64 *)(r3 + 0) = r0; 1: r0 = 0; exit;"); }
