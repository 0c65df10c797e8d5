// stepper PID [IPS MAPS [STATES]]: attaches to PID (stepme), waits for its first SIGSTOP,
// single-steps it to its second and prints how many instructions it ran in between. With IPS
// and MAPS, also writes the address of every instruction stepped (hex, one a line) to IPS and
// the target's /proc/PID/maps at the first stop to MAPS (bench/sslsniff/steps attributes
// them). With STATES, also each instruction's registers before it ran and its first 16 bytes
// (a `struct user_regs_struct` then 16 bytes, one record a step), from which the data-pages
// tool of bench/ computes the memory each instruction reached.
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ptrace.h>
#include <sys/user.h>
#include <sys/wait.h>

int main(int argc, char **argv)
{
	if (argc != 2 && argc != 4 && argc != 5)
		return 2;
	int pid = atoi(argv[1]), st;
	FILE *ips = NULL, *states = NULL;
	long n = 0;
	if (ptrace(PTRACE_SEIZE, pid, 0, 0)) {
		perror("PTRACE_SEIZE");
		return 1;
	}
	for (;;) {
		if (waitpid(pid, &st, 0) < 0 || !WIFSTOPPED(st)) {
			perror("waitpid");
			return 1;
		}
		if (WSTOPSIG(st) == SIGSTOP)
			break;
		ptrace(PTRACE_CONT, pid, 0, WSTOPSIG(st));
	}
	if (argc == 5 && !(states = fopen(argv[4], "wb"))) {
		perror("stepper: STATES");
		return 1;
	}
	if (argc >= 4) {
		char path[64], line[512];
		snprintf(path, sizeof path, "/proc/%d/maps", pid);
		FILE *in = fopen(path, "r"), *out = fopen(argv[3], "w");
		ips = fopen(argv[2], "w");
		if (!in || !out || !ips) {
			perror("stepper: maps or IPS");
			return 1;
		}
		while (fgets(line, sizeof line, in))
			fputs(line, out);
		fclose(in);
		fclose(out);
	}
	for (;;) {
		if (ips) {
			struct user_regs_struct r;
			ptrace(PTRACE_GETREGS, pid, 0, &r);
			fprintf(ips, "%llx\n", r.rip);
			if (states) {
				long code[2];
				for (int k = 0; k < 2; k++)
					code[k] = ptrace(PTRACE_PEEKTEXT, pid, r.rip + 8 * k, 0);
				fwrite(&r, sizeof r, 1, states);
				fwrite(code, sizeof code, 1, states);
			}
		}
		ptrace(PTRACE_SINGLESTEP, pid, 0, 0);
		if (waitpid(pid, &st, 0) < 0 || !WIFSTOPPED(st)) {
			fprintf(stderr, "stepper: the target went away\n");
			return 1;
		}
		if (WSTOPSIG(st) != SIGTRAP)
			break;
		n++;
	}
	if (ips)
		fclose(ips);
	if (states)
		fclose(states);
	printf("%ld\n", n);
	ptrace(PTRACE_DETACH, pid, 0, 0);
	kill(pid, SIGCONT);
	return 0;
}
