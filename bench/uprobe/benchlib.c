// The shared-library side of the uprobe benchmark: lib_fn, called through the PLT by target.c.
// Built with cc -shared -fPIC into libbenchlib.so beside the target.

__attribute__((noinline, visibility("default"))) long lib_fn(long x)
{
	// The empty asm keeps the body (and the call) from being folded away.
	__asm__ volatile("" : "+r"(x));
	return x * 3 + 1;
}
