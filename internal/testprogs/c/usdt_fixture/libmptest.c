// A shared library with a probe, attached by path with no pid.
#include <sys/sdt.h>

#include "libmptest.h"

__attribute__((noinline)) void lib_fire(int a, long b)
{
	STAP_PROBE2(mptestlib, libprobe, a, b);
}
