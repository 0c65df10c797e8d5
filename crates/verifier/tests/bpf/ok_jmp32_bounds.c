#include "common.h"
NAKED(prog) { ASM("r1 = *(u64 *)(r1 + 112); w1 &= 7; if w1 > 6 goto 1f; r1 <<= 3; r2 = r10; r2 += -64; r2 += r1; r0 = 1; *(u64 *)(r2 + 0) = r0; 1: r0 = 0; exit;"); }
