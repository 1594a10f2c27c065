// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
//
// The counter of package count (and `multiprobe count`): one 64-bit count
// per site, indexed by the site's BPF cookie, in an array that package
// count sizes before loading. The section is plain "uprobe" so that one
// object serves both attach paths; kernelprobe.PrepareProgramSpec sets the
// expected attach type before load.

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "mp_cookie.bpf.h"
#include "by.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1); // resized by package count
	__type(key, __u32);
	__type(value, __u64);
} counts SEC(".maps");

// With count.ByProcess or ByCgroup, each call is also counted by who made
// it (by.h), in by_counts, which package count sizes; a call that finds it
// full is in counts only.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1); // resized by package count, with By
	__type(key, struct by_key);
	__type(value, __u64);
} by_counts SEC(".maps");

SEC("uprobe")
int count_call(void *ctx)
{
	// The BPF cookie, or without cookies (before 5.15) the value multiprobe
	// stored under the probed address.
	__u32 key = (__u32)mp_cookie(ctx);
	__u64 *n = bpf_map_lookup_elem(&counts, &key);

	if (n)
		__sync_fetch_and_add(n, 1);
	if (by == BY_NONE)
		return 0;

	struct by_key bk = {.key = key, .who = by_who()};
	n = bpf_map_lookup_elem(&by_counts, &bk);
	if (n) {
		__sync_fetch_and_add(n, 1);
		return 0;
	}
	__u64 one = 1;
	// Another CPU may have made the entry meanwhile: then add to it.
	if (bpf_map_update_elem(&by_counts, &bk, &one, BPF_NOEXIST) != 0) {
		n = bpf_map_lookup_elem(&by_counts, &bk);
		if (n)
			__sync_fetch_and_add(n, 1);
	}
	return 0;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
