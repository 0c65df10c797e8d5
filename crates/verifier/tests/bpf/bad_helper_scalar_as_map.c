#include "common.h"
NAKED(prog) { ASM("r1 = 0; *(u32 *)(r10 - 4) = r1; r2 = r10; r2 += -4; r1 = 42; call 1; r0 = 0; exit;"); }
