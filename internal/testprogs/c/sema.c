// A target driven over stdin, one command a line:
//
//	c N   call fn0 N times, fn1 N+1 times, fn2 N+2 times; print "ok"
//	v     print the two semaphores, "SEMA SEMA2"
//	q     exit
//
// It prints "ready" first. The semaphores live in a writable, file-backed
// section, as <sys/sdt.h> puts them, so the kernel can use them as
// ref counters.
#include <stdio.h>

unsigned short mp_sema __attribute__((used, section(".probes")));
unsigned short mp_sema2 __attribute__((used, section(".probes")));

__attribute__((noipa, used)) int fn0(int x) { return x + 1; }
__attribute__((noipa, used)) int fn1(int x) { return x + 2; }
__attribute__((noipa, used)) int fn2(int x) { return x + 3; }

int main(void)
{
	char line[64];
	int n, sum = 0;

	printf("ready\n");
	fflush(stdout);
	while (fgets(line, sizeof line, stdin)) {
		switch (line[0]) {
		case 'c':
			if (sscanf(line + 1, "%d", &n) != 1)
				return 2;
			for (int i = 0; i < n; i++)
				sum += fn0(i);
			for (int i = 0; i < n + 1; i++)
				sum += fn1(i);
			for (int i = 0; i < n + 2; i++)
				sum += fn2(i);
			printf("ok\n");
			break;
		case 'v':
			printf("%u %u\n", *(volatile unsigned short *)&mp_sema, *(volatile unsigned short *)&mp_sema2);
			break;
		case 'q':
			return sum == -1;
		}
		fflush(stdout);
	}
	return 0;
}
