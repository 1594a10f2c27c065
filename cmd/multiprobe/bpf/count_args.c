// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
//
// The counter behind `multiprobe count --args`: counts per site like
// count.c and sends every hit's USDT arguments, read with
// bpf/usdt.bpf.h, to user space through a ring buffer. A uprobe site has
// no argument spec and reports no arguments.

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "mp_usdt.bpf.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1); // resized by the CLI
	__type(key, __u32);
	__type(value, __u64);
} counts SEC(".maps");

struct hit {
	__u32 site;
	__s32 argc;
	__s64 args[MP_USDT_MAX_ARGS];
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 22);
} hits SEC(".maps");

// Hits that did not fit in the ring buffer.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} dropped SEC(".maps");

SEC("uprobe")
int count_args(struct pt_regs *ctx)
{
	__u32 key = mp_usdt_cookie(ctx), zero = 0;
	__u64 *n = bpf_map_lookup_elem(&counts, &key);
	struct hit *h;

	if (n)
		__sync_fetch_and_add(n, 1);
	h = bpf_ringbuf_reserve(&hits, sizeof(*h), 0);
	if (!h) {
		n = bpf_map_lookup_elem(&dropped, &zero);
		if (n)
			__sync_fetch_and_add(n, 1);
		return 0;
	}
	h->site = key;
	h->argc = mp_usdt_arg_cnt(ctx);
	for (int i = 0; i < MP_USDT_MAX_ARGS; i++) {
		long v = 0;

		mp_usdt_arg(ctx, i, &v);
		h->args[i] = v;
	}
	bpf_ringbuf_submit(h, 0);
	return 0;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
