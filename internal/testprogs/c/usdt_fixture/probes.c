// Target for the usdt tests. Every probe passes values the Go tests know
// (see expectations in probes_test.go); volatile loads keep the compiler
// from folding them into constants, except where constants are the point.
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/sdt.h>

#include "libmptest.h"

volatile int8_t v_s8 = -5;
volatile uint8_t v_u8 = 200;
volatile int16_t v_s16 = -30000;
volatile uint16_t v_u16 = 60000;
volatile int32_t v_s32 = -2000000000;
volatile uint32_t v_u32 = 4000000000u;
volatile int64_t v_s64 = -9000000000000000000ll;
volatile uint64_t v_u64 = 18000000000000000000ull;

// A global passed as is: GCC may name it in the argument string
// ("-4@global_counter(%rip)").
int global_counter = -77;

int array[16] = {10, -11, 12, -13, 14, -15, 16, -17, 18, -19, 20, -21, 22, -23, 24, -25};

__attribute__((noinline)) void fire_sizes(void)
{
	int8_t a = v_s8;
	uint8_t b = v_u8;
	int16_t c = v_s16;
	uint16_t d = v_u16;
	int32_t e = v_s32;
	uint32_t f = v_u32;
	int64_t g = v_s64;
	uint64_t h = v_u64;
	STAP_PROBE8(mptest, sizes, a, b, c, d, e, f, g, h);
}

__attribute__((noinline)) void fire_consts(void)
{
	STAP_PROBE8(mptest, consts, (int8_t)-5, (uint8_t)200, (int16_t)-30000, (uint16_t)60000,
		    (int32_t)-2000000000, (uint32_t)4000000000u, (int64_t)-9000000000000000000ll,
		    (uint64_t)18000000000000000000ull);
}

// Twelve arguments: more than there are free registers, so at -O2 some
// are memory operands relative to %rsp.
__attribute__((noinline)) void fire_twelve(void)
{
	int64_t x[12];
	for (int i = 0; i < 12; i++)
		x[i] = v_s64 / (i + 1) + i;
	STAP_PROBE12(mptest, twelve, x[0], x[1], x[2], x[3], x[4], x[5], x[6], x[7], x[8], x[9], x[10],
		     x[11]);
}

struct point {
	long x;
	int y;
	short z;
};

// A field of a struct behind a pointer: a memory operand off(%reg).
__attribute__((noinline)) void fire_struct(struct point *p)
{
	STAP_PROBE3(mptest, structp, p->x, p->y, p->z);
}

// An array element indexed by a runtime value: at -O2, a SIB operand
// (%base,%index,4).
__attribute__((noinline)) void fire_sib(const int *arr, long i)
{
	STAP_PROBE2(mptest, sib, arr[i], i);
}

__attribute__((noinline)) void fire_global(void)
{
	STAP_PROBE1(mptest, global, global_counter);
}

volatile int inline_seq;

// One probe, inlined at INLINE_SITES call sites.
static inline __attribute__((always_inline)) void hit(void)
{
	int v = inline_seq;
	STAP_PROBE1(mptest, inlined, v);
	inline_seq = v + 1;
}

#define H10 hit(); hit(); hit(); hit(); hit(); hit(); hit(); hit(); hit(); hit();
#define H100 H10 H10 H10 H10 H10 H10 H10 H10 H10 H10

__attribute__((noinline)) void fire_inlined(void)
{
	H100 H100 H100
}

void fire_sema(int);
unsigned short sema_value(void);
const void *sema_address(void);

int main(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "wait") == 0) {
		// Semaphore proof: report the semaphore's address, then on each
		// line from stdin fire the probe (if enabled) and report the
		// semaphore's value. Replying after firing lets the test detach
		// as soon as it has the reply.
		printf("%p\n", sema_address());
		fflush(stdout);
		char line[64];
		while (fgets(line, sizeof(line), stdin)) {
			unsigned v = sema_value();
			fire_sema(7);
			printf("%u\n", v);
			fflush(stdout);
		}
		return 0;
	}
	struct point pt = {.x = -123456789012345l, .y = -42, .z = 999};
	fire_sizes();
	fire_consts();
	fire_twelve();
	fire_struct(&pt);
	for (long i = 0; i < 16; i += 5)
		fire_sib(array, i);
	fire_global();
	fire_inlined();
	fire_sema(7);
	lib_fire(-1234567, 0xdeadbeefcafe);
	return 0;
}
