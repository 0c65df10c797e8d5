#include "common.h"
NAKED(prog) { ASM("r0 = r5; exit;"); }
