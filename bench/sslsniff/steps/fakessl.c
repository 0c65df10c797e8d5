// A stand-in libssl.so.3 for steps.sh: SSL_read and SSL_write as sslsniff-bpfcc finds them
// (exported, the OpenSSL signatures), doing nothing but what a caller can see (SSL_read puts
// a byte in the buffer, both return the length), so that what a stepped call costs is the
// probes' work alone.
__attribute__((noinline)) int SSL_read(void *ssl, void *buf, int num)
{
	(void)ssl;
	if (num > 0)
		((char *)buf)[0] = 'G';
	__asm__ volatile("" ::: "memory");
	return num;
}

__attribute__((noinline)) int SSL_write(void *ssl, const void *buf, int num)
{
	(void)ssl;
	(void)buf;
	__asm__ volatile("" ::: "memory");
	return num;
}

int SSL_do_handshake(void *ssl)
{
	(void)ssl;
	return 1;
}

// The same as SSL_read and SSL_write under names no probe takes: sslloop.c's unprobed rounds.
__attribute__((noinline)) int plain_read(void *ssl, void *buf, int num)
{
	(void)ssl;
	if (num > 0)
		((char *)buf)[0] = 'G';
	__asm__ volatile("" ::: "memory");
	return num;
}

__attribute__((noinline)) int plain_write(void *ssl, const void *buf, int num)
{
	(void)ssl;
	(void)buf;
	__asm__ volatile("" ::: "memory");
	return num;
}
