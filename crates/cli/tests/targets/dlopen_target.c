// Usage: dlopen_target LIB ROUNDS N [FUNC]: ROUNDS times, dlopen LIB (dl_lib.c's constructor
// calls lib_work once), call its FUNC (default lib_work) with 0..N-1, and dlclose it
// (unmapping it). Between rounds another mapping may take the library's old place.
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

int main(int argc, char **argv)
{
	if (argc < 4)
		return 2;
	int rounds = atoi(argv[2]), n = atoi(argv[3]);
	long s = 0;
	for (int r = 0; r < rounds; r++) {
		void *h = dlopen(argv[1], RTLD_NOW);
		if (!h) {
			fprintf(stderr, "dlopen: %s\n", dlerror());
			return 1;
		}
		long (*f)(long) = (long (*)(long))dlsym(h, argc > 4 ? argv[4] : "lib_work");
		if (!f)
			return 1;
		for (int i = 0; i < n; i++)
			s += f(i);
		if (dlclose(h) != 0)
			return 1;
		// Executable anonymous memory where the library was, most likely.
		void *p = mmap(NULL, 1 << 20, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (p != MAP_FAILED && r % 2 == 0)
			munmap(p, 1 << 20);
	}
	printf("dlopen_target: %d rounds of %d calls (%ld)\n", rounds, n, s);
	return 0;
}
