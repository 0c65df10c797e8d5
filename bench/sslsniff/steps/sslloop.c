// The target of loop.sh: nginx's three SSL calls a request (SSL_read of a 100-byte request,
// SSL_read finding no data, SSL_write of a 612-byte response) on the stand-in libssl
// (fakessl.c), with other work between requests that evicts caches as nginx's own code and
// the kernel's do: it touches DLINES lines of a data buffer and runs IKB KiB of code (no-ops)
// between requests. With SSLLOOP_BRANCHES=1 in the environment that code is conditional
// branches instead, one a 16 bytes, each taken or not by a bit of a fixed number (predictable,
// as most of nginx's are): as nginx's own code does, it evicts the branch predictors' entries
// (taken branches' targets, outcome history) as well as the code lines. Rounds alternate between the probed functions and unprobed copies of
// them (plain_read, plain_write), so that the machine's drift moves both alike. Prints the
// medians of a request's time, probed and unprobed, and the median of the differences of
// consecutive rounds (ROUNDS of each).
//
//   sslloop REQUESTS ROUNDS DLINES IKB [WAIT [STRIDE]]
//
// STRIDE (64): bytes between the data lines touched; 4160 puts each on a page of its own
// (the TLB's entries evicted too).
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

int SSL_read(void *ssl, void *buf, int num);
int SSL_write(void *ssl, const void *buf, int num);
int plain_read(void *ssl, void *buf, int num);
int plain_write(void *ssl, const void *buf, int num);

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	static char req[100], resp[612];
	if (argc < 5) {
		fprintf(stderr, "usage: sslloop REQUESTS ROUNDS DLINES IKB [WAIT [STRIDE]]\n");
		return 2;
	}
	long n = atol(argv[1]), rounds = atol(argv[2]), dlines = atol(argv[3]), ikb = atol(argv[4]);
	int wait = argc > 5 && atoi(argv[5]);
	long stride = argc > 6 ? atol(argv[6]) : 64;
	volatile unsigned char *r = (volatile unsigned char *)(void *)SSL_read;
	volatile unsigned char *w = (volatile unsigned char *)(void *)SSL_write;
	while (wait && (r[0] != 0xe9 || w[0] != 0xe9))
		usleep(1000);
	unsigned char *data = calloc(dlines + 1, stride);
	size_t clen = ikb * 1024 + 1;
	unsigned char *code = mmap(NULL, clen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (!data || code == MAP_FAILED)
		return 1;
	memset(code, 0x90, clen - 1);
	code[clen - 1] = 0xc3;
	const char *br = getenv("SSLLOOP_BRANCHES");
	if (br && *br && strcmp(br, "0") != 0 && clen > 32) {
		// mov eax, edi; then slots of 16 bytes: bt eax, k; jc to the next slot; no-ops.
		code[0] = 0x89;
		code[1] = 0xf8;
		for (size_t at = 2, k = 0; at + 16 < clen; at += 16, k++) {
			unsigned char slot[6] = {0x0f, 0xba, 0xe0, (unsigned char)(k * 7 % 32), 0x72, 10};
			memcpy(code + at, slot, sizeof slot);
		}
	}
	mprotect(code, clen, PROT_READ | PROT_EXEC);
	void (*work)(unsigned) = (void (*)(unsigned))code;
	memset(req, 'r', sizeof req);
	memset(resp, 'x', sizeof resp);
	double *t[3];
	for (int m = 0; m < 3; m++)
		t[m] = calloc(rounds, sizeof(double));
	for (long k = 0; k < rounds; k++) {
		for (int probed = 1; probed >= 0; probed--) {
			int (*rd)(void *, void *, int) = probed ? SSL_read : plain_read;
			int (*wr)(void *, const void *, int) = probed ? SSL_write : plain_write;
			double t0 = now();
			for (long i = 0; i < n; i++) {
				for (long j = 0; j < dlines; j++)
					data[j * stride]++;
				work(0x9e3779b9);
				rd(NULL, req, sizeof req);
				rd(NULL, req, 0);
				wr(NULL, resp, sizeof resp);
			}
			t[!probed][k] = (now() - t0) / n;
		}
		t[2][k] = t[0][k] - t[1][k];
	}
	for (int m = 0; m < 3; m++)
		qsort(t[m], rounds, sizeof(double), cmp);
	printf("%.1f %.1f %.1f\n", t[0][rounds / 2], t[1][rounds / 2], t[2][rounds / 2]);
	return 0;
}
