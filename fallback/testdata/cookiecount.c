// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
//
// Counts calls per site by the cookie mp_cookie() gives, so the same test
// checks the BPF-cookie and the address-map path of bpf/cookie.bpf.h.

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "../../bpf/mp_cookie.bpf.h"

#define MAX_SITES 4096

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_SITES);
	__type(key, __u32);
	__type(value, __u64);
} cookie_counts SEC(".maps");

// Events whose cookie was missing (~0) or out of range.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} cookie_misses SEC(".maps");

SEC("uprobe")
int count_cookie(void *ctx)
{
	__u64 cookie = mp_cookie(ctx), *n;
	__u32 key = 0;

	if (cookie >= MAX_SITES) {
		n = bpf_map_lookup_elem(&cookie_misses, &key);
		if (n)
			__sync_fetch_and_add(n, 1);
		return 0;
	}
	key = cookie;
	n = bpf_map_lookup_elem(&cookie_counts, &key);
	if (n)
		__sync_fetch_and_add(n, 1);
	return 0;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
