// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
//
// The meter behind package profile's Meter: an fentry and an fexit program
// attached to one BPF program, which time every run of it with the clock
// and, where the machine has them, the cycle and instruction counters.
//
// fentry takes the readings last, as near the body as it can, and fexit
// takes them first. Between them runs the measured program, and the part
// of the trampoline that calls it, which Meter's Overhead measures on an
// empty program and reports beside the result.
//
// A run of the measured program can start on a CPU whose previous run has
// not ended: uprobe programs run with preemption on, so a task can be
// preempted inside one and another task run the same program on that
// CPU. The inner run is not timed (it would overwrite the outer's start)
// and is counted as nested; the outer one's time includes it.

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

// Slots: 4 per power of two, so that a percentile read from them is off
// by at most a fifth. Slot 4*l+s counts runs of [2^l + s*2^(l-2),
// 2^l + (s+1)*2^(l-2)) ns for l >= 3; runs under 8 ns go to slots 0..7 by
// their exact value, and slots 8..11 stay empty.
#define SLOTS 256

// Readings taken by fentry for the run in flight on this CPU.
struct start {
	__u64 ns;
	__u64 cycles;
	__u64 insns;
	__u32 depth;
	__u32 have; // bit 0: cycles read, bit 1: instructions read
};

// Sums over the runs this CPU timed.
struct totals {
	__u64 runs;
	__u64 ns;
	__u64 cycles;
	__u64 cycle_runs; // runs whose cycles were read at both ends
	__u64 insns;
	__u64 insn_runs;
	__u64 nested;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct start);
} starts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct totals);
} totals SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} hist SEC(".maps");

// One perf event per CPU each, opened by user space where the PMU has it;
// a CPU without one reads an error and its runs go uncounted.
struct {
	__uint(type, BPF_MAP_TYPE_PERF_EVENT_ARRAY);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(__u32));
} cycles SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERF_EVENT_ARRAY);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(__u32));
} insns SEC(".maps");

static __always_inline int read_counter(void *map, __u64 *v)
{
	struct bpf_perf_event_value pv = {};

	if (bpf_perf_event_read_value(map, BPF_F_CURRENT_CPU, &pv, sizeof(pv)))
		return 0;
	*v = pv.counter;
	return 1;
}

// slot maps a duration in ns to its histogram slot (see SLOTS).
static __always_inline __u32 slot(__u64 v)
{
	__u32 l = 0;

	if (v < 8)
		return v;
	__u64 w = v;
	if (w >> 32) { w >>= 32; l += 32; }
	if (w >> 16) { w >>= 16; l += 16; }
	if (w >> 8) { w >>= 8; l += 8; }
	if (w >> 4) { w >>= 4; l += 4; }
	if (w >> 2) { w >>= 2; l += 2; }
	if (w >> 1) { l += 1; }
	return l * 4 + ((v >> (l - 2)) & 3);
}

SEC("fentry/runcost")
int runcost_entry(void *ctx)
{
	__u32 zero = 0;
	struct start *s = bpf_map_lookup_elem(&starts, &zero);

	if (!s)
		return 0;
	if (s->depth++ > 0)
		return 0;
	s->have = read_counter(&cycles, &s->cycles);
	s->have |= read_counter(&insns, &s->insns) << 1;
	s->ns = bpf_ktime_get_ns();
	return 0;
}

SEC("fexit/runcost")
int runcost_exit(void *ctx)
{
	__u64 ns = bpf_ktime_get_ns(), c = 0, i = 0;
	int have = read_counter(&cycles, &c);
	have |= read_counter(&insns, &i) << 1;
	__u32 zero = 0;
	struct start *s = bpf_map_lookup_elem(&starts, &zero);
	struct totals *t = bpf_map_lookup_elem(&totals, &zero);

	if (!s || !t || s->depth == 0)
		return 0;
	if (--s->depth > 0) {
		t->nested++;
		return 0;
	}
	__u64 d = ns - s->ns;
	t->runs++;
	t->ns += d;
	have &= s->have;
	if (have & 1) {
		t->cycles += c - s->cycles;
		t->cycle_runs++;
	}
	if (have & 2) {
		t->insns += i - s->insns;
		t->insn_runs++;
	}
	__u32 k = slot(d);
	if (k >= SLOTS)
		k = SLOTS - 1;
	__u64 *n = bpf_map_lookup_elem(&hist, &k);
	if (n)
		*n += 1;
	return 0;
}

// The empty program Overhead measures: what the meter reports for a body
// that does nothing is the meter's own part of every reading.
SEC("socket")
int runcost_empty(struct __sk_buff *skb)
{
	return 0;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
