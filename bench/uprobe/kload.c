// The uprobe benchmark's kernel side: loads a count-*.bpf.o into the kernel with libbpf,
// attaches each of its programs on FUNC in BINARY (any process) as a kernel uprobe (section
// "uprobe") or uretprobe (section "uretprobe"), runs CMD, then prints the hits the kernel
// counted (summed over the CPUs for a per-CPU array). The same objects run under `userbpf run`.
//
//   kload OBJ BINARY FUNC -- CMD ARGS...
//   -> CMD's output, then "kernel_hits entry=E return=R" on stderr
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>

static int print_libbpf(enum libbpf_print_level level, const char *fmt, va_list ap)
{
	if (level == LIBBPF_DEBUG)
		return 0;
	return vfprintf(stderr, fmt, ap);
}

int main(int argc, char **argv)
{
	if (argc < 6 || strcmp(argv[4], "--")) {
		fprintf(stderr, "usage: %s OBJ BINARY FUNC -- CMD ARGS...\n", argv[0]);
		return 2;
	}
	const char *binary = argv[2], *func = argv[3];
	libbpf_set_print(print_libbpf);
	struct bpf_object *obj = bpf_object__open_file(argv[1], NULL);
	if (!obj) {
		fprintf(stderr, "kload: opening %s: %s\n", argv[1], strerror(errno));
		return 1;
	}
	if (bpf_object__load(obj)) {
		fprintf(stderr, "kload: loading %s into the kernel failed: %s\n", argv[1], strerror(errno));
		return 1;
	}
	struct bpf_link *links[8];
	int nlinks = 0;
	struct bpf_program *prog;
	bpf_object__for_each_program(prog, obj) {
		int retprobe = !strcmp(bpf_program__section_name(prog), "uretprobe");
		LIBBPF_OPTS(bpf_uprobe_opts, opts, .retprobe = retprobe, .func_name = func);
		struct bpf_link *link = bpf_program__attach_uprobe_opts(prog, -1, binary, 0, &opts);
		if (!link) {
			fprintf(stderr, "kload: attaching %s to %s:%s failed: %s\n", bpf_program__name(prog), binary, func, strerror(errno));
			return 1;
		}
		if (nlinks < 8)
			links[nlinks++] = link;
	}

	fflush(NULL);
	pid_t pid = fork();
	if (pid < 0) {
		perror("kload: fork");
		return 1;
	}
	if (pid == 0) {
		execvp(argv[5], argv + 5);
		fprintf(stderr, "kload: starting %s: %s\n", argv[5], strerror(errno));
		_exit(127);
	}
	int status = 0;
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;

	// A per-CPU array (-DPERCPU objects) gives one value per possible CPU: summed.
	struct bpf_map *map = bpf_object__find_map_by_name(obj, "hits");
	int fd = bpf_map__fd(map);
	int percpu = bpf_map__type(map) == BPF_MAP_TYPE_PERCPU_ARRAY;
	int ncpus = percpu ? libbpf_num_possible_cpus() : 1;
	if (ncpus < 1 || ncpus > 4096) {
		fprintf(stderr, "kload: cannot count the possible CPUs\n");
		return 1;
	}
	unsigned long long v[2] = { 0, 0 }, *vals = calloc(ncpus, sizeof(*vals));
	for (unsigned k = 0; vals && k < 2; k++) {
		if (bpf_map_lookup_elem(fd, &k, vals) == 0)
			for (int c = 0; c < ncpus; c++)
				v[k] += vals[c];
	}
	free(vals);
	fprintf(stderr, "kernel_hits entry=%llu return=%llu\n", v[0], v[1]);
	for (int i = 0; i < nlinks; i++)
		bpf_link__destroy(links[i]);
	bpf_object__close(obj);
	if (WIFEXITED(status))
		return WEXITSTATUS(status);
	return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}
