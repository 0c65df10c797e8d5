// The reference of tests/kernel.rs: an object loaded by libbpf into the kernel with every
// program attached there (the uprobe named on the command line as a kernel uprobe on a
// private binary), a command run, then the maps with 4-byte keys and 8-byte values printed
// as "MAP KEY VALUE" lines (per-CPU maps: the sum over the CPUs).
//   kernel_ref OBJ UPROBE_PROG BINARY FUNC CMD ARGS...
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>

int main(int argc, char **argv)
{
	struct bpf_object *obj;
	struct bpf_program *prog;
	struct bpf_map *map;
	int status;
	pid_t pid;

	if (argc < 6) {
		fprintf(stderr, "usage: kernel_ref OBJ UPROBE_PROG BINARY FUNC CMD ARGS...\n");
		return 2;
	}
	obj = bpf_object__open_file(argv[1], NULL);
	if (!obj || bpf_object__load(obj)) {
		fprintf(stderr, "kernel_ref: loading %s failed: %s\n", argv[1], strerror(errno));
		return 1;
	}
	bpf_object__for_each_program(prog, obj) {
		struct bpf_link *link;
		if (!strcmp(bpf_program__name(prog), argv[2])) {
			LIBBPF_OPTS(bpf_uprobe_opts, o, .func_name = argv[4]);
			link = bpf_program__attach_uprobe_opts(prog, -1, argv[3], 0, &o);
		} else {
			link = bpf_program__attach(prog);
		}
		if (!link) {
			fprintf(stderr, "kernel_ref: attaching %s failed: %s\n", bpf_program__name(prog), strerror(errno));
			return 1;
		}
	}
	pid = fork();
	if (pid == 0) {
		execvp(argv[5], argv + 5);
		_exit(127);
	}
	waitpid(pid, &status, 0);
	fflush(stdout);
	bpf_object__for_each_map(map, obj) {
		__u32 key, next;
		__u64 values[1024];
		int fd = bpf_map__fd(map), first = 1, ncpu = 1;
		enum bpf_map_type t = bpf_map__type(map);
		if (bpf_map__key_size(map) != 4 || bpf_map__value_size(map) != 8)
			continue;
		if (t == BPF_MAP_TYPE_PERCPU_HASH || t == BPF_MAP_TYPE_PERCPU_ARRAY || t == BPF_MAP_TYPE_LRU_PERCPU_HASH)
			ncpu = libbpf_num_possible_cpus();
		if (ncpu < 1 || ncpu > 1024)
			return 1;
		while (bpf_map_get_next_key(fd, first ? NULL : &key, &next) == 0) {
			first = 0;
			if (bpf_map_lookup_elem(fd, &next, values) == 0) {
				unsigned long long sum = 0;
				for (int c = 0; c < ncpu; c++)
					sum += values[c];
				printf("%s %u %llu\n", bpf_map__name(map), next, sum);
			}
			key = next;
		}
	}
	return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
