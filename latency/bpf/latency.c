// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
//
// The timer of package latency (and `multiprobe latency`): per function, a
// log2 histogram of the time from its entry to its return, in nanoseconds.
// Two programs, of which package latency loads one:
//
//   - latency_session, on kernels with uprobe sessions (6.13+): one program
//     runs at a function's entry and at its return, and the kernel keeps
//     the entry's timestamp for the return in the session cookie. Nothing
//     is looked up, nothing can be lost.
//   - latency_pair, elsewhere (and on Go programs, whose returns are probed
//     at their return instructions): attached at both, it stores the
//     entry's timestamp in a hash under the frame, and the return takes it
//     from there. A frame in flight is told apart from every other in the
//     process by its stack pointer, so that recursion and threads are
//     timed right. A goroutine's stack is not where it was at the entry if
//     it grew meanwhile (Go copies it) and its thread may be another, so a
//     Go frame is the goroutine (its g, which stays put) and the distance
//     of the stack pointer from the stack's top (which the copy keeps).
//
// Both find the site's function through the sites array, indexed by the
// site's cookie, which package latency fills in before attaching.

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "mp_cookie.bpf.h"
#include "by.h"

// Slot i counts durations in [2^i, 2^(i+1)) ns; the last also counts
// everything longer (2^39 ns is about nine minutes).
#define SLOTS 40

struct site {
	__u32 fn;	 // the function's row in hists
	__u8 is_return;	 // the site is the function's return
	__u8 go;	 // the function is Go's (ABIInternal: g in a register)
	__u16 sp_gain;	 // at a return, what the stack pointer gained since the entry
};

struct hist {
	__u64 slots[SLOTS];
	__u64 count;
	__u64 sum_ns;
};

struct start_key {
	__u32 tgid;
	__u32 pad;
	__u64 g;     // a Go frame's goroutine, 0 for C
	__u64 frame; // the stack pointer, or a Go frame's distance from the stack's top
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1); // resized by package latency: one per site
	__type(key, __u32);
	__type(value, struct site);
} sites SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1); // resized by package latency: one per function
	__type(key, __u32);
	__type(value, struct hist);
} hists SEC(".maps");

// Entries in flight, for latency_pair. LRU, so that calls that never return
// (longjmp, a thread's exit, a Go stack copied while they ran) age out
// instead of filling it.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1 << 16);
	__type(key, struct start_key);
	__type(value, __u64);
} starts SEC(".maps");

// Returns whose entry was not seen: a call in flight at attach, or one
// whose start was evicted.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} unmatched SEC(".maps");

// The offsets in struct pt_regs of the stack pointer and of the register
// Go's ABIInternal keeps the current goroutine's g in: R14 on x86-64, R28
// on arm64.
#if defined(__TARGET_ARCH_x86)
#define REG_SP 152 // after r15 ... di, orig_ax, ip, cs, flags
#define REG_G 8	   // r14, after r15
#elif defined(__TARGET_ARCH_arm64)
#define REG_SP 248 // regs[31]
#define REG_G 224  // regs[28]
// The three below follow the kernel's struct pt_regs (as package usdt
// tables it) and Go's ABIInternal; no test VM runs them, so only x86-64
// and arm64 are known to work. riscv64: sp is x2, g x27; s390x: r15, r13;
// ppc64le: r1, r30.
#elif defined(__TARGET_ARCH_riscv)
#define REG_SP (2 * 8)
#define REG_G (27 * 8)
#elif defined(__TARGET_ARCH_s390)
#define REG_SP (24 + 15 * 8)
#define REG_G (24 + 13 * 8)
#elif defined(__TARGET_ARCH_powerpc)
#define REG_SP (1 * 8)
#define REG_G (30 * 8)
#else
#error "latency.c: no pt_regs layout for this architecture"
#endif

#define REG(ctx, off) (*(__u64 *)((char *)(ctx) + (off)))

// g.stack.hi: runtime.g begins with its stack, a struct {lo, hi uintptr},
// as it has since Go 1.4.
#define G_STACK_HI 8

// With latency.Options.By, each call is also timed by who made it (by.h),
// in by_hists, which package latency sizes; a call that finds it full is
// in hists only.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1); // resized by package latency with --by
	__type(key, struct by_key);
	__type(value, struct hist);
} by_hists SEC(".maps");

// An empty histogram, the first value of a by_hists entry (a struct hist
// is too big for the stack beside the rest).
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct hist);
} empty_hist SEC(".maps");

static __always_inline void add(struct hist *h, __u64 ns)
{
	__u32 slot = 0;

	// floor(log2(ns)), by halving.
	for (int i = 32; i > 0; i >>= 1) {
		if (ns >> (slot + i)) {
			slot += i;
		}
	}
	if (slot >= SLOTS)
		slot = SLOTS - 1;
	__sync_fetch_and_add(&h->slots[slot], 1);
	__sync_fetch_and_add(&h->count, 1);
	__sync_fetch_and_add(&h->sum_ns, ns);
}

static __always_inline void record(__u32 fn, __u64 ns)
{
	struct hist *h = bpf_map_lookup_elem(&hists, &fn);
	struct by_key k = {.key = fn};
	__u32 zero = 0;

	if (!h)
		return;
	add(h, ns);
	if (by == BY_NONE)
		return;
	k.who = by_who();
	h = bpf_map_lookup_elem(&by_hists, &k);
	if (!h) {
		struct hist *empty = bpf_map_lookup_elem(&empty_hist, &zero);

		// Another CPU may make the entry meanwhile: then it is kept.
		if (empty)
			bpf_map_update_elem(&by_hists, &k, empty, BPF_NOEXIST);
		h = bpf_map_lookup_elem(&by_hists, &k);
	}
	if (h)
		add(h, ns);
}

static __always_inline void count_unmatched(void)
{
	__u32 zero = 0;
	__u64 *n = bpf_map_lookup_elem(&unmatched, &zero);

	if (n)
		__sync_fetch_and_add(n, 1);
}

SEC("uprobe")
int latency_pair(void *ctx)
{
	__u64 now = bpf_ktime_get_ns(), *start;
	__u32 key = (__u32)mp_cookie(ctx);
	struct site *s = bpf_map_lookup_elem(&sites, &key);
	struct start_key k = {};

	if (!s)
		return 0;
	k.tgid = bpf_get_current_pid_tgid() >> 32;
	k.frame = REG(ctx, REG_SP) - s->sp_gain;
	if (s->go) {
		__u64 hi;

		k.g = REG(ctx, REG_G);
		if (bpf_probe_read_user(&hi, sizeof(hi), (void *)(k.g + G_STACK_HI)))
			return 0;
		k.frame = hi - k.frame;
	}
	if (!s->is_return) {
		bpf_map_update_elem(&starts, &k, &now, BPF_ANY);
		return 0;
	}
	start = bpf_map_lookup_elem(&starts, &k);
	if (!start) {
		count_unmatched();
		return 0;
	}
	record(s->fn, now - *start);
	bpf_map_delete_elem(&starts, &k);
	return 0;
}

extern int bpf_session_is_return(void) __ksym __weak;
extern __u64 *bpf_session_cookie(void) __ksym __weak;

SEC("uprobe.session")
int latency_session(void *ctx)
{
	__u64 now = bpf_ktime_get_ns(), *start = bpf_session_cookie();
	__u32 key = (__u32)mp_cookie(ctx);
	struct site *s;

	if (!start)
		return 1;
	if (!bpf_session_is_return()) {
		*start = now;
		// 0 asks the kernel to run this program again at the return.
		return 0;
	}
	s = bpf_map_lookup_elem(&sites, &key);
	if (s)
		record(s->fn, now - *start);
	return 0;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
