// Loads every program of an object with libbpf, unmodified (bpf_object__load), and prints
// "loaded" or "load failed: ERR". libbpf prints the verifier's log of a refused program on
// stderr between "-- BEGIN PROG LOAD LOG --" and "-- END PROG LOAD LOG --".
#include <stdio.h>
#include <bpf/libbpf.h>

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: %s OBJ\n", argv[0]);
		return 2;
	}
	struct bpf_object *obj = bpf_object__open_file(argv[1], NULL);
	if (!obj) {
		fprintf(stderr, "open failed\n");
		return 2;
	}
	int err = bpf_object__load(obj);
	if (err) {
		printf("load failed: %d\n", err);
		return 1;
	}
	printf("loaded\n");
	bpf_object__close(obj);
	return 0;
}
