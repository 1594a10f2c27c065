// Probes with semaphores: <sys/sdt.h> names a semaphore for every probe of
// a translation unit built with _SDT_HAS_SEMAPHORES, so they live here.
#define _SDT_HAS_SEMAPHORES 1
#include <sys/sdt.h>

unsigned short mptest_sema_semaphore __attribute__((unused, section(".probes")));

__attribute__((noinline)) void fire_sema(int v)
{
	if (mptest_sema_semaphore)
		STAP_PROBE1(mptest, sema, v);
}

unsigned short sema_value(void)
{
	return *(volatile unsigned short *)&mptest_sema_semaphore;
}

const void *sema_address(void)
{
	return &mptest_sema_semaphore;
}
