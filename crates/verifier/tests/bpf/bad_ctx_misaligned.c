#include "common.h"
NAKED(prog) { ASM("r0 = *(u64 *)(r1 + 4); exit;"); }
