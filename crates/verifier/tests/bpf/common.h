/* Shared by the oracle corpus: includes, a few maps, and a naked-function helper for the
 * programs written in assembly. Each program is one uprobe section; ok_* programs keep
 * every rule, bad_* programs break exactly one. */
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 4);
	__type(key, __u32);
	__type(value, __u64);
} arr SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, __u32);
	__type(value, __u64);
} hmap SEC(".maps");

struct big { __u64 v[8]; };

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct big);
} bigarr SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4096);
} rb SEC(".maps");

#define NAKED(name) SEC("uprobe") __attribute__((naked)) int name(void *ctx)
#define ASM(text) asm volatile(text ::: "memory")

char LICENSE[] SEC("license") = "GPL";
