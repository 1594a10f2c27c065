// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
//
// A uprobe session program (Linux 6.13+): one program runs at a site's entry
// and at its return. Kept apart from counter.c so that loading the counters
// never needs a kernel with sessions.

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "regs.h"

#define MAX_SITES (1 << 18)

extern int bpf_session_is_return(void) __ksym;

#define SITE_ARRAY(name)                      \
	struct {                                  \
		__uint(type, BPF_MAP_TYPE_ARRAY);     \
		__uint(max_entries, MAX_SITES);       \
		__type(key, __u32);                   \
		__type(value, __u64);                 \
	} name SEC(".maps")

SITE_ARRAY(session_entries);
SITE_ARRAY(session_returns);
SITE_ARRAY(session_values);

SEC("uprobe.session")
int count_session(void *ctx)
{
	__u64 cookie = bpf_get_attach_cookie(ctx), *n, *v;
	__u32 key;

	if (cookie >= MAX_SITES)
		return 0;
	key = (__u32)cookie;
	if (!bpf_session_is_return()) {
		n = bpf_map_lookup_elem(&session_entries, &key);
		if (n)
			__sync_fetch_and_add(n, 1);
		// 0 asks the kernel to run this program again at the return.
		return 0;
	}
	n = bpf_map_lookup_elem(&session_returns, &key);
	if (n)
		__sync_fetch_and_add(n, 1);
	v = bpf_map_lookup_elem(&session_values, &key);
	if (v)
		*v = return_value(ctx);
	return 0;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
