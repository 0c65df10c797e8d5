#include "common.h"
NAKED(prog) { ASM("*(u64 *)(r10 - 8) = r1; r0 = *(u32 *)(r10 - 8); exit;"); }
