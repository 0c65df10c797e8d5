#include "common.h"
NAKED(prog) { ASM("r0 = 0; exit; r0 = 1; exit;"); }
