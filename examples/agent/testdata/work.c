// The agent test's workload: `work N US` calls libwork's work(US) N times,
// and idle and rest once after each. `work N US wait` makes them at each
// SIGUSR1, until killed: a container's workload, which the test tells
// when to call (once the agent attached its library).
#include <signal.h>
#include <stdlib.h>
#include <string.h>

void work(long us);
long idle(long x);
long rest(long x);

static void calls(long n, long us)
{
	for (long i = 0; i < n; i++) {
		work(us);
		idle(i);
		rest(i);
	}
}

int main(int argc, char **argv)
{
	if (argc != 3 && !(argc == 4 && strcmp(argv[3], "wait") == 0))
		return 2;
	long n = atol(argv[1]), us = atol(argv[2]);
	if (argc == 3) {
		calls(n, us);
		return 0;
	}
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGUSR1);
	sigprocmask(SIG_BLOCK, &set, 0);
	for (;;) {
		int sig;
		sigwait(&set, &sig);
		calls(n, us);
	}
}
