// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
//
// The agent's probe program: at a function's entry it counts the call and
// notes the time; at its return it adds the time since to the function's
// log2 histogram. Sites are found by their BPF cookie in the sites map,
// which the agent fills in as the watch attaches each file: a site not
// there yet is passed over. Functions are the agent's own numbering (a
// probe's function in every build of a library is one), so that the
// metrics add up over every copy on the node.
//
// counts, hists and the counts by cgroup are pinned by the agent: a
// restarted agent counts on where the last one stopped.

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "mp_cookie.bpf.h"

#define SLOTS 40 // slot i: [2^i, 2^(i+1)) ns; the last takes what is longer
#define MAX_FUNCS 4096

struct site {
	__u32 fn;
	__u8 is_return;
	__u8 pad;
	__u16 sp_gain; // at a return, what the stack pointer gained since the entry
};

struct hist {
	__u64 slots[SLOTS];
	__u64 sum_ns;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1 << 16);
	__type(key, __u64); // the site's cookie
	__type(value, struct site);
} sites SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_FUNCS);
	__type(key, __u32);
	__type(value, __u64);
} counts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_FUNCS);
	__type(key, __u32);
	__type(value, struct hist);
} hists SEC(".maps");

// The functions' names, by number, for the agent alone: pinned with the
// counts, so that a restarted agent numbers its functions as the last one
// did.
struct fn_name {
	char name[256]; // "probe\x00function"
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_FUNCS);
	__type(key, __u32);
	__type(value, struct fn_name);
} fn_names SEC(".maps");

// Calls by cgroup (a container's, on a node that runs containers) and
// function, beside the node's counts: at most MAX_CGROUP_FNS pairs; a call
// of a pair that finds the map full counts in other_counts[fn] instead,
// and in overflow[0], so the total stays exact and the loss of detail is
// seen.
#define MAX_CGROUP_FNS 16384

struct cgroup_fn {
	__u64 cgroup; // bpf_get_current_cgroup_id: the cgroup v2 directory's inode
	__u32 fn;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_CGROUP_FNS);
	__type(key, struct cgroup_fn);
	__type(value, __u64);
} cgroup_counts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_FUNCS);
	__type(key, __u32);
	__type(value, __u64);
} other_counts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} overflow SEC(".maps");

static __always_inline void count_cgroup(__u32 fn)
{
	struct cgroup_fn k = { .cgroup = bpf_get_current_cgroup_id(), .fn = fn };
	__u64 *n = bpf_map_lookup_elem(&cgroup_counts, &k);
	if (n) {
		__sync_fetch_and_add(n, 1);
		return;
	}
	__u64 one = 1;
	if (bpf_map_update_elem(&cgroup_counts, &k, &one, BPF_NOEXIST) == 0)
		return;
	// Another CPU's call put the pair in first, or the map is full.
	n = bpf_map_lookup_elem(&cgroup_counts, &k);
	if (n) {
		__sync_fetch_and_add(n, 1);
		return;
	}
	n = bpf_map_lookup_elem(&other_counts, &fn);
	if (n)
		__sync_fetch_and_add(n, 1);
	__u32 zero = 0;
	n = bpf_map_lookup_elem(&overflow, &zero);
	if (n)
		__sync_fetch_and_add(n, 1);
}

struct start_key {
	__u64 tgid_pid;
	__u64 sp;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1 << 16);
	__type(key, struct start_key);
	__type(value, __u64);
} starts SEC(".maps");

#if defined(__TARGET_ARCH_x86)
#define REG_SP 152
#elif defined(__TARGET_ARCH_arm64)
#define REG_SP 248
#else
#error "agent.bpf.c: no stack pointer offset for this architecture"
#endif

SEC("uprobe")
int agent_probe(void *ctx)
{
	__u64 now = bpf_ktime_get_ns(), cookie = mp_cookie(ctx);
	struct site *s = bpf_map_lookup_elem(&sites, &cookie);
	if (!s)
		return 0;
	struct start_key k = {
		.tgid_pid = bpf_get_current_pid_tgid(),
		.sp = *(__u64 *)((char *)ctx + REG_SP) - s->sp_gain,
	};
	__u32 fn = s->fn;
	if (!s->is_return) {
		__u64 *n = bpf_map_lookup_elem(&counts, &fn);
		if (n)
			__sync_fetch_and_add(n, 1);
		count_cgroup(fn);
		bpf_map_update_elem(&starts, &k, &now, BPF_ANY);
		return 0;
	}
	__u64 *start = bpf_map_lookup_elem(&starts, &k);
	if (!start)
		return 0;
	__u64 ns = now - *start;
	bpf_map_delete_elem(&starts, &k);
	struct hist *h = bpf_map_lookup_elem(&hists, &fn);
	if (!h)
		return 0;
	__u32 slot = 0;
	for (int i = 32; i > 0; i >>= 1)
		if (ns >> (slot + i))
			slot += i;
	if (slot >= SLOTS)
		slot = SLOTS - 1;
	__sync_fetch_and_add(&h->slots[slot], 1);
	__sync_fetch_and_add(&h->sum_ns, ns);
	return 0;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
