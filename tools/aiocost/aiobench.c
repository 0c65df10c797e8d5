// The benchmark of `userbpf tool aiocost`: the same batched random 4 KiB reads of a file
// opened with O_DIRECT through io_uring (liburing), Linux native AIO (libaio) and POSIX AIO
// (glibc), with USDT probes (provider `aiocost`) at the boundaries of each iteration's phases:
//   phase(iface, phase)  a phase starts (and the one before it in the iteration ends)
//   done(iface)          the iteration's last phase ends
// iface: 0 io_uring, 1 native aio, 2 posix aio; phase: 0 submit (starts the iteration),
// 1 poll (wait for the batch), 2 clear (io_uring's completion-queue advance). One probe per
// boundary, never two probes side by side. It prints its own time per iteration for each
// interface, so that what a tracer adds shows.
//
//   aiobench [-n ITERATIONS] [-b BATCH] [-s FILE_MB] [-i io_uring,libaio,posix] FILE
#define _GNU_SOURCE
#include <aio.h>
#include <errno.h>
#include <fcntl.h>
#include <libaio.h>
#include <liburing.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sdt.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define BLOCK 4096

enum { IO_URING, NATIVE_AIO, POSIX_AIO, NIFACES };
enum { SUBMIT, POLL, CLEAR };
static const char *names[NIFACES] = { "io_uring", "native aio", "posix aio" };

static int fd, batch = 32;
static long iterations = 200, blocks;
static void **bufs;
static uint64_t rng = 0x9e3779b97f4a7c15ull;

static off_t next_offset(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (off_t)(rng % blocks) * BLOCK;
}

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static void die(const char *what, int err)
{
	fprintf(stderr, "aiobench: %s: %s\n", what, strerror(err));
	exit(1);
}

static void check_read(long res)
{
	if (res != BLOCK) {
		fprintf(stderr, "aiobench: a read returned %ld (%s), not %d\n", res, res < 0 ? strerror(-res) : "short", BLOCK);
		exit(1);
	}
}

static void run_io_uring(void)
{
	struct io_uring ring;
	struct io_uring_cqe *cqe;
	int r = io_uring_queue_init(batch * 2, &ring, 0);

	if (r < 0)
		die("io_uring_queue_init", -r);
	for (long it = 0; it < iterations; it++) {
		DTRACE_PROBE2(aiocost, phase, IO_URING, SUBMIT);
		for (int i = 0; i < batch; i++)
			io_uring_prep_read(io_uring_get_sqe(&ring), fd, bufs[i], BLOCK, next_offset());
		r = io_uring_submit(&ring);
		if (r != batch)
			die("io_uring_submit", r < 0 ? -r : EAGAIN);
		DTRACE_PROBE2(aiocost, phase, IO_URING, POLL);
		r = io_uring_wait_cqe_nr(&ring, &cqe, batch);
		if (r < 0)
			die("io_uring_wait_cqe_nr", -r);
		DTRACE_PROBE2(aiocost, phase, IO_URING, CLEAR);
		unsigned head, seen = 0;
		io_uring_for_each_cqe(&ring, head, cqe) {
			check_read(cqe->res);
			seen++;
		}
		io_uring_cq_advance(&ring, seen);
		DTRACE_PROBE1(aiocost, done, IO_URING);
	}
	io_uring_queue_exit(&ring);
}

static void run_native_aio(void)
{
	io_context_t ctx = 0;
	struct iocb *cbs = calloc(batch, sizeof(*cbs)), **ptrs = calloc(batch, sizeof(*ptrs));
	struct io_event *events = calloc(batch, sizeof(*events));
	int r = io_setup(batch, &ctx);

	if (r < 0)
		die("io_setup", -r);
	for (long it = 0; it < iterations; it++) {
		DTRACE_PROBE2(aiocost, phase, NATIVE_AIO, SUBMIT);
		for (int i = 0; i < batch; i++) {
			io_prep_pread(&cbs[i], fd, bufs[i], BLOCK, next_offset());
			ptrs[i] = &cbs[i];
		}
		r = io_submit(ctx, batch, ptrs);
		if (r != batch)
			die("io_submit", r < 0 ? -r : EAGAIN);
		DTRACE_PROBE2(aiocost, phase, NATIVE_AIO, POLL);
		for (int got = 0; got < batch;) {
			r = io_getevents(ctx, batch - got, batch - got, events + got, NULL);
			if (r < 0 && r != -EINTR)
				die("io_getevents", -r);
			got += r > 0 ? r : 0;
		}
		for (int i = 0; i < batch; i++)
			check_read((long)events[i].res);
		DTRACE_PROBE1(aiocost, done, NATIVE_AIO);
	}
	io_destroy(ctx);
	free(cbs);
	free(ptrs);
	free(events);
}

static void run_posix_aio(void)
{
	struct aiocb *cbs = calloc(batch, sizeof(*cbs));
	const struct aiocb **list = calloc(batch, sizeof(*list));

	for (long it = 0; it < iterations; it++) {
		DTRACE_PROBE2(aiocost, phase, POSIX_AIO, SUBMIT);
		for (int i = 0; i < batch; i++) {
			memset(&cbs[i], 0, sizeof(cbs[i]));
			cbs[i].aio_fildes = fd;
			cbs[i].aio_buf = bufs[i];
			cbs[i].aio_nbytes = BLOCK;
			cbs[i].aio_offset = next_offset();
			if (aio_read(&cbs[i]))
				die("aio_read", errno);
			list[i] = &cbs[i];
		}
		DTRACE_PROBE2(aiocost, phase, POSIX_AIO, POLL);
		for (int i = 0; i < batch; i++) {
			while (aio_error(&cbs[i]) == EINPROGRESS)
				aio_suspend(&list[i], 1, NULL);
			check_read(aio_return(&cbs[i]));
		}
		DTRACE_PROBE1(aiocost, done, POSIX_AIO);
	}
	free(cbs);
	free(list);
}

int main(int argc, char **argv)
{
	const char *which = "io_uring,libaio,posix";
	long size_mb = 64;
	int opt;

	while ((opt = getopt(argc, argv, "n:b:s:i:")) != -1) {
		switch (opt) {
		case 'n': iterations = atol(optarg); break;
		case 'b': batch = atoi(optarg); break;
		case 's': size_mb = atol(optarg); break;
		case 'i': which = optarg; break;
		default:
			fprintf(stderr, "usage: aiobench [-n ITERATIONS] [-b BATCH] [-s FILE_MB] [-i io_uring,libaio,posix] FILE\n");
			return 2;
		}
	}
	if (optind + 1 != argc || iterations < 1 || batch < 1 || batch > 1024 || size_mb < 1) {
		fprintf(stderr, "usage: aiobench [-n ITERATIONS>0] [-b BATCH 1..1024] [-s FILE_MB>0] [-i io_uring,libaio,posix] FILE\n");
		return 2;
	}
	const char *path = argv[optind];
	struct stat st;
	off_t want = (off_t)size_mb << 20;

	if (stat(path, &st) || st.st_size < want) {
		int w = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		char chunk[1 << 16];

		if (w < 0)
			die(path, errno);
		memset(chunk, 0x5a, sizeof chunk);
		for (off_t done = 0; done < want; done += sizeof chunk)
			if (write(w, chunk, sizeof chunk) != (ssize_t)sizeof chunk)
				die("writing the file", errno);
		fsync(w);
		close(w);
	}
	fd = open(path, O_RDONLY | O_DIRECT);
	if (fd < 0)
		die("opening the file with O_DIRECT (the file system must support it; tmpfs does not)", errno);
	blocks = want / BLOCK;
	bufs = calloc(batch, sizeof(*bufs));
	for (int i = 0; i < batch; i++)
		if (posix_memalign(&bufs[i], BLOCK, BLOCK))
			die("posix_memalign", ENOMEM);
	for (int k = 0; k < NIFACES; k++) {
		const char *tag[NIFACES] = { "io_uring", "libaio", "posix" };

		if (!strstr(which, tag[k]))
			continue;
		double t0 = now_us();
		if (k == IO_URING)
			run_io_uring();
		else if (k == NATIVE_AIO)
			run_native_aio();
		else
			run_posix_aio();
		printf("aiobench: %s: %ld iterations of %d reads, %.1f us per iteration\n", names[k], iterations, batch, (now_us() - t0) / iterations);
	}
	return 0;
}
