// The uprobe benchmark's target: calls bench_fn (in this executable) or lib_fn (in
// libbenchlib.so) N times and prints the ns per call measured around the loop only, so
// process start-up, the agent's attach and the kernel's uprobe registration are excluded.
// Wall time and the thread's CPU time (user + system: a kernel uprobe's trap is charged to
// the thread) are both printed; the CPU time is what the bench uses, as it does not count
// time the thread spent waiting for a CPU on a busy machine.
//
//   target exe|lib|jmp|pad|bp|trap N    ->  "ns_per_call=%.3f cpu_ns_per_call=%.3f calls=%ld sum=%ld"
//
// jmp, pad and bp call short functions (3 * x) whose shape decides how userbpf probes them:
// sf_jmp (7 bytes) takes the inline jump, sf_pad (4 bytes, then alignment padding) the jump
// into the padding, sf_bp (4 bytes, the next function right after it) a breakpoint. trap
// calls sf_trap, an `int3` caught by an empty SIGTRAP handler, then sf_bp's body: the floor
// of the breakpoint method on this machine (the signal's delivery and return).
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

long lib_fn(long x);
int sf_jmp(int x), sf_pad(int x), sf_bp(int x), sf_trap(int x);

__asm__(".text\n"
	".p2align 4\n.globl sf_jmp\n.type sf_jmp,@function\nsf_jmp:\n"
	"  mov %edi, %eax\n  add %eax, %eax\n  add %edi, %eax\n  ret\n.size sf_jmp,.-sf_jmp\n"
	".p2align 4\n.globl sf_pad\n.type sf_pad,@function\nsf_pad:\n"
	"  lea (%rdi,%rdi,2), %eax\n  ret\n.size sf_pad,.-sf_pad\n"
	".p2align 4\n.globl sf_bp\n.type sf_bp,@function\nsf_bp:\n"
	"  lea (%rdi,%rdi,2), %eax\n  ret\n.size sf_bp,.-sf_bp\n"
	".globl sf_next\n.type sf_next,@function\nsf_next:\n  ret\n.size sf_next,.-sf_next\n"
	".p2align 4\n.globl sf_trap\n.type sf_trap,@function\nsf_trap:\n"
	"  int3\n  lea (%rdi,%rdi,2), %eax\n  ret\n.size sf_trap,.-sf_trap\n");

static void on_trap(int sig, siginfo_t *info, void *ctx)
{
	(void)sig, (void)info, (void)ctx;
}

__attribute__((noinline)) long bench_fn(long x)
{
	__asm__ volatile("" : "+r"(x));
	return x * 3 + 1;
}

static double now_ns(clockid_t clock)
{
	struct timespec ts;
	clock_gettime(clock, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char **argv)
{
	static const char *const names[] = {"exe", "lib", "jmp", "pad", "bp", "trap"};
	int which = -1;
	for (int k = 0; argc == 3 && k < 6; k++)
		if (!strcmp(argv[1], names[k]))
			which = k;
	if (which < 0) {
		fprintf(stderr, "usage: %s exe|lib|jmp|pad|bp|trap N\n", argv[0]);
		return 2;
	}
	long n = atol(argv[2]), sum = 0;
	int (*const sf[])(int) = {sf_jmp, sf_pad, sf_bp, sf_trap};
	if (which == 5) {
		struct sigaction sa = {0};
		sa.sa_sigaction = on_trap;
		sa.sa_flags = SA_SIGINFO | SA_NODEFER;
		sigaction(SIGTRAP, &sa, NULL);
	}
	double t0 = now_ns(CLOCK_MONOTONIC), c0 = now_ns(CLOCK_THREAD_CPUTIME_ID);
	if (which == 0)
		for (long i = 0; i < n; i++)
			sum += bench_fn(i);
	else if (which == 1)
		for (long i = 0; i < n; i++)
			sum += lib_fn(i);
	else {
		int (*volatile f)(int) = sf[which - 2];
		int (*g)(int) = f;
		for (long i = 0; i < n; i++)
			sum += g((int)i);
	}
	double c1 = now_ns(CLOCK_THREAD_CPUTIME_ID), t1 = now_ns(CLOCK_MONOTONIC);
	printf("ns_per_call=%.3f cpu_ns_per_call=%.3f calls=%ld sum=%ld\n", (t1 - t0) / n, (c1 - c0) / n, n, sum);
	return 0;
}
