// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
//
// Counts calls per site: multiprobe gives every site a cookie, its index in
// Plan.Sites, which mp_cookie returns on every kernel.

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
int count_call(struct pt_regs *ctx)
{
	__u32 site = mp_cookie(ctx);
	__u64 *n = bpf_map_lookup_elem(&counts, &site);

	if (n)
		__sync_fetch_and_add(n, 1);
	return 0;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
