// The target of the override tests (crates/cli/tests/override.rs): functions of every shape
// the hook probes differently, a recursive one, libc's fdatasync, threads, and a function a
// thread is inside of while the probe is attached.
//
//   override_target sizes N     ov_jmp, ov_pad, ov_bp, ov_endbr, ov_c on 0..N-1: "NAME sum S"
//   override_target rec N       "rec R" = ov_rec(N) (ov_rec(n) = n ? 1 + ov_rec(n - 1) : 0)
//   override_target lib         fdatasync of a bad descriptor (999) and of a file: "fdatasync
//                               bad R errno E", "fdatasync file R"
//   override_target threads T N T threads each summing ov_c(0..N-1): "thread K sum S"
//   override_target usdt N      the USDT probe ov:here N times: "usdt N"
//   override_target args N      "args sum S" = sum of ov_args(i, 2 * i) for i in 0..N-1
//   override_target check N     "check ok C bad B": ov_check(i) (returns i * 3) checks the
//                               registers the caller keeps across the call and the stack
//   override_target wait        a thread enters ov_slow (which waits for "go" on stdin) and
//                               prints "inside"; main then calls ov_c(1) once per line read
//                               ("c R") until "go", after which ov_slow returns: "slow R";
//                               meanwhile a third thread calls ov_c(3) in a tight loop:
//                               "spin bad B overridden some|none"
//
// ov_jmp (7 bytes) takes the inline jump, ov_pad (4 bytes, then alignment padding) the jump
// into the padding, ov_bp (4 bytes, the next function right after it) a breakpoint; ov_endbr
// starts with endbr64 (kept in place: the jump goes after it).
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/sdt.h>

long ov_jmp(long x), ov_pad(long x), ov_bp(long x), ov_endbr(long x);

__asm__(".text\n"
	".p2align 4\n.globl ov_jmp\n.type ov_jmp,@function\nov_jmp:\n"
	"  mov %rdi, %rax\n  add %rax, %rax\n  add %rdi, %rax\n  ret\n.size ov_jmp,.-ov_jmp\n"
	".p2align 4\n.globl ov_pad\n.type ov_pad,@function\nov_pad:\n"
	"  lea (%rdi,%rdi,2), %rax\n  ret\n.size ov_pad,.-ov_pad\n"
	".p2align 4\n.globl ov_bp\n.type ov_bp,@function\nov_bp:\n"
	"  lea (%rdi,%rdi,2), %rax\n  ret\n.size ov_bp,.-ov_bp\n"
	".globl ov_next\n.type ov_next,@function\nov_next:\n  ret\n.size ov_next,.-ov_next\n"
	".p2align 4\n.globl ov_endbr\n.type ov_endbr,@function\nov_endbr:\n"
	"  endbr64\n  lea (%rdi,%rdi,2), %rax\n  nop\n  ret\n.size ov_endbr,.-ov_endbr\n");

__attribute__((noinline)) long ov_c(long x)
{
	__asm__ volatile("" : "+r"(x));
	return x * 3;
}

long ov_rec(long n);
// Through a pointer the compiler cannot see through: a real call per level, no loop.
static long (*volatile rec_ptr)(long) = ov_rec;

__attribute__((noinline)) long ov_rec(long n)
{
	return n ? 1 + rec_ptr(n - 1) : 0;
}

__attribute__((noinline)) long ov_args(long a, long b)
{
	__asm__ volatile("" : "+r"(a), "+r"(b));
	return a * 1000 + b;
}

// Returns x * 3; the caller (check_call) verifies that the callee-saved registers, the stack
// pointer and the direction flag are what the ABI says after the call.
__attribute__((noinline)) long ov_check(long x)
{
	__asm__ volatile("" : "+r"(x));
	return x * 3;
}

// check_call(x, &out): calls ov_check(x) with known values in rbx, rbp, r12-r15, then checks
// them, rsp and the direction flag after the call. Returns 1 when everything held (the
// result in *out).
int check_call(long x, long *out);
long check_sp;
__asm__(".text\n.globl check_call\n.type check_call,@function\ncheck_call:\n"
	"  push %rbx\n  push %rbp\n  push %r12\n  push %r13\n  push %r14\n  push %r15\n"
	"  sub $8, %rsp\n  mov %rsi, (%rsp)\n"
	"  mov $0x1111, %rbx\n  mov $0x2222, %rbp\n  mov $0x3333, %r12\n"
	"  mov $0x4444, %r13\n  mov $0x5555, %r14\n  mov $0x6666, %r15\n"
	"  mov %rsp, check_sp(%rip)\n"
	"  call ov_check\n"
	"  mov (%rsp), %rsi\n  mov %rax, (%rsi)\n  xor %eax, %eax\n"
	"  cmp %rsp, check_sp(%rip)\n  jne 1f\n"
	"  pushfq\n  pop %rcx\n  test $0x400, %rcx\n  jnz 1f\n"
	"  cmp $0x1111, %rbx\n  jne 1f\n  cmp $0x2222, %rbp\n  jne 1f\n  cmp $0x3333, %r12\n  jne 1f\n"
	"  cmp $0x4444, %r13\n  jne 1f\n  cmp $0x5555, %r14\n  jne 1f\n  cmp $0x6666, %r15\n  jne 1f\n"
	"  mov $1, %eax\n"
	"1:\n  add $8, %rsp\n"
	"  pop %r15\n  pop %r14\n  pop %r13\n  pop %r12\n  pop %rbp\n  pop %rbx\n  ret\n"
	".size check_call,.-check_call\n");

static volatile int slow_release;

__attribute__((noinline)) long ov_slow(long x)
{
	puts("inside");
	fflush(stdout);
	while (!slow_release)
		usleep(1000);
	return x * 3;
}

static long nthread;

static void *worker(void *arg)
{
	long sum = 0;
	for (long i = 0; i < nthread; i++)
		sum += ov_c(i);
	return (void *)sum;
}

static void *slow_thread(void *arg)
{
	return (void *)ov_slow(7);
}

// Calls ov_c(3) in a tight loop until released: a thread in the middle of the function's first
// bytes while they are patched. Counts results that are neither 9 (the function ran) nor 1003
// (overridden by the tests' `odd`).
static volatile int spin_stop;
static long spin_calls, spin_bad, spin_overridden;

static void *spin_thread(void *arg)
{
	long (*volatile f)(long) = ov_c;
	while (!spin_stop) {
		long r = f(3);
		spin_calls++;
		if (r == 1003)
			spin_overridden++;
		else if (r != 9)
			spin_bad++;
	}
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc < 2)
		return 2;
	const char *m = argv[1];
	long n = argc > 2 ? atol(argv[2]) : 0;
	if (!strcmp(m, "sizes")) {
		long (*volatile f[])(long) = {ov_jmp, ov_pad, ov_bp, ov_endbr, ov_c};
		const char *names[] = {"ov_jmp", "ov_pad", "ov_bp", "ov_endbr", "ov_c"};
		for (int k = 0; k < 5; k++) {
			long s = 0;
			for (long i = 0; i < n; i++)
				s += f[k](i);
			printf("%s sum %ld\n", names[k], s);
		}
	} else if (!strcmp(m, "rec")) {
		printf("rec %ld\n", ov_rec(n));
	} else if (!strcmp(m, "lib")) {
		errno = 0;
		int r = fdatasync(999);
		printf("fdatasync bad %d errno %d\n", r, r ? errno : 0);
		char path[] = "/tmp/userbpf-override-XXXXXX";
		int fd = mkstemp(path);
		if (fd < 0 || write(fd, "x", 1) != 1)
			return 1;
		printf("fdatasync file %d\n", fdatasync(fd));
		close(fd);
		unlink(path);
	} else if (!strcmp(m, "threads")) {
		long t = n;
		nthread = argc > 3 ? atol(argv[3]) : 0;
		pthread_t th[64];
		if (t > 64)
			return 2;
		for (long k = 0; k < t; k++)
			pthread_create(&th[k], NULL, worker, NULL);
		for (long k = 0; k < t; k++) {
			void *s;
			pthread_join(th[k], &s);
			printf("thread %ld sum %ld\n", k, (long)s);
		}
	} else if (!strcmp(m, "usdt")) {
		for (long i = 0; i < n; i++)
			DTRACE_PROBE1(ov, here, i);
		printf("usdt %ld\n", n);
	} else if (!strcmp(m, "args")) {
		long s = 0;
		for (long i = 0; i < n; i++)
			s += ov_args(i, 2 * i);
		printf("args sum %ld\n", s);
	} else if (!strcmp(m, "check")) {
		long ok = 0, bad = 0, sum = 0;
		for (long i = 0; i < n; i++) {
			long r;
			if (check_call(i, &r))
				ok++;
			else
				bad++;
			sum += r;
		}
		printf("check ok %ld bad %ld sum %ld\n", ok, bad, sum);
	} else if (!strcmp(m, "wait")) {
		pthread_t th, spin;
		pthread_create(&th, NULL, slow_thread, NULL);
		pthread_create(&spin, NULL, spin_thread, NULL);
		char line[64];
		while (fgets(line, sizeof line, stdin)) {
			if (!strncmp(line, "go", 2))
				break;
			printf("c %ld\n", ov_c(1));
			fflush(stdout);
		}
		slow_release = 1;
		spin_stop = 1;
		void *r;
		pthread_join(th, &r);
		pthread_join(spin, NULL);
		printf("slow %ld\n", (long)r);
		printf("spin bad %ld overridden %s\n", spin_bad, spin_overridden > 0 && spin_calls > spin_overridden ? "some" : "none");
	} else {
		return 2;
	}
	return 0;
}
