// A target for user stack tests: probed functions whose first instruction is known (written
// in assembly), called through C functions built with frame pointers.
//   st_leaf   frameless, starts with `mov` (called by st_inner and st_ebr)
//   st_inner  starts with `push %rbp`
//   st_ebr    starts with `endbr64`, then `push %rbp`
// main -> outer_a -> middle -> st_inner -> st_leaf and main -> outer_b -> st_ebr -> st_leaf.
#include <stdio.h>
#include <stdlib.h>

long st_leaf(long x);
long st_inner(long x);
long st_ebr(long x);

__asm__(".text\n"
	".globl st_leaf\n"
	".type st_leaf, @function\n"
	"st_leaf:\n"
	"	mov %rdi, %rax\n"
	"	add $1, %rax\n"
	"	add %rax, %rax\n"
	"	ret\n"
	".size st_leaf, .-st_leaf\n"
	".globl st_inner\n"
	".type st_inner, @function\n"
	"st_inner:\n"
	"	push %rbp\n"
	"	mov %rsp, %rbp\n"
	"	mov %rdi, %rax\n"
	"	add $2, %rdi\n"
	"	call st_leaf\n"
	"	add $3, %rax\n"
	"	pop %rbp\n"
	"	ret\n"
	".size st_inner, .-st_inner\n"
	".globl st_ebr\n"
	".type st_ebr, @function\n"
	"st_ebr:\n"
	"	endbr64\n"
	"	push %rbp\n"
	"	mov %rsp, %rbp\n"
	"	add $4, %rdi\n"
	"	call st_leaf\n"
	"	add $5, %rax\n"
	"	pop %rbp\n"
	"	ret\n"
	".size st_ebr, .-st_ebr\n");

volatile long sink;

__attribute__((noinline)) long middle(long x)
{
	long r = st_inner(x);
	sink += r;
	return r;
}

__attribute__((noinline)) long outer_a(long x)
{
	long r = middle(x * 2);
	sink += r;
	return r;
}

__attribute__((noinline)) long outer_b(long x)
{
	long r = st_ebr(x * 3);
	sink += r;
	return r;
}

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 3;
	for (long i = 0; i < n; i++) {
		outer_a(i);
		outer_b(i);
	}
	printf("ustack_target: %ld rounds\n", n);
	return 0;
}
