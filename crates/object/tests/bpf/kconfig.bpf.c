// __kconfig externs (resolved into a read-only .kconfig map) and a weak __ksym.
#include <linux/types.h>
#include <stdbool.h>
#include <bpf/bpf_helpers.h>

extern int LINUX_KERNEL_VERSION __kconfig;
extern int CONFIG_HZ __kconfig __weak;
extern bool CONFIG_BPF_SYSCALL __kconfig __weak;
extern enum libbpf_tristate CONFIG_MODULES __kconfig __weak;
extern char CONFIG_DEFAULT_HOSTNAME[16] __kconfig __weak;
extern int CONFIG_NOT_SET __kconfig __weak;
extern const int bpf_prog_active __ksym __weak;
extern void bpf_rcu_read_lock(void) __ksym __weak;

__u64 seen[8];

SEC("uprobe")
int read_config(void *ctx)
{
	seen[0] = LINUX_KERNEL_VERSION;
	seen[1] = CONFIG_HZ;
	seen[2] = CONFIG_BPF_SYSCALL;
	seen[3] = CONFIG_MODULES;
	seen[4] = CONFIG_DEFAULT_HOSTNAME[0];
	seen[5] = CONFIG_NOT_SET;
	seen[6] = (__u64)&bpf_prog_active;
	bpf_rcu_read_lock();
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
