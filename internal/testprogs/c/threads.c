// A multi-threaded target: `threads [-wait] NTHREADS CALLS` starts NTHREADS
// threads that each call mt_func CALLS times, then prints "done". With
// -wait it first prints "ready" and waits for a line on stdin, so that a
// test can attach to, and filter on, the running process.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_THREADS 64

__attribute__((noipa, used)) unsigned long mt_func(unsigned long x)
{
	return x * 3 + 1;
}

static long calls;
static unsigned long sums[MAX_THREADS];

static void *worker(void *arg)
{
	unsigned long *sum = arg;

	for (long i = 0; i < calls; i++)
		*sum += mt_func(i);
	return NULL;
}

int main(int argc, char **argv)
{
	int wait = 0, a = 1;
	pthread_t t[MAX_THREADS];

	if (argc > 1 && strcmp(argv[1], "-wait") == 0) {
		wait = 1;
		a++;
	}
	if (argc != a + 2) {
		fprintf(stderr, "usage: %s [-wait] NTHREADS CALLS\n", argv[0]);
		return 2;
	}
	long n = atol(argv[a]);
	calls = atol(argv[a + 1]);
	if (n < 1 || n > MAX_THREADS || calls < 0) {
		fprintf(stderr, "%s: bad NTHREADS or CALLS\n", argv[0]);
		return 2;
	}
	if (wait) {
		char line[64];
		printf("ready\n");
		fflush(stdout);
		if (fgets(line, sizeof line, stdin) == NULL && ferror(stdin))
			return 3;
	}
	for (long i = 0; i < n; i++)
		if (pthread_create(&t[i], NULL, worker, &sums[i]) != 0)
			return 4;
	for (long i = 0; i < n; i++)
		pthread_join(t[i], NULL);
	printf("done\n");
	return 0;
}
