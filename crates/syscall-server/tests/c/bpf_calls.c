/* bpf() commands through libbpf's low-level API, printing one line per result. Run against
 * the kernel and under the userbpf syscall server: lines must agree (tests/bpf_calls.rs).
 * Lines starting with "u:" describe results only meaningful under userbpf (pins, ids). */
#include <bpf/bpf.h>
#include <bpf/btf.h>
#include <bpf/libbpf.h>
#include <errno.h>
#include <linux/bpf.h>
#include <linux/perf_event.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define R(name, expr) do { int _r = (expr); printf("%s %d\n", name, _r < 0 ? -errno : _r >= 0 ? 0 : _r); } while (0)
#define INSN(op, d, s, o, i) ((struct bpf_insn){ .code = (op), .dst_reg = (d), .src_reg = (s), .off = (o), .imm = (i) })
#define MOV64_IMM(d, i) INSN(BPF_ALU64 | BPF_MOV | BPF_K, d, 0, 0, i)
#define MOV64_REG(d, s) INSN(BPF_ALU64 | BPF_MOV | BPF_X, d, s, 0, 0)
#define ADD64_IMM(d, i) INSN(BPF_ALU64 | BPF_ADD | BPF_K, d, 0, 0, i)
#define ST_W(d, o, i) INSN(BPF_ST | BPF_MEM | BPF_W, d, 0, o, i)
#define CALL(i) INSN(BPF_JMP | BPF_CALL, 0, 0, 0, i)
#define EXIT() INSN(BPF_JMP | BPF_EXIT, 0, 0, 0, 0)
#define LD_MAP_FD(d, fd) INSN(BPF_LD | BPF_DW | BPF_IMM, d, BPF_PSEUDO_MAP_FD, 0, fd), INSN(0, 0, 0, 0, 0)

static int ncpus;

static void maps_basic(void) {
    int fd = bpf_map_create(BPF_MAP_TYPE_HASH, "h", 4, 8, 4, NULL);
    printf("hash_create %s\n", fd >= 0 ? "fd" : strerror(errno));
    uint64_t v;
    for (uint32_t k = 1; k <= 4; k++) { v = k * 100; R("hash_update", bpf_map_update_elem(fd, &k, &v, BPF_ANY)); }
    uint32_t k = 5; v = 5;
    R("hash_update_full", bpf_map_update_elem(fd, &k, &v, BPF_ANY));
    k = 2;
    R("hash_update_noexist", bpf_map_update_elem(fd, &k, &v, BPF_NOEXIST));
    k = 9;
    R("hash_update_exist", bpf_map_update_elem(fd, &k, &v, BPF_EXIST));
    R("hash_update_badflags", bpf_map_update_elem(fd, &k, &v, 99));
    k = 2; v = 0;
    R("hash_lookup", bpf_map_lookup_elem(fd, &k, &v));
    printf("hash_lookup_value %llu\n", (unsigned long long)v);
    k = 9;
    R("hash_lookup_missing", bpf_map_lookup_elem(fd, &k, &v));
    int n = 0; uint32_t next, *prev = NULL, cur;
    while (bpf_map_get_next_key(fd, prev, &next) == 0) { n++; cur = next; prev = &cur; }
    printf("hash_keys %d errno_at_end %d\n", n, errno);
    k = 3;
    R("hash_delete", bpf_map_delete_elem(fd, &k));
    R("hash_delete_again", bpf_map_delete_elem(fd, &k));
    k = 1;
    R("hash_lookup_and_delete", bpf_map_lookup_and_delete_elem(fd, &k, &v));
    printf("hash_lookup_and_delete_value %llu\n", (unsigned long long)v);
    R("hash_lookup_deleted", bpf_map_lookup_elem(fd, &k, &v));
    R("lookup_badfd", bpf_map_lookup_elem(9999, &k, &v));
    R("lookup_notmap", bpf_map_lookup_elem(1, &k, &v));
    struct bpf_map_info info; uint32_t len = sizeof(info);
    memset(&info, 0, sizeof(info));
    R("map_info", bpf_obj_get_info_by_fd(fd, &info, &len));
    printf("map_info type=%u key=%u value=%u max=%u flags=%u name=%s len=%u\n", info.type, info.key_size, info.value_size, info.max_entries, info.map_flags, info.name, len);
    uint32_t id = info.id, nid = 0, found = 0;
    while (bpf_map_get_next_id(nid, &nid) == 0) if (nid == id) found = 1;
    printf("map_next_id_finds_it %u\n", found);
    int fd2 = bpf_map_get_fd_by_id(id);
    memset(&info, 0, sizeof(info)); len = sizeof(info);
    bpf_obj_get_info_by_fd(fd2, &info, &len);
    printf("map_fd_by_id same=%d\n", info.id == id);
    k = 2;
    R("lookup_through_fd_by_id", bpf_map_lookup_elem(fd2, &k, &v));
    int fd3 = dup(fd);
    R("lookup_through_dup", bpf_map_lookup_elem(fd3, &k, &v));
    close(fd3); close(fd2); close(fd);
    R("map_fd_by_missing_id", bpf_map_get_fd_by_id(0x7ffffff0));

    /* Per-CPU values: round_up(value_size, 8) per possible CPU. */
    fd = bpf_map_create(BPF_MAP_TYPE_PERCPU_ARRAY, "pa", 4, 4, 2, NULL);
    uint64_t vals[256];
    for (int c = 0; c < ncpus; c++) vals[c] = 0xabcd0000u + c;
    k = 1;
    R("percpu_update", bpf_map_update_elem(fd, &k, vals, BPF_ANY));
    memset(vals, 0, sizeof(vals));
    R("percpu_lookup", bpf_map_lookup_elem(fd, &k, vals));
    int ok = 1;
    for (int c = 0; c < ncpus; c++) ok &= (uint32_t)vals[c] == 0xabcd0000u + c;
    printf("percpu_values_ok %d\n", ok);
    k = 5;
    R("percpu_lookup_oob", bpf_map_lookup_elem(fd, &k, vals));
    R("array_delete", bpf_map_delete_elem(fd, &k));
    close(fd);

    /* Queue and stack. */
    int q = bpf_map_create(BPF_MAP_TYPE_QUEUE, "q", 0, 4, 3, NULL);
    int s = bpf_map_create(BPF_MAP_TYPE_STACK, "s", 0, 4, 3, NULL);
    for (uint32_t i = 1; i <= 3; i++) { bpf_map_update_elem(q, NULL, &i, 0); bpf_map_update_elem(s, NULL, &i, 0); }
    uint32_t x = 4;
    R("queue_push_full", bpf_map_update_elem(q, NULL, &x, 0));
    R("queue_peek", bpf_map_lookup_elem(q, NULL, &x));
    printf("queue_peek_value %u\n", x);
    for (int i = 0; i < 3; i++) { bpf_map_lookup_and_delete_elem(q, NULL, &x); printf("queue_pop %u\n", x); }
    R("queue_pop_empty", bpf_map_lookup_and_delete_elem(q, NULL, &x));
    for (int i = 0; i < 3; i++) { bpf_map_lookup_and_delete_elem(s, NULL, &x); printf("stack_pop %u\n", x); }
    close(q); close(s);

    /* Freeze. */
    fd = bpf_map_create(BPF_MAP_TYPE_ARRAY, "fz", 4, 4, 1, NULL);
    k = 0; x = 7;
    R("freeze_update_before", bpf_map_update_elem(fd, &k, &x, 0));
    R("freeze", bpf_map_freeze(fd));
    R("freeze_again", bpf_map_freeze(fd));
    R("freeze_update_after", bpf_map_update_elem(fd, &k, &x, 0));
    R("freeze_lookup_after", bpf_map_lookup_elem(fd, &k, &x));
    close(fd);

    /* Bad creations. */
    R("create_bad_type", bpf_map_create(1000, "x", 4, 4, 1, NULL));
    R("create_zero_entries", bpf_map_create(BPF_MAP_TYPE_HASH, "x", 4, 4, 0, NULL));
    R("create_bad_name", bpf_map_create(BPF_MAP_TYPE_HASH, "a-b", 4, 4, 1, NULL));
    R("create_array_key8", bpf_map_create(BPF_MAP_TYPE_ARRAY, "x", 8, 4, 1, NULL));
}

static uint32_t map_id(int fd) {
    struct bpf_map_info i; uint32_t l = sizeof(i); memset(&i, 0, sizeof(i));
    bpf_obj_get_info_by_fd(fd, &i, &l);
    return i.id;
}

/* Descriptor-valued maps: the syscall stores the object and reads back its id. */
static void fd_maps(void) {
    int inner = bpf_map_create(BPF_MAP_TYPE_ARRAY, "inner", 4, 8, 2, NULL);
    int other = bpf_map_create(BPF_MAP_TYPE_ARRAY, "other", 4, 16, 2, NULL);
    LIBBPF_OPTS(bpf_map_create_opts, o, .inner_map_fd = inner);
    int outer = bpf_map_create(BPF_MAP_TYPE_ARRAY_OF_MAPS, "outer", 4, 4, 2, &o);
    printf("map_in_map_create %s\n", outer >= 0 ? "fd" : strerror(errno));
    R("map_in_map_no_inner", bpf_map_create(BPF_MAP_TYPE_ARRAY_OF_MAPS, "o2", 4, 4, 2, NULL));
    uint32_t k = 1, v = inner, got = 0;
    R("map_in_map_update", bpf_map_update_elem(outer, &k, &v, 0));
    R("map_in_map_lookup", bpf_map_lookup_elem(outer, &k, &got));
    printf("map_in_map_lookup_is_id %d\n", got == map_id(inner));
    v = other;
    R("map_in_map_update_incompatible", bpf_map_update_elem(outer, &k, &v, 0));
    v = 9999;
    R("map_in_map_update_badfd", bpf_map_update_elem(outer, &k, &v, 0));
    close(outer); close(other); close(inner);

    struct bpf_insn ret0[] = { MOV64_IMM(0, 0), EXIT() };
    int p = bpf_prog_load(BPF_PROG_TYPE_KPROBE, "tail", "GPL", ret0, 2, NULL);
    int pa = bpf_map_create(BPF_MAP_TYPE_PROG_ARRAY, "pa", 4, 4, 4, NULL);
    k = 2; v = p;
    R("prog_array_update", bpf_map_update_elem(pa, &k, &v, 0));
    struct bpf_prog_info pi; uint32_t pl = sizeof(pi); memset(&pi, 0, sizeof(pi));
    bpf_obj_get_info_by_fd(p, &pi, &pl);
    got = 0;
    int r = bpf_map_lookup_elem(pa, &k, &got);
    printf("prog_array_lookup %d is_id %d\n", r < 0 ? -errno : 0, got == pi.id);
    v = pa;
    R("prog_array_update_with_map_fd", bpf_map_update_elem(pa, &k, &v, 0));
    R("prog_array_delete", bpf_map_delete_elem(pa, &k));
    R("prog_array_delete_again", bpf_map_delete_elem(pa, &k));
    close(pa); close(p);

    /* Per-CPU hash through the batch calls: round_up(12, 8) bytes per CPU. */
    int ph = bpf_map_create(BPF_MAP_TYPE_PERCPU_HASH, "ph", 4, 12, 8, NULL);
    static uint8_t vals[4 * 16 * 256];
    uint32_t keys[4] = {10, 20, 30, 40}, count = 4;
    for (int e = 0; e < 4; e++)
        for (int c = 0; c < ncpus; c++) memset(vals + (e * ncpus + c) * 16, e * 16 + c + 1, 12);
    R("percpu_hash_update_batch", bpf_map_update_batch(ph, keys, vals, &count, NULL));
    memset(vals, 0, sizeof(vals));
    uint32_t out_keys[8], batch, total = 0, ok = 1;
    count = 8;
    r = bpf_map_lookup_batch(ph, NULL, &batch, out_keys, vals, &count, NULL);
    printf("percpu_hash_lookup_batch %d count %u\n", r < 0 ? -errno : 0, count);
    for (uint32_t e = 0; e < count; e++) {
        uint32_t idx = out_keys[e] / 10 - 1;
        for (int c = 0; c < ncpus; c++) ok &= vals[(e * ncpus + c) * 16 + 11] == idx * 16 + c + 1;
        total++;
    }
    printf("percpu_hash_batch_values_ok %u total %u\n", ok, total);
    close(ph);
}

static void maps_batch(void) {
    int fd = bpf_map_create(BPF_MAP_TYPE_HASH, "hb", 4, 8, 64, NULL);
    uint32_t keys[64]; uint64_t vals[64];
    for (int i = 0; i < 10; i++) { keys[i] = i + 1; vals[i] = (i + 1) * 10; }
    uint32_t count = 10;
    R("update_batch", bpf_map_update_batch(fd, keys, vals, &count, NULL));
    printf("update_batch_count %u\n", count);
    uint32_t batch = 0, total = 0; uint64_t sum = 0; int r, calls = 0;
    void *in = NULL;
    do {
        count = 4;
        r = bpf_map_lookup_batch(fd, in, &batch, keys, vals, &count, NULL);
        int e = r < 0 ? errno : 0;
        for (uint32_t i = 0; i < count; i++) sum += vals[i];
        total += count; in = &batch; calls++;
        if (r < 0 && e != ENOENT) { printf("lookup_batch_error %d\n", -e); break; }
        if (r < 0) break;
    } while (calls < 100);
    printf("lookup_batch total=%u sum=%llu\n", total, (unsigned long long)sum);
    for (int i = 0; i < 3; i++) keys[i] = i + 1;
    count = 3;
    R("delete_batch", bpf_map_delete_batch(fd, keys, &count, NULL));
    printf("delete_batch_count %u\n", count);
    keys[0] = 1; count = 1;
    R("delete_batch_missing", bpf_map_delete_batch(fd, keys, &count, NULL));
    printf("delete_batch_missing_count %u\n", count);
    total = 0; sum = 0; in = NULL; calls = 0;
    do {
        count = 64;
        r = bpf_map_lookup_and_delete_batch(fd, in, &batch, keys, vals, &count, NULL);
        for (uint32_t i = 0; i < count; i++) sum += vals[i];
        total += count; in = &batch; calls++;
    } while (r == 0 && calls < 100);
    printf("lookup_and_delete_batch total=%u sum=%llu end=%d\n", total, (unsigned long long)sum, -errno);
    uint32_t k = 5; uint64_t v;
    R("after_lookup_and_delete_batch", bpf_map_lookup_elem(fd, &k, &v));
    close(fd);

    fd = bpf_map_create(BPF_MAP_TYPE_ARRAY, "ab", 4, 8, 6, NULL);
    for (int i = 0; i < 6; i++) { keys[i] = i; vals[i] = i * 3; }
    count = 6;
    R("array_update_batch", bpf_map_update_batch(fd, keys, vals, &count, NULL));
    uint32_t abatch = 0; total = 0; sum = 0; in = NULL; calls = 0;
    do {
        count = 4;
        r = bpf_map_lookup_batch(fd, in, &abatch, keys, vals, &count, NULL);
        for (uint32_t i = 0; i < count; i++) sum += vals[i];
        total += count; in = &abatch; calls++;
    } while (r == 0 && calls < 100);
    printf("array_lookup_batch total=%u sum=%llu end=%d\n", total, (unsigned long long)sum, -errno);
    count = 1;
    R("array_lookup_and_delete_batch", bpf_map_lookup_and_delete_batch(fd, NULL, &abatch, keys, vals, &count, NULL));
    close(fd);
    int q = bpf_map_create(BPF_MAP_TYPE_QUEUE, "qb", 0, 4, 3, NULL);
    count = 1;
    R("queue_lookup_batch", bpf_map_lookup_batch(q, NULL, &abatch, keys, vals, &count, NULL));
    close(q);
}

static int load(enum bpf_prog_type t, const char *name, struct bpf_insn *insns, size_t n, char *log, size_t log_size, int level) {
    LIBBPF_OPTS(bpf_prog_load_opts, o, .log_buf = log, .log_size = log_size, .log_level = level);
    if (log) log[0] = 0;
    return bpf_prog_load(t, name, "GPL", insns, n, log ? &o : NULL);
}

static void progs(void) {
    static char log[65536];
    struct bpf_insn ret0[] = { MOV64_IMM(0, 0), EXIT() };
    int fd = load(BPF_PROG_TYPE_KPROBE, "ret0", ret0, 2, log, sizeof(log), 1);
    printf("prog_load %s\n", fd >= 0 ? "fd" : strerror(errno));
    printf("prog_log_processed %d\n", strstr(log, "processed 2 insns") != NULL);
    /* bpftrace reads the instruction limit from this line; an lddw counts once. */
    struct bpf_insn lddw_exit[] = { INSN(BPF_LD | BPF_DW | BPF_IMM, 0, 0, 0, 0), INSN(0, 0, 0, 0, 0), EXIT() };
    int lfd = load(BPF_PROG_TYPE_KPROBE, "", lddw_exit, 3, log, sizeof(log), 1);
    printf("prog_log_lddw_once %d %d\n", lfd >= 0, strstr(log, "processed 2 insns (limit 1000000)") != NULL);
    close(lfd);
    struct bpf_prog_info info; uint32_t len = sizeof(info);
    memset(&info, 0, sizeof(info));
    R("prog_info", bpf_obj_get_info_by_fd(fd, &info, &len));
    printf("prog_info type=%u name=%s xlated=%u nr_map_ids=%u gpl=%u tag=%02x%02x%02x%02x%02x%02x%02x%02x\n", info.type, info.name, info.xlated_prog_len, info.nr_map_ids, info.gpl_compatible,
           info.tag[0], info.tag[1], info.tag[2], info.tag[3], info.tag[4], info.tag[5], info.tag[6], info.tag[7]);
    struct bpf_insn xl[4];
    memset(&info, 0, sizeof(info)); len = sizeof(info);
    info.xlated_prog_len = sizeof(xl); info.xlated_prog_insns = (uintptr_t)xl;
    bpf_obj_get_info_by_fd(fd, &info, &len);
    printf("prog_xlated op0=%02x imm0=%d op1=%02x\n", xl[0].code, xl[0].imm, xl[1].code);
    uint32_t id = info.id, nid = 0, found = 0;
    while (bpf_prog_get_next_id(nid, &nid) == 0) if (nid == id) found = 1;
    printf("prog_next_id_finds_it %u\n", found);
    int fd2 = bpf_prog_get_fd_by_id(id);
    memset(&info, 0, sizeof(info)); len = sizeof(info);
    bpf_obj_get_info_by_fd(fd2, &info, &len);
    printf("prog_fd_by_id same=%d\n", info.id == id);
    close(fd2);

    /* The perf link probe libbpf runs: EBADF means perf links are supported. */
    struct bpf_insn tp[] = { MOV64_IMM(0, 0), EXIT() };
    int tfd = load(BPF_PROG_TYPE_TRACEPOINT, "", tp, 2, NULL, 0, 0);
    R("link_create_bad_target", bpf_link_create(tfd, -1, BPF_PERF_EVENT, NULL));
    R("link_create_bad_type", bpf_link_create(tfd, 0, BPF_CGROUP_INET_INGRESS, NULL));
    close(tfd);
    close(fd);

    /* Refusals, with the verifier's words. */
    struct bpf_insn bad_helper[] = { CALL(999), EXIT() };
    fd = load(BPF_PROG_TYPE_KPROBE, "bh", bad_helper, 2, log, sizeof(log), 1);
    printf("prog_bad_helper %d log_has_invalid_func %d\n", fd < 0 ? -errno : 0, strstr(log, "invalid func unknown#999") != NULL);
    struct bpf_insn net_helper[] = { CALL(BPF_FUNC_skb_store_bytes), EXIT() };
    fd = load(BPF_PROG_TYPE_KPROBE, "nh", net_helper, 2, log, sizeof(log), 1);
    printf("prog_net_helper %d log_names_it %d\n", fd < 0 ? -errno : 0, strstr(log, "bpf_skb_store_bytes#9\n") != NULL);
    struct bpf_insn bad_jump[] = { INSN(BPF_JMP | BPF_JA, 0, 0, 5, 0), MOV64_IMM(0, 0), EXIT() };
    fd = load(BPF_PROG_TYPE_KPROBE, "bj", bad_jump, 3, log, sizeof(log), 1);
    printf("prog_bad_jump %d\n", fd < 0 ? -errno : 0);
    struct bpf_insn no_exit[] = { MOV64_IMM(0, 0) };
    fd = load(BPF_PROG_TYPE_KPROBE, "ne", no_exit, 1, log, sizeof(log), 1);
    printf("prog_no_exit %d\n", fd < 0 ? -errno : 0);
    struct bpf_insn bad_map[] = { LD_MAP_FD(1, 9999), MOV64_IMM(0, 0), EXIT() };
    fd = load(BPF_PROG_TYPE_KPROBE, "bm", bad_map, 4, log, sizeof(log), 1);
    printf("prog_bad_map_fd %d\n", fd < 0 ? -errno : 0);
    fd = load(BPF_PROG_TYPE_KPROBE, "ls", ret0, 2, log, 100, 1);
    printf("prog_log_too_small %d\n", fd < 0 ? -errno : 0);
    fd = load(BPF_PROG_TYPE_KPROBE, "ll", ret0, 2, NULL, 0, 1);
    printf("prog_level_without_buf %d\n", fd < 0 ? -errno : 0);
    fd = load(1000, "bt", ret0, 2, NULL, 0, 0);
    printf("prog_bad_type %d\n", fd < 0 ? -errno : 0);
    fd = load(BPF_PROG_TYPE_KPROBE, "zero", ret0, 0, NULL, 0, 0);
    printf("prog_zero_insns %d\n", fd < 0 ? -errno : 0);
    fd = load(BPF_PROG_TYPE_KPROBE, "bad-name", ret0, 2, NULL, 0, 0);
    printf("prog_bad_name %d\n", fd < 0 ? -errno : 0);

    /* Refusals by the verifier's rules: the kernel's errno and words, the log's limits. */
    struct bpf_insn uninit_r0[] = { EXIT() };
    fd = load(BPF_PROG_TYPE_KPROBE, "r0", uninit_r0, 1, log, sizeof(log), 1);
    printf("prog_uninit_r0 %d log_says_it %d\n", fd < 0 ? -errno : 0, strstr(log, "R0 !read_ok\n") != NULL);
    int vm = bpf_map_create(BPF_MAP_TYPE_ARRAY, "vm", 4, 8, 1, NULL);
    struct bpf_insn value_oob[] = {
        ST_W(10, -4, 0), MOV64_REG(2, 10), ADD64_IMM(2, -4), LD_MAP_FD(1, vm), CALL(BPF_FUNC_map_lookup_elem),
        INSN(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, 1, 0), ST_W(0, 8, 7), MOV64_IMM(0, 0), EXIT(),
    };
    size_t nv = sizeof(value_oob) / sizeof(value_oob[0]);
    fd = load(BPF_PROG_TYPE_KPROBE, "oob", value_oob, nv, log, sizeof(log), 1);
    printf("prog_value_oob %d log_says_it %d log_ends_with_processed %d\n", fd < 0 ? -errno : 0,
           strstr(log, "invalid access to map value, value_size=8 off=8 size=4\n") != NULL,
           strstr(log, "\nprocessed ") != NULL && log[strlen(log) - 1] == '\n');
    fd = load(BPF_PROG_TYPE_KPROBE, "oob", value_oob, nv, NULL, 0, 0);
    printf("prog_value_oob_no_log %d\n", fd < 0 ? -errno : 0);
    fd = load(BPF_PROG_TYPE_KPROBE, "oob", value_oob, nv, log, 24, 1);
    printf("prog_value_oob_log_too_small %d len %zu\n", fd < 0 ? -errno : 0, strlen(log));
    fd = load(BPF_PROG_TYPE_KPROBE, "oob", value_oob, nv, log, sizeof(log), 2);
    printf("prog_value_oob_level2 %d log_says_it %d states %d\n", fd < 0 ? -errno : 0,
           strstr(log, "value_size=8 off=8 size=4\n") != NULL, strstr(log, "R0=map_value") != NULL);
    value_oob[7] = ST_W(0, 4, 7);
    fd = load(BPF_PROG_TYPE_KPROBE, "inb", value_oob, nv, log, sizeof(log), 1);
    printf("prog_value_in_bounds %s\n", fd >= 0 ? "fd" : strerror(errno));
    close(fd);
    fd = load(BPF_PROG_TYPE_KPROBE, "inb", value_oob, nv, log, 20, 1);
    printf("prog_value_in_bounds_log_too_small %d len %zu\n", fd < 0 ? -errno : 0, strlen(log));
    fd = load(BPF_PROG_TYPE_KPROBE, "inb", value_oob, nv, log, sizeof(log), 4);
    printf("prog_value_in_bounds_stats %d %d\n", fd >= 0, strstr(log, "verification time ") != NULL && strstr(log, "usec\nstack depth 4\n") != NULL);
    close(fd);
    close(vm);

    /* A program using a map: map ids in the info, the map looked up. */
    int m = bpf_map_create(BPF_MAP_TYPE_HASH, "pm", 4, 8, 4, NULL);
    struct bpf_insn use_map[] = {
        ST_W(10, -4, 1), MOV64_REG(2, 10), ADD64_IMM(2, -4), LD_MAP_FD(1, m), CALL(BPF_FUNC_map_lookup_elem), MOV64_IMM(0, 0), EXIT(),
    };
    fd = load(BPF_PROG_TYPE_KPROBE, "usemap", use_map, 8, log, sizeof(log), 1);
    printf("prog_with_map %s\n", fd >= 0 ? "fd" : strerror(errno));
    uint32_t map_ids[4] = {0};
    memset(&info, 0, sizeof(info)); len = sizeof(info);
    info.nr_map_ids = 4; info.map_ids = (uintptr_t)map_ids;
    bpf_obj_get_info_by_fd(fd, &info, &len);
    struct bpf_map_info minfo; uint32_t mlen = sizeof(minfo); memset(&minfo, 0, sizeof(minfo));
    bpf_obj_get_info_by_fd(m, &minfo, &mlen);
    printf("prog_map_ids nr=%u same=%d\n", info.nr_map_ids, map_ids[0] == minfo.id);
    int bm = bpf_map_create(BPF_MAP_TYPE_ARRAY, "bind", 4, 4, 1, NULL);
    R("prog_bind_map", bpf_prog_bind_map(fd, bm, NULL));
    memset(&info, 0, sizeof(info)); len = sizeof(info);
    bpf_obj_get_info_by_fd(fd, &info, &len);
    printf("prog_map_ids_after_bind nr=%u\n", info.nr_map_ids);
    close(fd); close(m); close(bm);

    /* A helper behind a branch on frozen read-only data that is false: never checked (the
     * kernel prunes it; libbpf-tools' cgroup filters rely on it). Not frozen: checked. */
    for (int frozen = 1; frozen >= 0; frozen--) {
        int ro = bpf_map_create(BPF_MAP_TYPE_ARRAY, "ro", 4, 8, 1, &(struct bpf_map_create_opts){ .sz = sizeof(struct bpf_map_create_opts), .map_flags = BPF_F_RDONLY_PROG });
        uint32_t z = 0; uint64_t zv = 0;
        bpf_map_update_elem(ro, &z, &zv, 0);
        if (frozen) bpf_map_freeze(ro);
        struct bpf_insn gated[] = {
            INSN(BPF_LD | BPF_DW | BPF_IMM, 1, BPF_PSEUDO_MAP_VALUE, 0, ro), INSN(0, 0, 0, 0, 4),
            INSN(BPF_LDX | BPF_MEM | BPF_B, 1, 1, 0, 0),
            INSN(BPF_JMP | BPF_JEQ | BPF_K, 1, 0, 4, 0),
            LD_MAP_FD(1, ro), MOV64_IMM(2, 0), CALL(BPF_FUNC_current_task_under_cgroup),
            MOV64_IMM(0, 0), EXIT(),
        };
        fd = load(BPF_PROG_TYPE_KPROBE, "gated", gated, sizeof(gated) / sizeof(gated[0]), log, sizeof(log), 1);
        printf("prog_dead_helper_frozen=%d loads %d\n", frozen, fd >= 0);
        if (fd >= 0) close(fd);
        close(ro);
    }

    /* Test runs: BEGIN-style raw tracepoint programs. */
    struct bpf_insn ret42[] = { MOV64_IMM(0, 42), EXIT() };
    fd = load(BPF_PROG_TYPE_RAW_TRACEPOINT, "r42", ret42, 2, NULL, 0, 0);
    LIBBPF_OPTS(bpf_test_run_opts, topts);
    R("test_run", bpf_prog_test_run_opts(fd, &topts));
    printf("test_run_retval %u\n", topts.retval);
    close(fd);
    fd = load(BPF_PROG_TYPE_KPROBE, "k42", ret42, 2, NULL, 0, 0);
    LIBBPF_OPTS(bpf_test_run_opts, topts2);
    R("test_run_kprobe", bpf_prog_test_run_opts(fd, &topts2));
    close(fd);
}

/* A perf link on a CPU clock event: created, no detach operation (as the kernel's perf
 * links), its info names the program. */
static void links(void) {
    struct bpf_insn p[] = { MOV64_IMM(0, 0), EXIT() };
    int pf = bpf_prog_load(BPF_PROG_TYPE_PERF_EVENT, "pe", "GPL", p, 2, NULL);
    struct perf_event_attr a;
    memset(&a, 0, sizeof(a));
    a.size = sizeof(a); a.type = PERF_TYPE_SOFTWARE; a.config = PERF_COUNT_SW_CPU_CLOCK; a.sample_period = 100000000;
    int ev = syscall(__NR_perf_event_open, &a, 0, -1, -1, PERF_FLAG_FD_CLOEXEC);
    int l = bpf_link_create(pf, ev, BPF_PERF_EVENT, NULL);
    printf("link_create %s\n", l >= 0 ? "fd" : strerror(errno));
    R("link_create_again", bpf_link_create(pf, ev, BPF_PERF_EVENT, NULL));
    R("link_detach", bpf_link_detach(l));
    struct bpf_link_info li; uint32_t len = sizeof(li); memset(&li, 0, sizeof(li));
    R("link_info", bpf_obj_get_info_by_fd(l, &li, &len));
    struct bpf_prog_info pi; uint32_t pl = sizeof(pi); memset(&pi, 0, sizeof(pi));
    bpf_obj_get_info_by_fd(pf, &pi, &pl);
    printf("link_info type=%u prog_same=%d\n", li.type, li.prog_id == pi.id);
    R("link_detach_prog_fd", bpf_link_detach(pf));
    close(l); close(ev); close(pf);
}

__attribute__((noinline)) int probed_function(int x) {
    volatile int y = x * 3;
    return y + 1;
}

/* The file offset of probed_function in this executable (from /proc/self/maps). */
static unsigned long file_offset_of(void *fn, char *path, size_t len) {
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    unsigned long a = (unsigned long)fn, off = 0;
    while (fgets(line, sizeof(line), f)) {
        unsigned long lo, hi, foff;
        char perms[8], p[256] = "";
        if (sscanf(line, "%lx-%lx %7s %lx %*s %*s %255s", &lo, &hi, perms, &foff, p) >= 4 && a >= lo && a < hi) {
            off = a - lo + foff;
            snprintf(path, len, "%s", p);
        }
    }
    fclose(f);
    return off;
}

/* TASK_FD_QUERY on a uprobe perf event: no program yet (ENOENT), then with a perf link. */
static void fd_query(void) {
    char path[256];
    unsigned long off = file_offset_of((void *)probed_function, path, sizeof(path));
    FILE *t = fopen("/sys/bus/event_source/devices/uprobe/type", "r");
    int type = 0;
    if (!t || fscanf(t, "%d", &type) != 1) { printf("no uprobe pmu\n"); return; }
    fclose(t);
    struct perf_event_attr a;
    memset(&a, 0, sizeof(a));
    a.size = sizeof(a); a.type = type; a.config1 = (uintptr_t)path; a.config2 = off;
    int ev = syscall(__NR_perf_event_open, &a, getpid(), -1, -1, PERF_FLAG_FD_CLOEXEC);
    printf("uprobe_event %s\n", ev >= 0 ? "fd" : strerror(errno));
    char buf[256]; uint32_t blen = sizeof(buf), prog_id = 0, fd_type = 0; __u64 poff = 0, paddr = 0;
    R("fd_query_no_prog", bpf_task_fd_query(getpid(), ev, 0, buf, &blen, &prog_id, &fd_type, &poff, &paddr));
    struct bpf_insn p[] = { MOV64_IMM(0, 0), EXIT() };
    int pf = bpf_prog_load(BPF_PROG_TYPE_KPROBE, "up", "GPL", p, 2, NULL);
    int l = bpf_link_create(pf, ev, BPF_PERF_EVENT, NULL);
    printf("uprobe_link %s\n", l >= 0 ? "fd" : strerror(errno));
    blen = sizeof(buf);
    R("fd_query", bpf_task_fd_query(getpid(), ev, 0, buf, &blen, &prog_id, &fd_type, &poff, &paddr));
    struct bpf_prog_info pi; uint32_t pl = sizeof(pi); memset(&pi, 0, sizeof(pi));
    bpf_obj_get_info_by_fd(pf, &pi, &pl);
    printf("fd_query type=%u prog_same=%d path_same=%d len_ok=%d offset_same=%d\n", fd_type, prog_id == pi.id, !strcmp(buf, path), blen == strlen(path), poff == off);
    blen = 4;
    R("fd_query_short_buf", bpf_task_fd_query(getpid(), ev, 0, buf, &blen, &prog_id, &fd_type, &poff, &paddr));
    printf("fd_query_short_buf len_ok=%d\n", blen == strlen(path));
    R("fd_query_not_event", bpf_task_fd_query(getpid(), pf, 0, buf, &blen, &prog_id, &fd_type, &poff, &paddr));
    printf("probed %d\n", probed_function(2));
    close(l); close(pf); close(ev);
}

static void btf(void) {
    /* int type "int" (4 bytes, signed), a struct of two of them, a pointer, an array. */
    struct btf *b = btf__new_empty();
    btf__add_int(b, "int", 4, BTF_INT_SIGNED);
    btf__add_struct(b, "pt", 8);
    btf__add_field(b, "x", 1, 0, 0);
    btf__add_field(b, "y", 1, 32, 0);
    btf__add_ptr(b, 2);
    btf__add_array(b, 1, 1, 4);
    uint32_t size;
    const void *raw = btf__raw_data(b, &size);
    static char log[4096];
    LIBBPF_OPTS(bpf_btf_load_opts, o, .log_buf = log, .log_size = sizeof(log), .log_level = 1);
    int fd = bpf_btf_load(raw, size, &o);
    printf("btf_load %s\n", fd >= 0 ? "fd" : strerror(errno));
    printf("btf_log:\n%s", log);
    struct bpf_btf_info info; uint32_t len = sizeof(info);
    char data[256];
    memset(&info, 0, sizeof(info));
    info.btf = (uintptr_t)data; info.btf_size = sizeof(data);
    R("btf_info", bpf_obj_get_info_by_fd(fd, &info, &len));
    printf("btf_info size_ok=%d data_ok=%d\n", info.btf_size == size, memcmp(data, raw, size) == 0);
    int m = bpf_map_create(BPF_MAP_TYPE_ARRAY, "bt", 4, 4, 1, &(struct bpf_map_create_opts){ .sz = sizeof(struct bpf_map_create_opts), .btf_fd = fd, .btf_key_type_id = 1, .btf_value_type_id = 1 });
    struct bpf_map_info mi; uint32_t ml = sizeof(mi); memset(&mi, 0, sizeof(mi));
    bpf_obj_get_info_by_fd(m, &mi, &ml);
    printf("map_btf same=%d key=%u value=%u\n", mi.btf_id == info.id, mi.btf_key_type_id, mi.btf_value_type_id);
    close(m);
    close(fd);
    char bad[64];
    memcpy(bad, raw, size < 64 ? size : 64);
    bad[0] = 0x12;
    fd = bpf_btf_load(bad, size, &o);
    printf("btf_bad_magic %d\n", fd < 0 ? -errno : 0);
    btf__free(b);
}

/* The kernel's own BTF objects, found as bpftrace and libbpf find them: walking the BTF ids for
 * kernel_btf objects (other processes' BTF, kernel_btf 0, is skipped: its number varies). */
static void kernel_btf(void) {
    uint32_t id = 0;
    int seen = 0, vmlinux = 0;
    while (bpf_btf_get_next_id(id, &id) == 0) {
        int fd = bpf_btf_get_fd_by_id(id);
        if (fd < 0) { printf("kbtf_fd_by_id %d\n", -errno); continue; }
        char name[64] = "";
        struct bpf_btf_info info; uint32_t len = sizeof(info);
        memset(&info, 0, sizeof(info));
        info.name = (uintptr_t)name; info.name_len = sizeof(name);
        if (bpf_obj_get_info_by_fd(fd, &info, &len) != 0) { printf("kbtf_info %d\n", -errno); close(fd); continue; }
        if (!info.kernel_btf) { close(fd); continue; }
        seen++;
        char path[128];
        snprintf(path, sizeof(path), "/sys/kernel/btf/%s", name);
        FILE *f = fopen(path, "rb");
        long fsize = -1;
        if (f) { fseek(f, 0, SEEK_END); fsize = ftell(f); }
        printf("kbtf %s id_ok=%d name_len=%u size_matches_file=%d\n", name, info.id == id, info.name_len, fsize == (long)info.btf_size);
        if (strcmp(name, "vmlinux") == 0) {
            vmlinux = 1;
            /* The data, as btf__load_from_kernel_by_id reads it, against the file. */
            char *data = malloc(info.btf_size), *file = malloc(info.btf_size);
            uint32_t size = info.btf_size;
            memset(&info, 0, sizeof(info)); len = sizeof(info);
            info.btf = (uintptr_t)data; info.btf_size = size;
            R("kbtf_data_info", bpf_obj_get_info_by_fd(fd, &info, &len));
            fseek(f, 0, SEEK_SET);
            printf("kbtf_data_matches_file %d\n", fread(file, 1, size, f) == size && memcmp(data, file, size) == 0);
            free(data); free(file);
            /* A name buffer too short: as much as fits, NUL-ended, and ENOSPC. */
            char shortname[4] = "zzz";
            memset(&info, 0, sizeof(info)); len = sizeof(info);
            info.name = (uintptr_t)shortname; info.name_len = sizeof(shortname);
            R("kbtf_short_name", bpf_obj_get_info_by_fd(fd, &info, &len));
            printf("kbtf_short_name %s name_len=%u kernel_btf=%u\n", shortname, info.name_len, info.kernel_btf);
            struct btf *b = btf__load_from_kernel_by_id(id);
            struct btf *fb = btf__parse(path, NULL);
            printf("kbtf_load_by_id ok=%d same_types=%d\n", b != NULL, b && fb && btf__type_cnt(b) == btf__type_cnt(fb));
            btf__free(b); btf__free(fb);
            /* The kernel's BTF does not describe maps or programs. */
            int m = bpf_map_create(BPF_MAP_TYPE_ARRAY, "kb", 4, 4, 1, &(struct bpf_map_create_opts){ .sz = sizeof(struct bpf_map_create_opts), .btf_fd = fd, .btf_key_type_id = 1, .btf_value_type_id = 1 });
            printf("kbtf_map_create %d\n", m < 0 ? -errno : 0);
            if (m >= 0) close(m);
        }
        if (f) fclose(f);
        close(fd);
    }
    printf("kbtf_objects_seen %d vmlinux %d\n", seen > 0, vmlinux);
}

static void misc(void) {
    union bpf_attr attr;
    memset(&attr, 0, sizeof(attr));
    R("unknown_cmd", (int)syscall(__NR_bpf, 1000, &attr, sizeof(attr)));
    /* Non-zero bytes past the attributes this command uses. */
    memset(&attr, 0, sizeof(attr));
    attr.map_fd = 0;
    ((char *)&attr)[100] = 1;
    R("nonzero_tail", (int)syscall(__NR_bpf, BPF_MAP_FREEZE, &attr, sizeof(attr)));
    R("bad_attr_ptr", (int)syscall(__NR_bpf, BPF_MAP_CREATE, (void *)8, sizeof(attr)));
}

static void pins(void) {
    int fd = bpf_map_create(BPF_MAP_TYPE_ARRAY, "pin", 4, 4, 1, NULL);
    char path[128];
    snprintf(path, sizeof(path), "/sys/fs/bpf/userbpf_test_pins");
    bpf_map_freeze(fd);
    int r = bpf_obj_pin(fd, path);
    printf("u: pin %d\n", r < 0 ? -errno : 0);
    r = bpf_obj_pin(fd, path);
    printf("u: pin_again %d\n", r < 0 ? -errno : 0);
    int fd2 = bpf_obj_get(path);
    struct bpf_map_info a, b; uint32_t la = sizeof(a), lb = sizeof(b);
    memset(&a, 0, sizeof(a)); memset(&b, 0, sizeof(b));
    bpf_obj_get_info_by_fd(fd, &a, &la);
    bpf_obj_get_info_by_fd(fd2, &b, &lb);
    printf("u: obj_get same=%d\n", fd2 >= 0 && a.id == b.id);
    r = bpf_obj_get("/sys/fs/bpf/userbpf_test_missing");
    printf("u: obj_get_missing %d\n", r < 0 ? -errno : 0);
    r = bpf_obj_pin(fd, "/tmp/userbpf_not_bpffs");
    printf("u: pin_outside_bpffs %d\n", r < 0 ? -errno : 0);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    ncpus = libbpf_num_possible_cpus();
    const char *what = argc > 1 ? argv[1] : "all";
    if (!strcmp(what, "all") || !strcmp(what, "maps")) maps_basic();
    if (!strcmp(what, "all") || !strcmp(what, "batch")) maps_batch();
    if (!strcmp(what, "all") || !strcmp(what, "fdmaps")) fd_maps();
    if (!strcmp(what, "all") || !strcmp(what, "progs")) progs();
    if (!strcmp(what, "all") || !strcmp(what, "btf")) btf();
    if (!strcmp(what, "all") || !strcmp(what, "kbtf")) kernel_btf();
    if (!strcmp(what, "all") || !strcmp(what, "links")) links();
    if (!strcmp(what, "fdquery")) fd_query();
    if (!strcmp(what, "all") || !strcmp(what, "misc")) misc();
    if (!strcmp(what, "pins")) pins();
    if (!strcmp(what, "pins-get")) {
        int fd = bpf_obj_get("/sys/fs/bpf/userbpf_test_pins");
        struct bpf_map_info i; uint32_t l = sizeof(i); memset(&i, 0, sizeof(i));
        printf("u: obj_get_pinned_earlier %d\n", fd >= 0 && bpf_obj_get_info_by_fd(fd, &i, &l) == 0 && !strcmp(i.name, "pin"));
        uint32_t k = 0, v = 1;
        int r = bpf_map_update_elem(fd, &k, &v, 0);
        printf("u: update_frozen_by_another_loader %d\n", r < 0 ? -errno : 0);
    }
    return 0;
}
