#include "common.h"
NAKED(prog) { ASM("r1 = r10; r1 &= -8; r0 = 0; exit;"); }
