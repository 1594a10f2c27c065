static __attribute__((noinline, used)) int dup(int x) { return x + 200; }
int dup_b_call(int x) { return dup(x); }
static __attribute__((noinline, used)) int wdup(int x) { return x + 300; }
int wdup_b_call(int x) { return wdup(x); }
