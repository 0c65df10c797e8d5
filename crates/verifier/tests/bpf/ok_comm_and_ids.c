#include "common.h"
SEC("uprobe") int prog(struct pt_regs *ctx) {
	char comm[16];
	bpf_get_current_comm(comm, sizeof(comm));
	__u32 k = bpf_get_current_pid_tgid() >> 32;
	__u64 v = comm[0] + bpf_ktime_get_ns() + bpf_get_current_uid_gid();
	bpf_map_update_elem(&hmap, &k, &v, BPF_ANY);
	return 0;
}
