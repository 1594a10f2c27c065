// The agent test's library: work(us) takes at least us microseconds.
#include <time.h>

__attribute__((noinline)) void work(long us)
{
	struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
	nanosleep(&ts, 0);
}
