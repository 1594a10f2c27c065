// A container's workload for the watch's tests: `mallocs N US` calls
// malloc N times from the moment it starts, call k at US*k microseconds
// after the first (an absolute schedule: no call is early), then prints
// "calls N first NS" (the first call's CLOCK_MONOTONIC time) with
// write(2) and exits. Nothing else here calls malloc: stdio would, for its
// buffer, so the count a probe on malloc sees is exactly N. With -wait it
// first prints "ready" and waits for a line, so a test can read its maps.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void *volatile sink;

static void say(const char *s)
{
	if (write(1, s, strlen(s)) < 0)
		_exit(2);
}

int main(int argc, char **argv)
{
	char line[64];
	int a = 1;

	if (argc > 1 && strcmp(argv[1], "-wait") == 0) {
		say("ready\n");
		if (read(0, line, sizeof(line)) < 0)
			return 2;
		a++;
	}
	if (argc != a + 2) {
		say("usage: mallocs [-wait] N US\n");
		return 2;
	}
	long n = atol(argv[a]), us = atol(argv[a + 1]);
	struct timespec first, at;
	clock_gettime(CLOCK_MONOTONIC, &first);
	for (long k = 0; k < n; k++) {
		long long ns = first.tv_nsec + (long long)k * us * 1000;
		at.tv_sec = first.tv_sec + ns / 1000000000;
		at.tv_nsec = ns % 1000000000;
		clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &at, NULL);
		sink = malloc(24);
		free(sink);
	}
	// snprintf into a buffer allocates nothing for these conversions.
	char out[80];
	int len = snprintf(out, sizeof(out), "calls %ld first %lld\n", n,
			   first.tv_sec * 1000000000LL + first.tv_nsec);
	return write(1, out, len) == len ? 0 : 2;
}
