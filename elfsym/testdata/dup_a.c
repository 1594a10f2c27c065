/* A static function named like one in dup_b.c: two LOCAL definitions. */
static __attribute__((noinline, used)) int dup(int x) { return x + 100; }
int dup_a_call(int x) { return dup(x); }
