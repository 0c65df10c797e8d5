#include "common.h"
NAKED(prog) { ASM("r0 = 0; 1: goto 1b;"); }
