// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
//
// The program of ExamplePlan_Attach: count calls per site. multiprobe
// gives every site a cookie, its index in Plan.Sites, which mp_cookie
// returns on every kernel (from a per-site constant before Linux 5.15).
// The pid filter needs nothing here: each Link that filters loads its own
// filtered copy of the program.

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "mp_cookie.bpf.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1); /* sized to the plan's sites before loading */
	__type(key, __u32);
	__type(value, __u64);
} counts SEC(".maps");

SEC("uprobe")
int count_calls(struct pt_regs *ctx)
{
	__u32 site = mp_cookie(ctx);
	__u64 *n = bpf_map_lookup_elem(&counts, &site);

	if (n)
		__sync_fetch_and_add(n, 1);
	return 0;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
