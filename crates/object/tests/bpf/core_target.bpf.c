// The "target" layout CO-RE relocations of core.bpf.c are resolved against in tests:
// fields moved and resized, one bitfield gone, `missing_field` absent, enum values changed.
#include <linux/types.h>

enum kind { KIND_B = 7, KIND_A = 1 };

struct sample {
	long long b;
	int a;
	unsigned int bf2 : 9;
	int arr[8];
	enum kind k;
};

struct sample g_sample;
