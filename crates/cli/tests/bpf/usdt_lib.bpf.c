// A USDT probe in a shared library, named by file name as libbpf allows.
#include <stdbool.h>
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/usdt.bpf.h>

long hits, sum;

SEC("usdt/libusdt_lib.so:lib:hit")
int BPF_USDT(on_lib_hit, long x)
{
	hits++;
	sum += x;
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
