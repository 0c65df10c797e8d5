// Loads pin.bpf.o with libbpf, unmodified: its map pinned by name is created and pinned by the
// first run and reused by the next ones (libbpf's bpf_obj_get, then its compatibility check).
// Each run adds one to the map's value and prints it: "runs N".
#include <stdio.h>
#include <bpf/libbpf.h>
#include <bpf/bpf.h>

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: %s OBJ\n", argv[0]);
		return 2;
	}
	struct bpf_object *obj = bpf_object__open_file(argv[1], NULL);
	if (!obj) {
		fprintf(stderr, "open failed\n");
		return 1;
	}
	int err = bpf_object__load(obj);
	if (err) {
		fprintf(stderr, "load failed: %d\n", err);
		return 1;
	}
	struct bpf_map *map = bpf_object__find_map_by_name(obj, "pinned_runs");
	if (!map || !bpf_map__is_pinned(map)) {
		fprintf(stderr, "map not pinned\n");
		return 1;
	}
	int fd = bpf_map__fd(map);
	__u32 key = 0;
	__u64 v = 0;
	if (bpf_map_lookup_elem(fd, &key, &v)) {
		perror("lookup");
		return 1;
	}
	v++;
	if (bpf_map_update_elem(fd, &key, &v, BPF_ANY)) {
		perror("update");
		return 1;
	}
	printf("runs %llu pinned at %s\n", (unsigned long long)v, bpf_map__pin_path(map));
	bpf_object__close(obj);
	return 0;
}
