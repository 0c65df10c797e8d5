// A map whose value type exercises the typed value printer.
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

enum color { RED = 0, GREEN = 1, BLUE = 7 };

struct inner {
	short s;
	unsigned char bytes[3];
};

struct record {
	int id;
	char name[8];
	enum color col;
	unsigned int flag : 1, level : 4, : 3;
	int neg : 5;
	enum color bfcol : 3;
	struct inner inners[2];
	int matrix[2][3];
	_Bool ok;
	void *ptr;
	double ratio;
	float f;
	union {
		int as_int;
		unsigned char raw4[4];
	} u;
	struct {
		int ax;
		int ay;
	};
	char notstr[4];
	long long big;
	unsigned long long ubig;
	char c;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16);
	__type(key, __u32);
	__type(value, struct record);
} records SEC(".maps");

struct record last_record;

SEC("uprobe")
int touch(void *ctx)
{
	__u32 k = 0;
	struct record *r = bpf_map_lookup_elem(&records, &k);
	if (r)
		last_record.id = r->id;
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
