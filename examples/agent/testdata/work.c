// The agent test's workload: `work N US` calls libwork's work(US) N times,
// and idle and rest once after each.
#include <stdlib.h>

void work(long us);
long idle(long x);
long rest(long x);

int main(int argc, char **argv)
{
	if (argc != 3)
		return 2;
	long n = atol(argv[1]), us = atol(argv[2]);
	for (long i = 0; i < n; i++) {
		work(us);
		idle(i);
		rest(i);
	}
	return 0;
}
