/* Shared by userbpf-demo.bpf.c and userbpf-demo.c: the events the programs send. */
#ifndef USERBPF_DEMO_H
#define USERBPF_DEMO_H

#define NAME_LEN 32

/* Sent through the ring buffer at each call of the probed function. */
struct call_event {
	unsigned int pid;
	unsigned int seq;
	long long arg1;
	unsigned long long arg2;
	char comm[16];
	char name[NAME_LEN];
};

/* Sent through the perf buffer at each return. */
struct ret_event {
	unsigned int pid;
	unsigned int seq;
	long long ret;
};

#endif
