// bpf_snprintf with a constant format the kernel's verifier refuses when loading (a
// precision, which bpf_snprintf does not take), and one with an argument too few.
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

static const char precision[] = "%.3d";
static const char too_few[] = "%d %d";

SEC("uprobe")
int with_precision(void *ctx)
{
	char out[16];
	__u64 args[1] = { 7 };
	return bpf_snprintf(out, sizeof(out), precision, args, sizeof(args));
}

SEC("uprobe")
int with_too_few(void *ctx)
{
	char out[16];
	__u64 args[1] = { 7 };
	return bpf_snprintf(out, sizeof(out), too_few, args, sizeof(args));
}

char LICENSE[] SEC("license") = "GPL";
