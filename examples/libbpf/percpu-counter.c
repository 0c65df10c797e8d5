// User space of percpu-counter: loads the skeleton, attaches its uprobe to BINARY:FUNCTION in
// every process (or in process PID only), and at SIGINT/SIGTERM prints the calls counted, summed over the per-CPU
// slots (`count N`), then each CPU's slot (`cpu I N`).
//
//   percpu-counter BINARY FUNCTION [PID]
//
// Runs unmodified on the kernel or under `userbpf load` (targets under `userbpf start`); the
// loader benchmark (bench/loader/bench.py) counts fio's td_io_queue calls with it.
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <bpf/libbpf.h>
#include "percpu-counter.skel.h"

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
	(void)sig;
	stop = 1;
}

int main(int argc, char **argv)
{
	struct percpu_counter_bpf *skel;
	LIBBPF_OPTS(bpf_uprobe_opts, uo);
	unsigned long long *vals = NULL, sum = 0;
	unsigned int key = 0;
	int ncpus, err = 1, pid = -1;

	if (argc != 3 && argc != 4) {
		fprintf(stderr, "usage: %s BINARY FUNCTION [PID]\n", argv[0]);
		return 2;
	}
	if (argc == 4)
		pid = atoi(argv[3]);
	setvbuf(stdout, NULL, _IOLBF, 0);
	signal(SIGINT, on_signal);
	signal(SIGTERM, on_signal);

	ncpus = libbpf_num_possible_cpus();
	if (ncpus <= 0) {
		fprintf(stderr, "percpu-counter: possible CPUs: %s\n", strerror(-ncpus));
		return 1;
	}
	vals = calloc(ncpus, sizeof(*vals));
	skel = percpu_counter_bpf__open_and_load();
	if (!vals || !skel) {
		fprintf(stderr, "percpu-counter: opening and loading: %s\n", strerror(errno));
		goto out;
	}
	uo.func_name = argv[2];
	skel->links.count_call = bpf_program__attach_uprobe_opts(skel->progs.count_call, pid, argv[1], 0, &uo);
	if (!skel->links.count_call) {
		fprintf(stderr, "percpu-counter: attaching the uprobe to %s:%s: %s\n", argv[1], argv[2], strerror(errno));
		goto out;
	}
	printf("attached to %s:%s\n", argv[1], argv[2]);
	while (!stop)
		pause();
	if (bpf_map__lookup_elem(skel->maps.counts, &key, sizeof(key), vals, sizeof(*vals) * ncpus, 0)) {
		fprintf(stderr, "percpu-counter: reading the counts: %s\n", strerror(errno));
		goto out;
	}
	for (int i = 0; i < ncpus; i++)
		sum += vals[i];
	printf("count %llu\n", sum);
	for (int i = 0; i < ncpus; i++)
		printf("cpu %d %llu\n", i, vals[i]);
	err = 0;
out:
	percpu_counter_bpf__destroy(skel);
	free(vals);
	return err;
}
