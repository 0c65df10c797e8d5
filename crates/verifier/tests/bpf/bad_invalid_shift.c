#include "common.h"
NAKED(prog) { ASM("r0 = 1; r0 <<= 64; exit;"); }
