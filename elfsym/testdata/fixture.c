/* Fixture for elfsym's tests: aliases, weak symbols, an IFUNC, local
 * functions, and a mode that waits so the test can read the mapped image. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline, used))

NOINLINE int real_func(int x) { return x + 1; }
int alias_func(int x) __attribute__((alias("real_func")));
int weak_alias(int x) __attribute__((weak, alias("real_func")));

__attribute__((weak)) NOINLINE int weak_only(int x) { return x * 2; }

static NOINLINE int local_func(int x) { return x - 1; }

/* A weak global and, in dup_b.c, a static of the same name: an exact
 * lookup takes the strong one. */
__attribute__((weak)) NOINLINE int wdup(int x) { return x * 3; }

static int impl_plain(int x) { return x + 7; }
static int (*resolve_picked(void))(int) { return impl_plain; }
int picked(int x) __attribute__((ifunc("resolve_picked")));

NOINLINE int func_alpha(int x) { return x + 10; }
NOINLINE int func_beta(int x) { return x + 20; }
NOINLINE int func_gamma(int x) { return x + 30; }
NOINLINE int sh_get_var(int x) { return x; }
NOINLINE int sh_set_var(int x) { return -x; }

int dup_a_call(int);
int dup_b_call(int);
int wdup_b_call(int);

int main(int argc, char **argv) {
	if (argc > 1 && strcmp(argv[1], "wait") == 0) {
		printf("ready\n");
		fflush(stdout);
		pause();
	}
	return real_func(argc) + local_func(argc) + weak_only(argc) + picked(argc) +
	       wdup(argc) + func_alpha(argc) + func_beta(argc) + func_gamma(argc) +
	       sh_get_var(argc) + sh_set_var(argc) + dup_a_call(argc) +
	       dup_b_call(argc) + wdup_b_call(argc);
}
