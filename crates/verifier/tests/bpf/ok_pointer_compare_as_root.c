#include "common.h"
NAKED(prog) { ASM("r0 = 0; r2 = r10; if r2 > r1 goto +1; r0 = 1; exit;"); }
