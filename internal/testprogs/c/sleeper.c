// A target whose functions take known times, for latency histograms:
// `sleeper N` calls each function N times, then prints "done". A duration
// in [2^i, 2^(i+1)) ns falls in slot i of a log2 histogram; the times sit
// well inside their slots. The functions spin on the monotonic clock
// rather than sleep: a guest kernel's timers can be coarse (a 3 ms
// nanosleep took 8 to 16 ms in the 6.1 test VM), and a spin never ends
// early and ends late only when the thread is preempted:
//
//	nap_3ms      3 ms, slot 21 ([2.10 ms, 4.19 ms))
//	nap_12ms    12 ms, slot 23 ([8.39 ms, 16.8 ms))
//	no_nap       no spin: the probes' own cost, far below 1 ms
//	nap_nested   calls itself twice (3 frames in flight), the innermost
//	             spins 3 ms: each of the 3 calls takes about 3 ms
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static long long now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void nap(long us)
{
	long long end = now_ns() + us * 1000LL;

	while (now_ns() < end)
		;
}

__attribute__((noipa, used)) int nap_3ms(int x)
{
	nap(3000);
	return x + 1;
}

__attribute__((noipa, used)) int nap_12ms(int x)
{
	nap(12000);
	return x + 2;
}

__attribute__((noipa, used)) int no_nap(int x)
{
	return x * 3;
}

// Not a tail call (the + 1), so that every frame returns through its own
// return probe.
__attribute__((noipa, used)) int nap_nested(int depth)
{
	if (depth == 0) {
		nap(3000);
		return 0;
	}
	return nap_nested(depth - 1) + 1;
}

int main(int argc, char **argv)
{
	int n, sum = 0;

	if (argc != 2) {
		fprintf(stderr, "usage: %s CALLS\n", argv[0]);
		return 2;
	}
	n = atoi(argv[1]);
	for (int i = 0; i < n; i++)
		sum += nap_3ms(i) + nap_12ms(i) + no_nap(i) + nap_nested(2);
	printf("done %d\n", sum);
	return 0;
}
