// A library that dlopen_target.c loads and unloads; its constructor calls lib_work once.
__attribute__((noinline)) long lib_work(long x)
{
	__asm__ volatile("" ::: "memory");
	return x * 3 + 1;
}

__attribute__((constructor)) static void init(void)
{
	lib_work(-1);
}
