#include "common.h"
NAKED(prog) { ASM("r0 = 0; if r1 == 0 goto +1; r2 = 0x1122334455667788 ll; exit;"); }
