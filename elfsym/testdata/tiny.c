/* Source of tiny.elf, the fuzz seed: a few functions, an alias, a weak
 * symbol, an IFUNC and a local, in as few bytes as gcc can make. Rebuild:
 * gcc -Os -nostdlib -static -fno-asynchronous-unwind-tables -Wl,--build-id=none -Wl,-z,norelro -Wl,-z,noseparate-code -Wl,--hash-style=gnu -o tiny.elf tiny.c */
int f1(int x) { return x + 1; }
int f2(int x) __attribute__((alias("f1")));
__attribute__((weak)) int w(int x) { return x * 2; }
static int local(int x) { return x - 1; }
static int impl(int x) { return x; }
static int (*res(void))(int) { return impl; }
int ifn(int x) __attribute__((ifunc("res")));
void _start(void) { for (;;) local(f1(w(0))); }
