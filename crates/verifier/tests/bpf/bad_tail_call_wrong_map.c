#include "common.h"
NAKED(prog) { asm volatile("r2 = %[arr] ll; r3 = 0; call 12; r0 = 0; exit;" :: [arr]"i"(&arr) : "memory"); }
