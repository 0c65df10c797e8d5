// A target for gethostlatency: resolves "localhost" with getaddrinfo, gethostbyname and
// gethostbyname2 a fixed number of times. Same protocol as bt_target.c ("ready PID", "fn NAME
// ADDR" lines, "end", a line on stdin to start, "done", stdin closed to exit).
#define _GNU_SOURCE
#include <netdb.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define ROUNDS 3

int main(void)
{
	char line[64], host[32];
	int ok = 0;

	setvbuf(stdout, NULL, _IOLBF, 0);
	printf("ready %d\n", (int)getpid());
	printf("fn getaddrinfo %p\nfn gethostbyname %p\nfn gethostbyname2 %p\nend\n", (void *)getaddrinfo, (void *)gethostbyname,
	       (void *)gethostbyname2);
	if (!fgets(line, sizeof(line), stdin))
		return 1;
	// The name is written here, on the stack: resident when a probe reads it.
	strcpy(host, "localhost");
	for (int i = 0; i < ROUNDS; i++) {
		struct addrinfo hints, *res;
		memset(&hints, 0, sizeof(hints));
		hints.ai_family = AF_INET;
		if (getaddrinfo(host, NULL, &hints, &res) == 0) {
			ok++;
			freeaddrinfo(res);
		}
		if (gethostbyname(host))
			ok++;
		if (gethostbyname2(host, AF_INET))
			ok++;
	}
	printf("done %d\n", ok);
	while (fgets(line, sizeof(line), stdin))
		;
	return 0;
}
