// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
//
// A uprobe program shaped to test the injected pid filter: the entry
// program calls a static (bpf-to-bpf) function and a global one, then tail
// calls another program. Every stage counts its runs in stages[], so a test
// sees that all of them ran exactly as often as the filter let the entry
// through. pid_counts and tid_counts count events per process and thread.

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

/* The filter's maps as a bpf2go user declares them: Inject takes these
 * rather than adding its own, and a test checks them against MapSpec and
 * AllMapSpec. */
#include "mp_pids.bpf.h"

#define STAGE_ENTRY 0
#define STAGE_STATIC 1
#define STAGE_GLOBAL 2
#define STAGE_TAIL 3

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 4);
	__type(key, __u32);
	__type(value, __u64);
} stages SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, __u64);
} pid_counts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, __u64);
} tid_counts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} jump SEC(".maps");

static __always_inline void bump(void *map, __u32 key)
{
	__u64 one = 1, *v;

	v = bpf_map_lookup_elem(map, &key);
	if (v) {
		__sync_fetch_and_add(v, 1);
		return;
	}
	if (bpf_map_update_elem(map, &key, &one, BPF_NOEXIST)) {
		// Another CPU created it first.
		v = bpf_map_lookup_elem(map, &key);
		if (v)
			__sync_fetch_and_add(v, 1);
	}
}

static __always_inline void stage(__u32 s)
{
	__u64 *v = bpf_map_lookup_elem(&stages, &s);

	if (v)
		__sync_fetch_and_add(v, 1);
}

static __noinline int count_tid(__u32 tid)
{
	bump(&tid_counts, tid);
	stage(STAGE_STATIC);
	return 0;
}

__noinline int global_count(__u32 tgid)
{
	bump(&pid_counts, tgid);
	stage(STAGE_GLOBAL);
	return 0;
}

SEC("uprobe")
int filtered_entry(void *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();

	stage(STAGE_ENTRY);
	count_tid((__u32)id);
	global_count(id >> 32);
	bpf_tail_call(ctx, &jump, 0);
	return 0;
}

SEC("uprobe")
int tail_target(void *ctx)
{
	stage(STAGE_TAIL);
	return 0;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
