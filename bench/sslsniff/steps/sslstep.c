// The target of steps.sh: waits until SSL_read and SSL_write are patched (when waiting is
// asked), makes 200,000 read+write pairs of nginx's sizes (a 100-byte request read, a
// 612-byte response written), waits for a tracer, then stops itself (SIGSTOP), makes one pair
// and stops again: the tracer single-steps everything in between.
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../uprobe/steps/stepped.h"

int SSL_read(void *ssl, void *buf, int num);
int SSL_write(void *ssl, const void *buf, int num);

int main(int argc, char **argv)
{
	static char req[100], resp[612];
	int wait = argc > 1 && atoi(argv[1]);
	volatile unsigned char *r = (volatile unsigned char *)(void *)SSL_read;
	volatile unsigned char *w = (volatile unsigned char *)(void *)SSL_write;
	memset(req, 'r', sizeof req);
	memset(resp, 'x', sizeof resp);
	while (wait && (r[0] != 0xe9 || w[0] != 0xe9))
		usleep(1000);
	for (long i = 0; i < 200000; i++) {
		SSL_read(NULL, req, sizeof req);
		SSL_write(NULL, resp, sizeof resp);
	}
	stop_for_tracer();
	SSL_read(NULL, req, sizeof req);
	SSL_write(NULL, resp, sizeof resp);
	raise(SIGSTOP);
	return 0;
}
