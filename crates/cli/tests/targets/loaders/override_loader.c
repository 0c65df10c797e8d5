// A libbpf loader (crates/cli/tests/override.rs) of override_load.bpf.c through `userbpf load`:
// registers userbpf's SEC("uprobe.w") (include/userbpf/libbpf.h), opens and loads the object,
// auto-attaches every program, prints "attached", and on SIGINT prints the .bss counters.
//
//   override_loader OBJ
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <bpf/libbpf.h>
#include <userbpf/libbpf.h>

static volatile sig_atomic_t stop;

static void on_sigint(int sig)
{
	(void)sig;
	stop = 1;
}

int main(int argc, char **argv)
{
	struct bpf_object *obj;
	struct bpf_program *prog;
	struct bpf_map *map, *bss = NULL;
	unsigned long long v[2] = {0, 0};
	unsigned int zero = 0;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc != 2)
		return 2;
	if (userbpf_libbpf_register() < 0) {
		fprintf(stderr, "registering SEC(\"uprobe.w\") failed\n");
		return 1;
	}
	obj = bpf_object__open_file(argv[1], NULL);
	if (!obj || libbpf_get_error(obj)) {
		fprintf(stderr, "opening %s failed\n", argv[1]);
		return 1;
	}
	if (bpf_object__load(obj)) {
		fprintf(stderr, "loading %s failed\n", argv[1]);
		return 1;
	}
	bpf_object__for_each_program(prog, obj) {
		struct bpf_link *l = bpf_program__attach(prog);
		if (!l || libbpf_get_error(l)) {
			fprintf(stderr, "attaching %s failed\n", bpf_program__name(prog));
			return 1;
		}
	}
	signal(SIGINT, on_sigint);
	printf("attached\n");
	while (!stop)
		pause();
	bpf_object__for_each_map(map, obj) {
		const char *n = bpf_map__name(map);
		if (strlen(n) >= 4 && !strcmp(n + strlen(n) - 4, ".bss"))
			bss = map;
	}
	if (!bss || bpf_map__lookup_elem(bss, &zero, sizeof(zero), v, sizeof(v), 0)) {
		fprintf(stderr, "reading .bss failed\n");
		return 1;
	}
	printf("add_hits %llu six_hits %llu\n", v[0], v[1]);
	bpf_object__close(obj);
	return 0;
}
