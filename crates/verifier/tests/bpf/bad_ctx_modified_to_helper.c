#include "common.h"
NAKED(prog) { ASM("r1 += 8; call 174; exit;"); }
