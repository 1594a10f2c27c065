// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
//
// Test programs for multiprobe: each counts what happens at a probed site
// in arrays indexed by the site's BPF cookie, so a test can check every
// site separately. The section names are the plain "uprobe"/"uretprobe":
// the same object serves the uprobe_multi and the perf-event path, and
// kernelprobe.PrepareProgramSpec sets the expected attach type before load.

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "regs.h"
#include "mp_cookie.bpf.h"

// Cookies at or above MAX_SITES are counted in out_of_range instead.
#define MAX_SITES (1 << 18)

#define SITE_ARRAY(name, value_type)          \
	struct {                                  \
		__uint(type, BPF_MAP_TYPE_ARRAY);     \
		__uint(max_entries, MAX_SITES);       \
		__type(key, __u32);                   \
		__type(value, value_type);            \
	} name SEC(".maps")

// Entry probe: calls per site, and the process that made the last call.
SITE_ARRAY(counts, __u64);
SITE_ARRAY(last_pid, __u32);

// Return probe: returns per site, and the last return value.
SITE_ARRAY(ret_counts, __u64);
SITE_ARRAY(ret_values, __u64);

// Entry probe: calls per process (tgid), for pid-filter tests and for the
// watch's, which probe every process's libc.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, __u64);
} pid_counts SEC(".maps");

// Events whose cookie did not index the site arrays.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} out_of_range SEC(".maps");

static __always_inline int site_key(void *ctx, __u32 *key)
{
	// mp_cookie: the BPF cookie, or on kernels without cookies (before 5.15)
	// the one multiprobe stored under the probed address.
	__u64 cookie = mp_cookie(ctx);
	__u32 zero = 0;

	if (cookie >= MAX_SITES) {
		__u64 *bad = bpf_map_lookup_elem(&out_of_range, &zero);
		if (bad)
			__sync_fetch_and_add(bad, 1);
		return -1;
	}
	*key = (__u32)cookie;
	return 0;
}

SEC("uprobe")
int count_entry(void *ctx)
{
	__u32 key, pid = bpf_get_current_pid_tgid() >> 32;
	__u64 one = 1, *n;
	__u32 *last;

	if (site_key(ctx, &key))
		return 0;
	n = bpf_map_lookup_elem(&counts, &key);
	if (n)
		__sync_fetch_and_add(n, 1);
	last = bpf_map_lookup_elem(&last_pid, &key);
	if (last)
		*last = pid;
	n = bpf_map_lookup_elem(&pid_counts, &pid);
	if (n)
		__sync_fetch_and_add(n, 1);
	else
		bpf_map_update_elem(&pid_counts, &pid, &one, BPF_NOEXIST);
	return 0;
}

SEC("uretprobe")
int record_return(void *ctx)
{
	__u64 *n, *v;
	__u32 key;

	if (site_key(ctx, &key))
		return 0;
	n = bpf_map_lookup_elem(&ret_counts, &key);
	if (n)
		__sync_fetch_and_add(n, 1);
	v = bpf_map_lookup_elem(&ret_values, &key);
	if (v)
		*v = return_value(ctx);
	return 0;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
