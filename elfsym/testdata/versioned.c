/* A shared library with one symbol in two versions, bound by .symver. */
__attribute__((noinline, used)) int vfunc_v1(int x) { return x + 1; }
__attribute__((noinline, used)) int vfunc_v2(int x) { return x + 2; }
__asm__(".symver vfunc_v1, vfunc@VERS_1");
__asm__(".symver vfunc_v2, vfunc@@VERS_2");

/* A function with only a compat version, as glibc keeps fattach@GLIBC_2.2.5
 * for old binaries: no default version of it. */
__attribute__((noinline, used)) int ofunc_impl(int x) { return x + 3; }
__asm__(".symver ofunc_impl, ofunc@VERS_1");

__attribute__((noinline)) int lib_func(int x) { return x * 5; }
int lib_alias(int x) __attribute__((alias("lib_func")));
