// A loader that makes its bpf() call through libc's `syscall` looked up with dlsym, as some
// loaders do (a handle of libc.so.6, or RTLD_NEXT), then through an ordinary call. Prints
// what each descriptor is (/proc/self/fd: a session file under userbpf, the kernel's
// anon_inode otherwise), and a dlsym(RTLD_NEXT, ...) of another symbol.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <linux/bpf.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

typedef long (*syscall_fn)(long, ...);

static int create_map(syscall_fn sc)
{
	union bpf_attr a;
	memset(&a, 0, sizeof(a));
	a.map_type = BPF_MAP_TYPE_ARRAY;
	a.key_size = 4;
	a.value_size = 8;
	a.max_entries = 1;
	return (int)sc(__NR_bpf, BPF_MAP_CREATE, &a, sizeof(a));
}

static void describe(const char *how, int fd)
{
	char path[64], target[512];
	if (fd < 0) {
		printf("%s: failed\n", how);
		return;
	}
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	ssize_t n = readlink(path, target, sizeof(target) - 1);
	target[n > 0 ? n : 0] = 0;
	printf("%s: %s\n", how, strstr(target, "anon_inode:bpf-map") ? "kernel map" : strstr(target, "userbpf-") ? "session map" : target);
}

int main(void)
{
	void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
	describe("dlsym(libc)", create_map((syscall_fn)dlsym(libc, "syscall")));
	describe("dlsym(RTLD_NEXT)", create_map((syscall_fn)dlsym(RTLD_NEXT, "syscall")));
	describe("dlsym(RTLD_DEFAULT)", create_map((syscall_fn)dlsym(RTLD_DEFAULT, "syscall")));
	describe("call", create_map((syscall_fn)syscall));
	// Lookups of other symbols answer as libc's dlsym does, for the caller.
	printf("getpid found: %d\n", dlsym(RTLD_NEXT, "getpid") == dlsym(libc, "getpid"));
	printf("missing: %d\n", dlsym(libc, "no_such_symbol_here") == NULL);
	return 0;
}
