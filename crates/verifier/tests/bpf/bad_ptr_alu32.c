#include "common.h"
NAKED(prog) { ASM("r1 = r10; w1 += 8; r0 = 0; exit;"); }
