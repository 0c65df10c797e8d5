// What a target of stepper.c does around the stepped code: waits until a tracer is attached,
// then stops itself (SIGSTOP) before and after the code the tracer counts.
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int traced(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char l[256];
	int t = 0;
	while (f && fgets(l, sizeof l, f))
		if (!strncmp(l, "TracerPid:", 10))
			t = atoi(l + 10);
	if (f)
		fclose(f);
	return t != 0;
}

// Says "ready PID" on stderr (steps.sh waits for it), waits for the tracer, then stops.
static void stop_for_tracer(void)
{
	fprintf(stderr, "ready %d\n", getpid());
	while (!traced())
		usleep(1000);
	raise(SIGSTOP);
}
