// The agent test's library: work(us) takes at least us microseconds;
// idle and rest, which the workload calls after each work, return at once.
#include <time.h>

__attribute__((noinline)) void work(long us)
{
	struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
	nanosleep(&ts, 0);
}

__attribute__((noinline)) long idle(long x)
{
	__asm__ volatile("" : "+r"(x));
	return x;
}

__attribute__((noinline)) long rest(long x)
{
	__asm__ volatile("" : "+r"(x));
	return x + 1;
}
