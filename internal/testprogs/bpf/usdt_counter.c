// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
//
// USDT test program: per site (indexed by the user's cookie, which
// multiprobe sets to the site's index) the hits, the argument count seen,
// and the sums of the first two arguments as bpf/usdt.bpf.h reads them, so
// a test can check every argument value through aggregates. Section
// "uprobe": kernelprobe.PrepareCollectionSpec chooses the attach type.

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "mp_usdt.bpf.h"

#define MAX_SITES 4096

#define SITE_ARRAY(name)                      \
	struct {                                  \
		__uint(type, BPF_MAP_TYPE_ARRAY);     \
		__uint(max_entries, MAX_SITES);       \
		__type(key, __u32);                   \
		__type(value, __s64);                 \
	} name SEC(".maps")

SITE_ARRAY(usdt_hits);
SITE_ARRAY(usdt_argc);
SITE_ARRAY(usdt_sum0);
SITE_ARRAY(usdt_sum1);

static __always_inline void add(void *map, __u32 key, __s64 v)
{
	__s64 *p = bpf_map_lookup_elem(map, &key);

	if (p)
		__sync_fetch_and_add(p, v);
}

SEC("uprobe")
int count_usdt(struct pt_regs *ctx)
{
	__u32 key = mp_usdt_cookie(ctx);
	long a0 = 0, a1 = 0;

	add(&usdt_hits, key, 1);
	add(&usdt_argc, key, mp_usdt_arg_cnt(ctx));
	if (mp_usdt_arg(ctx, 0, &a0) == 0)
		add(&usdt_sum0, key, a0);
	if (mp_usdt_arg(ctx, 1, &a1) == 0)
		add(&usdt_sum1, key, a1);
	return 0;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
