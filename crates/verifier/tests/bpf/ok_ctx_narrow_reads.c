#include "common.h"
NAKED(prog) { ASM("r0 = *(u32 *)(r1 + 164); r2 = *(u8 *)(r1 + 7); r0 += r2; r2 = *(u16 *)(r1 + 2); r0 += r2; exit;"); }
