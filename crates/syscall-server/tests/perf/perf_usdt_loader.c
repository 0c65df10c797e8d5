// A libbpf loader attaching a USDT program with bpf_program__attach_usdt to every process
// running the target binary (libbpf opens uprobe events with the semaphore's offset as
// ref_ctr_offset). Prints "ready", then, after a line on stdin, the counters; then detaches
// and prints "detached" (after which the semaphore must be back to 0).
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: %s OBJ TARGET\n", argv[0]);
		return 2;
	}
	struct bpf_object *obj = bpf_object__open_file(argv[1], NULL);
	if (!obj || bpf_object__load(obj)) {
		fprintf(stderr, "load: %s\n", strerror(errno));
		return 1;
	}
	struct bpf_link *l = bpf_program__attach_usdt(bpf_object__find_program_by_name(obj, "on_guarded"), -1, argv[2], "app", "guarded", NULL);
	if (!l) {
		fprintf(stderr, "attach_usdt: %s\n", strerror(errno));
		return 1;
	}
	printf("ready\n");
	fflush(stdout);
	char line[64];
	if (!fgets(line, sizeof line, stdin))
		return 1;
	int bss = bpf_map__fd(bpf_object__find_map_by_name(obj, ".bss"));
	unsigned long long v[2] = { 0, 0 };
	unsigned int zero = 0;
	if (bpf_map_lookup_elem(bss, &zero, v))
		return 1;
	printf("fired=%llu sum=%llu\n", v[0], v[1]);
	bpf_link__destroy(l);
	printf("detached\n");
	fflush(stdout);
	bpf_object__close(obj);
	return 0;
}
