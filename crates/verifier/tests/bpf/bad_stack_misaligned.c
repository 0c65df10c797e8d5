#include "common.h"
NAKED(prog) { ASM("r0 = 0; *(u64 *)(r10 - 12) = r0; exit;"); }
