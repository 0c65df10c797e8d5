#include "common.h"
NAKED(prog) { ASM("*(u64 *)(r10 - 8) = r1; r1 = 0; r1 = *(u64 *)(r10 - 8); r0 = *(u64 *)(r1 + 0); exit;"); }
