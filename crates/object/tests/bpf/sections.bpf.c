// One program per section kind the loader recognises.
#include <linux/types.h>
#include <bpf/bpf_helpers.h>

#define PROG(sec, name) SEC(sec) int name(void *ctx) { return __LINE__; }

PROG("uprobe", up_plain)
PROG("uretprobe", uret_plain)
PROG("uprobe//usr/lib/libc.so.6:malloc+0x10", up_target)
PROG("uretprobe/./myapp:handle_request", uret_target)
PROG("uprobe.s/./myapp:sleepy", up_sleepable)
PROG("uretprobe.s", uret_sleepable)
PROG("usdt", usdt_plain)
PROG("usdt/./myapp:myprov:myprobe", usdt_target)
PROG("tracepoint/syscalls/sys_enter_openat", tp_long)
PROG("tp/sched/sched_switch", tp_short)
PROG("raw_tracepoint/sys_enter", raw_long)
PROG("raw_tp/sys_exit", raw_short)
PROG("kprobe/do_sys_openat2", kp)
PROG("kretprobe/do_sys_openat2", krp)
PROG("fentry/do_unlinkat", fen)
PROG("fexit/do_unlinkat", fex)
PROG("fmod_ret/do_unlinkat", fmr)
PROG("lsm/file_open", lsm_prog)
PROG("iter/task", it)
PROG("xdp", xdp_prog)
PROG("tc", tc_prog)
PROG("socket", sock)
PROG("cgroup/connect4", cg)
PROG("perf_event", pe)
PROG("struct_ops/dummy", so)
PROG("?uprobe", up_noautoload)
PROG("my_custom_section", custom)

char LICENSE[] SEC("license") = "GPL";
__u32 _version SEC("version") = 0x050a00;
