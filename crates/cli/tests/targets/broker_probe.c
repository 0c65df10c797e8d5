// Asks a session's broker (userbpf_runtime::session::broker) for admission, as a process of
// the droproot tests: finds the servers whose abstract name starts with PREFIX in
// /proc/net/unix, sends the hello with SECRET (64 hex digits) and prints "admitted" when one
// answers 0, "refused" when every one closed the connection or refused, "none" when no server
// listens. With --orphan the asking is done by a forked child, whose parent (this process) is
// no session member.
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

static int ask(const char *prefix, const unsigned char *secret)
{
	FILE *f = fopen("/proc/net/unix", "r");
	char line[512];
	int servers = 0, admitted = 0;
	if (!f)
		return 2;
	while (fgets(line, sizeof(line), f)) {
		char *name = strrchr(line, ' ');
		if (!name || name[1] != '@' || strncmp(name + 2, prefix, strlen(prefix)) != 0)
			continue;
		name += 2;
		name[strcspn(name, "\n")] = 0;
		servers++;
		int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
		struct sockaddr_un a = { .sun_family = AF_UNIX };
		size_t n = strlen(name);
		memcpy(a.sun_path + 1, name, n);
		if (connect(s, (struct sockaddr *)&a, sizeof(sa_family_t) + 1 + n) != 0) {
			close(s);
			continue;
		}
		unsigned char hello[33] = { 'H' };
		memcpy(hello + 1, secret, 32);
		unsigned char reply[8];
		if (send(s, hello, sizeof(hello), MSG_NOSIGNAL) == sizeof(hello) &&
		    recv(s, reply, sizeof(reply), 0) == 4 && reply[0] == 0 && reply[1] == 0 && reply[2] == 0 && reply[3] == 0)
			admitted = 1;
		close(s);
	}
	fclose(f);
	puts(servers == 0 ? "none" : admitted ? "admitted" : "refused");
	fflush(stdout);
	return 0;
}

int main(int argc, char **argv)
{
	int orphan = argc > 1 && strcmp(argv[1], "--orphan") == 0;
	unsigned char secret[32];
	if (argc != 3 + orphan || strlen(argv[2 + orphan]) != 64) {
		fprintf(stderr, "usage: broker_probe [--orphan] PREFIX SECRETHEX\n");
		return 2;
	}
	for (int i = 0; i < 32; i++)
		sscanf(argv[2 + orphan] + 2 * i, "%2hhx", &secret[i]);
	if (!orphan)
		return ask(argv[1], secret);
	pid_t c = fork();
	if (c == 0)
		_exit(ask(argv[2], secret));
	int st = 0;
	waitpid(c, &st, 0);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 3;
}
