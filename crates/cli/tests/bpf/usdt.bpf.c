// USDT probes of targets/usdt_target.c through libbpf's usdt.bpf.h: sums of every argument,
// so the test can check each value arrived exactly (register, memory, constant, 1-byte and
// semaphore-guarded arguments).
#include <stdbool.h>
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/usdt.bpf.h>

struct three {
	long hits, sum_i, sum_mem, sum_const, arg_cnt, bad;
};
struct two {
	long hits, sum_small, sum_reg, arg_cnt;
};
struct guarded {
	long hits, sum_n, last_const, cookie;
};

struct three three;
struct two two;
struct guarded guarded;

SEC("usdt/./usdt_target:app:three")
int BPF_USDT(on_three, int i, long mem, int c)
{
	long x;
	three.hits++;
	three.sum_i += i;
	three.sum_mem += mem;
	three.sum_const += c;
	three.arg_cnt = bpf_usdt_arg_cnt(ctx);
	if (bpf_usdt_arg(ctx, 3, &x) != -ENOENT)
		three.bad++;
	return 0;
}

SEC("usdt")
int BPF_USDT(on_two, unsigned char small, long reg)
{
	two.hits++;
	two.sum_small += small;
	two.sum_reg += reg;
	two.arg_cnt = bpf_usdt_arg_cnt(ctx);
	return 0;
}

SEC("usdt")
int BPF_USDT(on_guarded, long n, long c)
{
	guarded.hits++;
	guarded.sum_n += n;
	guarded.last_const = c;
	guarded.cookie = bpf_usdt_cookie(ctx);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
