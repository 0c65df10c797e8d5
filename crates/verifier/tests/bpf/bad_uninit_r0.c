#include "common.h"
NAKED(prog) { ASM("exit;"); }
