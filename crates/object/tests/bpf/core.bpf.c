// CO-RE relocations: field offsets, sizes, existence, bitfields, types, enums, with a
// ___flavor variant of the same struct.
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

enum kind { KIND_A = 1, KIND_B = 5 };

struct sample {
	int a;
	char pad[3];
	unsigned int bf1 : 3, bf2 : 7;
	long long b;
	int arr[4];
	enum kind k;
} __attribute__((preserve_access_index));

/* Another view of `struct sample`, with a field that may not exist. */
struct sample___flavor {
	int a;
	long long b;
	int missing_field;
} __attribute__((preserve_access_index));

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 32);
	__type(key, __u32);
	__type(value, __u64);
} out SEC(".maps");

static __always_inline void put(__u32 k, __u64 v)
{
	bpf_map_update_elem(&out, &k, &v, 0);
}

SEC("uprobe")
int core_reads(struct sample *s)
{
	struct sample___flavor *f = (void *)s;

	put(0, BPF_CORE_READ(s, b));
	put(1, BPF_CORE_READ(f, b));
	put(2, bpf_core_field_exists(f->missing_field));
	put(3, BPF_CORE_READ_BITFIELD_PROBED(s, bf2));
	put(4, bpf_core_field_size(s->arr));
	put(5, bpf_core_type_exists(struct sample___flavor));
	put(6, bpf_core_type_size(struct sample));
	put(7, bpf_core_enum_value(enum kind, KIND_B));
	put(8, bpf_core_enum_value_exists(enum kind, KIND_B));
	put(9, bpf_core_type_id_local(struct sample));
	put(10, BPF_CORE_READ(s, arr[2]));
	if (bpf_core_field_exists(f->missing_field))
		put(11, BPF_CORE_READ(f, missing_field));
	put(12, __builtin_preserve_field_info(s->a, BPF_FIELD_SIGNED));
	put(13, s->a);
	put(14, bpf_core_field_offset(s->k));
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
