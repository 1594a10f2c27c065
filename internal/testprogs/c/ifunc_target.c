// Target of the IFUNC tests: calls four of glibc's IFUNCs (strlen, strchr,
// memcpy, strstr) N times each through the PLT. It first prints the
// addresses the loader resolved them to (taking a function's address goes
// through the GOT, which holds the implementation), and with -wait waits
// for a line on stdin before the calls. glibc calls strstr (and, on arm64,
// memcpy) through no IRELATIVE slot of its own: only this program's GOT
// says what the loader chose for it.
//
//	ifunc_target [-wait] N
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char src[64] = "multiprobe resolves ifuncs";
static char dst[64];

int main(int argc, char **argv)
{
	int a = 1;
	if (argc > 1 && strcmp(argv[1], "-wait") == 0)
		a++;
	if (argc != a + 1) {
		fprintf(stderr, "usage: %s [-wait] N\n", argv[0]);
		return 2;
	}
	long n = atol(argv[a]);
	printf("%p %p %p %p\n", (void *)strlen, (void *)strchr, (void *)memcpy, (void *)strstr);
	fflush(stdout);
	if (a == 2) {
		char line[16];
		if (!fgets(line, sizeof line, stdin) && ferror(stdin))
			return 3;
	}
	size_t sum = 0;
	for (long i = 0; i < n; i++) {
		sum += strlen(src);
		sum += strchr(src, 'i') != NULL;
		memcpy(dst, src, sizeof src);
		sum += strstr(src, "ifunc") != NULL;
		src[0] ^= 1;
	}
	printf("done %zu\n", sum);
	return 0;
}
