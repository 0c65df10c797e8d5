// Loads an object with libbpf, attaches every program, reads its ring buffer `events` while a
// command runs, then prints the events (16-byte names) in order: tests/passthrough.rs.
//   ringbuf_ref OBJ CMD ARGS...
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <bpf/libbpf.h>

static int on_event(void *ctx, void *data, size_t size)
{
	printf("%.16s\n", (const char *)data);
	return 0;
}

int main(int argc, char **argv)
{
	struct bpf_object *obj;
	struct bpf_program *prog;
	struct ring_buffer *rb;
	int status = 0;
	pid_t pid;

	if (argc < 3)
		return 2;
	obj = bpf_object__open_file(argv[1], NULL);
	if (!obj || bpf_object__load(obj)) {
		fprintf(stderr, "ringbuf_ref: loading %s: %s\n", argv[1], strerror(errno));
		return 1;
	}
	bpf_object__for_each_program(prog, obj) {
		if (!bpf_program__attach(prog)) {
			fprintf(stderr, "ringbuf_ref: attaching %s: %s\n", bpf_program__name(prog), strerror(errno));
			return 1;
		}
	}
	rb = ring_buffer__new(bpf_object__find_map_fd_by_name(obj, "events"), on_event, NULL, NULL);
	if (!rb) {
		fprintf(stderr, "ringbuf_ref: ring buffer: %s\n", strerror(errno));
		return 1;
	}
	pid = fork();
	if (pid == 0) {
		execvp(argv[2], argv + 2);
		_exit(127);
	}
	while (waitpid(pid, &status, WNOHANG) == 0)
		ring_buffer__poll(rb, 50);
	ring_buffer__consume(rb);
	return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
