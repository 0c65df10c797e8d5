// The library injected by the tests: its constructor counts, `inject_init` keeps its argument.
#include <string.h>

static char arg_copy[256];
static int constructed;

__attribute__((constructor)) static void on_load(void) { constructed++; }

int inject_init(const char *arg)
{
	strncpy(arg_copy, arg, sizeof(arg_copy) - 1);
	return 42 + constructed;
}

const char *injected_arg(void) { return arg_copy; }
