// SPDX-License-Identifier: GPL-2.0
//
// A BPF object with programs of several types and costs, for the load
// package's tests and the multiprobe load command's. Maps without
// max_entries test the command's defaults; BROKEN adds a program the
// verifier rejects.
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 4);
} counts SEC(".maps");

// No max_entries: the command gives zero-sized maps a default.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, __u64);
} seen SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
} events SEC(".maps");

static __always_inline void bump(__u32 k)
{
	__u64 *v = bpf_map_lookup_elem(&counts, &k);
	if (v)
		__sync_fetch_and_add(v, 1);
}

SEC("socket")
int tail_target(struct __sk_buff *skb)
{
	bump(1);
	return 0;
}

struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__array(values, int(struct __sk_buff *));
} jmp SEC(".maps") = {
	.values = { [0] = (void *)&tail_target },
};

SEC("socket")
int count_packets(struct __sk_buff *skb)
{
	bump(0);
	bpf_tail_call(skb, &jmp, 0);
	return 0;
}

// A bounded loop over values the verifier cannot know: the costliest program.
SEC("uprobe")
int on_call(void *ctx)
{
	__u32 k = 2;
	__u64 *v = bpf_map_lookup_elem(&counts, &k);
	__u64 acc = 0;

	if (!v)
		return 0;
	for (int i = 0; i < 200; i++) {
		if (*v > (__u64)i)
			acc += i;
		else
			acc ^= i;
	}
	bpf_map_update_elem(&seen, &k, &acc, BPF_ANY);
	return 0;
}

SEC("kprobe/do_nanosleep")
int on_nanosleep(void *ctx)
{
	__u64 *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);

	if (!e)
		return 0;
	*e = bpf_ktime_get_ns();
	bpf_ringbuf_submit(e, 0);
	return 0;
}

SEC("tracepoint/syscalls/sys_enter_getpid")
int on_getpid(void *ctx)
{
	bump(3);
	return 0;
}

#ifdef BROKEN
// Rejected: socket filters may not read skb->data.
SEC("socket")
int reads_data(struct __sk_buff *skb)
{
	return (int)(long)skb->data;
}
#endif

char LICENSE[] SEC("license") = "GPL";
