#include "common.h"
NAKED(prog) { ASM("r0 = r10; exit;"); }
