// The target of the BCC tool tests (tests/bcc.rs): known calls, arguments, strings, return
// values and USDT probes on known call paths, the same in every run.
//
// Protocol (bt_target.c's): prints "ready PID" and one "fn NAME 0xADDR" line per probed
// function, then "end", and waits for a line on stdin; runs the workload, prints "done", and
// waits for stdin to close before exiting (so a tracer can still read /proc/PID/maps to
// symbolise stacks). Built without PIE, so the USDT notes' addresses are the run-time ones.
#include <dlfcn.h>
#include <netdb.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <sys/sdt.h>

#define PROBE __attribute__((noipa, used))

// Every probed function first counts its call (so none is just a few bytes long: userbpf's
// inline hooks need the function's first 5 bytes to be straight-line code).
static volatile unsigned long called[8];
#define COUNT(i) (called[i]++)

// funclatency, trace, argdist: WORK_CALLS calls, n = 0, 100, ..., returning n * 3 + 1.
PROBE long work(long n)
{
	COUNT(0);
	return n * 3 + 1;
}

// trace's strings: greet("alpha", 1) .. greet("delta", 4), returning strlen(name) + n.
PROBE int greet(const char *name, int n)
{
	COUNT(1);
	return (int)strlen(name) + n;
}

// stackcount on a `u:` spec: the USDT probe bcc:tick fires in leaf(), reached by two paths.
PROBE int leaf(int path)
{
	COUNT(2);
	DTRACE_PROBE1(bcc, tick, path);
	return path * 2;
}
PROBE int middle(int path) { COUNT(3); return leaf(path) + 1; }
PROBE int via_a(void) { COUNT(4); return middle(1) + 1; }
PROBE int via_b(void) { COUNT(5); return leaf(2) + 1; }

#define WORK_CALLS 40
#define A_CALLS 30
#define B_CALLS 20

// Between calls, a pause: the BCC tools read their perf buffers in Python, far slower than
// the events come without one (the kernel's and userbpf's buffers alike drop what overflows).
static void pause_a_little(void)
{
	struct timespec ts = { 0, 200 * 1000 };
	nanosleep(&ts, NULL);
}

// gethostlatency: LOOKUPS calls each of libc's getaddrinfo, gethostbyname and gethostbyname2
// for "localhost" (answered from /etc/hosts; the tool times them whatever the answer).
#define LOOKUPS 3
static void lookups(void)
{
	for (int i = 0; i < LOOKUPS; i++) {
		struct addrinfo *res = NULL;
		if (getaddrinfo("localhost", NULL, NULL, &res) == 0)
			freeaddrinfo(res);
		pause_a_little();
		(void)gethostbyname("localhost");
		pause_a_little();
		(void)gethostbyname2("localhost", AF_INET);
		pause_a_little();
	}
}

// libc's own definition of `name` (not a PLT entry of this executable, which is built
// without PIE): where a uprobe on libc's function lands in this process.
static void *in_libc(const char *name)
{
	void *libc = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
	return libc ? dlsym(libc, name) : NULL;
}

static long workload(void)
{
	static const char *names[] = { "alpha", "beta", "gamma", "delta" };
	long sum = 0;
	for (long i = 0; i < WORK_CALLS; i++) {
		sum += work(i * 100);
		pause_a_little();
	}
	for (int i = 0; i < 4; i++) {
		sum += greet(names[i], i + 1);
		pause_a_little();
	}
	for (int i = 0; i < A_CALLS; i++)
		sum += via_a();
	for (int i = 0; i < B_CALLS; i++)
		sum += via_b();
	lookups();
	return sum;
}

int main(int argc, char **argv)
{
	char line[64];
	if (argc > 1 && strcmp(argv[1], "--now") == 0) {
		printf("done %ld\n", workload());
		return 0;
	}
	printf("ready %d\n", (int)getpid());
	printf("fn work %p\nfn greet %p\nfn leaf %p\nfn middle %p\nfn via_a %p\nfn via_b %p\n", (void *)work,
	       (void *)greet, (void *)leaf, (void *)middle, (void *)via_a, (void *)via_b);
	printf("fn getaddrinfo %p\nfn gethostbyname %p\nfn gethostbyname2 %p\nend\n", in_libc("getaddrinfo"),
	       in_libc("gethostbyname"), in_libc("gethostbyname2"));
	fflush(stdout);
	if (!fgets(line, sizeof line, stdin))
		return 1;
	printf("done %ld\n", workload());
	fflush(stdout);
	while (fgets(line, sizeof line, stdin))
		;
	return 0;
}
