// The agent-start benchmark's target: a program that does next to nothing, so that what the
// agent adds to a process's start (and an attach of its session's links) is what is measured.
__attribute__((noinline)) int bench_entry(int x)
{
	int s = 0;
	for (int i = 0; i < x; i++) {
		s += i * x;
		asm volatile("" : "+r"(s));
	}
	return s + 1;
}

int main(int argc, char **argv)
{
	(void)argv;
	return bench_entry(argc) == 0;
}
