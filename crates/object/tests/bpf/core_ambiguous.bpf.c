// A target BTF with two incompatible flavors of `struct sample`: relocations against it are
// ambiguous and must be refused.
#include <linux/types.h>

struct sample___x {
	int a;
	long long b;
};

struct sample___y {
	long long b;
	int a;
};

struct sample___x gx;
struct sample___y gy;
