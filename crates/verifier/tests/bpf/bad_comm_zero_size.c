#include "common.h"
NAKED(prog) { ASM("r1 = r10; r1 += -16; r2 = 0; call 16; r0 = 0; exit;"); }
