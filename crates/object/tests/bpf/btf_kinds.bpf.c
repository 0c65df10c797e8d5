// Every BTF kind clang 14 emits, for comparing the BTF parser with `bpftool btf dump`.
#include <linux/types.h>
#include <bpf/bpf_helpers.h>

#define __tag(x) __attribute__((btf_decl_tag(x)))
#define __ttag(x) __attribute__((btf_type_tag(x)))

struct fwd_only;
union fwd_union;

enum signed_enum { NEG = -3, POS = 4 };

typedef unsigned long long u64_t;

struct tagged {
	int member __tag("member_tag");
	const volatile int cv;
	int *__ttag("user") uptr;
	struct fwd_only *fwd;
	union fwd_union *fwdu;
	float f;
	double d;
	long double ld;
	u64_t t;
	enum signed_enum se;
	_Bool b;
	char c;
	signed char sc;
	unsigned char uc;
	__int128 wide;
	int (*fnptr)(int, ...);
	char *restrict rp;
} __tag("struct_tag");

struct tagged g_tagged;

__noinline int tagged_fn(int x __tag("param_tag")) __tag("func_tag")
{
	return x + g_tagged.member;
}

SEC("uprobe")
int kinds(void *ctx)
{
	return tagged_fn(1);
}

char LICENSE[] SEC("license") = "GPL";
