// A single function without SEC(): it lands in .text and is a program of unknown kind
// (libbpf's SEC("") behaviour).
int lonely(void *ctx)
{
	return 42;
}
