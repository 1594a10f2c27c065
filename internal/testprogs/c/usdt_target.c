/* USDT target for multiprobe's tests: `usdt_target [-wait] N` fires
 *   mp:tick(i, -3*i)           N times, i = 0..N-1 (long, int)
 *   mp:guarded(i)              N times, only while its semaphore is set
 *   mp:inlined(i)              at 50 inlined call sites, once each per round
 *   mp:named(i, name)          N times, name "alpha", "beta", "gamma", ... in
 *                              turn (long, const char *), from named(i, name),
 *                              with name from name_of(i): C strings for --str
 * then prints "done GUARDED" with how many times the guarded probe fired,
 * through report(), a function called once after the wait for entry and
 * return probes.
 * With -wait it prints "ready" and waits for a line on stdin first. */
#define _SDT_HAS_SEMAPHORES 1
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sdt.h>

/* With _SDT_HAS_SEMAPHORES every probe of the file has a semaphore; only
 * mp:guarded's is tested before firing. */
#define SEMAPHORE(name) unsigned short mp_##name##_semaphore __attribute__((unused, section(".probes")))
SEMAPHORE(tick);
SEMAPHORE(guarded);
SEMAPHORE(inlined);
SEMAPHORE(named);

static const char *const names[] = {"alpha", "beta", "gamma"};

__attribute__((noipa)) const char *name_of(long i) { return names[i % 3]; }

__attribute__((noipa)) void named(long i, const char *name) { DTRACE_PROBE2(mp, named, i, name); }

static inline __attribute__((always_inline)) void inlined(long i) { DTRACE_PROBE1(mp, inlined, i); }

__attribute__((noipa)) void round_inlined(long i)
{
#define I5 inlined(i); inlined(i); inlined(i); inlined(i); inlined(i);
	I5 I5 I5 I5 I5 I5 I5 I5 I5 I5
}

__attribute__((noipa)) long report(long guarded)
{
	printf("done %ld\n", guarded);
	return guarded;
}

int main(int argc, char **argv)
{
	int a = 1;
	if (argc > 1 && strcmp(argv[1], "-wait") == 0) {
		char line[64];
		printf("ready\n");
		fflush(stdout);
		if (fgets(line, sizeof line, stdin) == NULL && ferror(stdin))
			return 3;
		a++;
	}
	if (argc != a + 1) {
		fprintf(stderr, "usage: %s [-wait] N\n", argv[0]);
		return 2;
	}
	long n = strtol(argv[a], NULL, 10), guarded = 0;
	for (long i = 0; i < n; i++) {
		int neg = (int)(-3 * i);
		DTRACE_PROBE2(mp, tick, i, neg);
		if (__builtin_expect(mp_guarded_semaphore, 0)) {
			DTRACE_PROBE1(mp, guarded, i);
			guarded++;
		}
		named(i, name_of(i));
	}
	round_inlined(n);
	report(guarded);
	return 0;
}
