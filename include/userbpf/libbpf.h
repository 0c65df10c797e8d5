/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * userbpf's extensions for libbpf loaders (libbpf 1.0 or later), run through `userbpf load`.
 *
 * SEC("uprobe.w/PATH:FUNC[+OFFSET]") is a uprobe program that may change the arguments of the
 * probed function (PT_REGS_PARM1(ctx) = ... : stores into its struct pt_regs), a userbpf
 * extension (`userbpf run` knows the section by itself). libbpf does not know the section, and
 * passes the kernel no section name at all, so a loader registers it before opening its
 * object:
 *
 *     #include <userbpf/libbpf.h>
 *     ...
 *     if (userbpf_libbpf_register() < 0) ...
 *     skel = prog_bpf__open_and_load();      // or bpf_object__open_file() + load
 *     prog_bpf__attach(skel);                // auto-attach works as for SEC("uprobe/...")
 *
 * The registered handler gives such programs the kprobe program type (as SEC("uprobe")) and
 * USERBPF_F_WRITABLE_ARGS in their prog_flags, which `userbpf load` takes as the section's
 * opt-in; the kernel refuses the flag (EINVAL), as it refuses argument writes. Auto-attach
 * parses the section as libbpf parses SEC("uprobe/..."): PATH (a bare library name is looked
 * up as libbpf looks it up), FUNC, an optional +OFFSET; a bare SEC("uprobe.w") is not
 * auto-attached (attach it with bpf_program__attach_uprobe_opts()).
 *
 * bpf_override_return() needs nothing of this: it is a helper (id 58) of SEC("uprobe") and
 * SEC("uretprobe") programs.
 */
#ifndef USERBPF_LIBBPF_H
#define USERBPF_LIBBPF_H

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <bpf/libbpf.h>

/* The prog_flags bit of BPF_PROG_LOAD asking userbpf for writable arguments. */
#define USERBPF_F_WRITABLE_ARGS (1U << 30)

/* The section prefix (libbpf's "+" form: SEC("uprobe.w") or SEC("uprobe.w/...")). */
#define USERBPF_WRITABLE_ARGS_SEC "uprobe.w+"

static int userbpf__uprobe_w_setup(struct bpf_program *prog, long cookie)
{
	(void)cookie;
	return bpf_program__set_flags(prog, bpf_program__flags(prog) | USERBPF_F_WRITABLE_ARGS);
}

static int userbpf__uprobe_w_attach(const struct bpf_program *prog, long cookie, struct bpf_link **link)
{
	const char *sec = bpf_program__section_name(prog);
	const char *spec = strchr(sec, '/');
	char *path, *func, *plus, *end;
	unsigned long offset = 0;
	int err = 0;

	(void)cookie;
	*link = NULL;
	if (!spec)
		return 0; /* SEC("uprobe.w"): no target, no auto-attach */
	path = strdup(spec + 1);
	if (!path)
		return -ENOMEM;
	func = strchr(path, ':');
	if (!func || func == path || !func[1]) {
		free(path);
		return -EINVAL; /* expected SEC("uprobe.w/PATH:FUNC[+OFFSET]") */
	}
	*func++ = '\0';
	plus = strrchr(func, '+');
	if (plus) {
		*plus = '\0';
		errno = 0;
		offset = strtoul(plus + 1, &end, 0);
		if (errno || end == plus + 1 || *end) {
			free(path);
			return -EINVAL;
		}
	}
	{
		LIBBPF_OPTS(bpf_uprobe_opts, opts, .retprobe = false);
		struct bpf_link *l;
		/* A number alone names an offset in the file, as in libbpf's SEC("uprobe/PATH:0x...") */
		if (*func >= '0' && *func <= '9') {
			offset += strtoul(func, &end, 0);
			if (*end) {
				free(path);
				return -EINVAL;
			}
		} else {
			opts.func_name = func;
		}
		l = bpf_program__attach_uprobe_opts(prog, -1, path, offset, &opts);
		err = libbpf_get_error(l);
		if (!err)
			*link = l;
	}
	free(path);
	return err;
}

/*
 * Registers SEC("uprobe.w/...") with libbpf; call it once, before opening the object. Returns
 * libbpf's handler id (>= 0) or a negative error.
 */
static inline int userbpf_libbpf_register(void)
{
	LIBBPF_OPTS(libbpf_prog_handler_opts, opts, .prog_setup_fn = userbpf__uprobe_w_setup,
		    .prog_attach_fn = userbpf__uprobe_w_attach);
	return libbpf_register_prog_handler(USERBPF_WRITABLE_ARGS_SEC, BPF_PROG_TYPE_KPROBE, 0, &opts);
}

#endif /* USERBPF_LIBBPF_H */
