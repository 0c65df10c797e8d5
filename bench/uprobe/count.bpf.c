// The uprobe benchmark's program: counts hits of a function, on entry and on return, in an
// array map read back by the loaders (userbpf run prints it at exit; kload reads it).
// Built three times: -DCOUNT_ENTRY, -DCOUNT_RETURN, both (`userbpf run` attaches every
// program of an object, so each probe mix is its own object); with -DNOOP too, the programs
// return at once, for the cost of the probe machinery alone. With -DPERCPU the counter is a
// per-CPU array incremented with a plain add (libbpf tools' usual counting pattern).
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

struct {
#ifdef PERCPU
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
#else
	__uint(type, BPF_MAP_TYPE_ARRAY);
#endif
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} hits SEC(".maps");

#ifdef COUNT_ENTRY
SEC("uprobe")
int count_entry(struct pt_regs *ctx)
{
#ifdef NOOP
	return 0;
#endif
	__u32 key = 0;
	__u64 *v = bpf_map_lookup_elem(&hits, &key);

#ifdef PERCPU
	if (v)
		*v += 1;
#else
	if (v)
		__sync_fetch_and_add(v, 1);
#endif
	return 0;
}
#endif

#ifdef COUNT_RETURN
SEC("uretprobe")
int count_return(struct pt_regs *ctx)
{
#ifdef NOOP
	return 0;
#endif
	__u32 key = 1;
	__u64 *v = bpf_map_lookup_elem(&hits, &key);

#ifdef PERCPU
	if (v)
		*v += 1;
#else
	if (v)
		__sync_fetch_and_add(v, 1);
#endif
	return 0;
}
#endif

char LICENSE[] SEC("license") = "GPL";
