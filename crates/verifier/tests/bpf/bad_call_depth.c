#include "common.h"
static __attribute__((noinline)) int f0(int x) { return x + 1; }
static __attribute__((noinline)) int f1(int x) { return f0(x) + 1; }
static __attribute__((noinline)) int f2(int x) { return f1(x) + 2; }
static __attribute__((noinline)) int f3(int x) { return f2(x) + 3; }
static __attribute__((noinline)) int f4(int x) { return f3(x) + 4; }
static __attribute__((noinline)) int f5(int x) { return f4(x) + 5; }
static __attribute__((noinline)) int f6(int x) { return f5(x) + 6; }
static __attribute__((noinline)) int f7(int x) { return f6(x) + 7; }
static __attribute__((noinline)) int f8(int x) { return f7(x) + 8; }
SEC("uprobe") int prog(struct pt_regs *ctx) { return f8(PT_REGS_PARM1(ctx)); }
