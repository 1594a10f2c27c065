// SPDX-License-Identifier: GPL-2.0
// BPF side of the usdt tests: every hit sends the site's cookie, address
// and every argument (read with mp_usdt_arg) to user space, so the Go test
// can compare them with what the target passed. Deliberately includes
// nothing but mp_usdt.bpf.h, which must be self-contained.
#include "mp_usdt.bpf.h"

#define SEC(name) __attribute__((section(name), used))

struct event {
	unsigned long long ip;
	unsigned int cookie;
	int cnt;
	int err[MP_USDT_MAX_ARGS];
	int size[MP_USDT_MAX_ARGS];
	long long val[MP_USDT_MAX_ARGS];
	// Filled by the MP_USDT handler only: its named arguments.
	long long named[3];
	int from_macro;
};

struct {
	int (*type)[27 /* BPF_MAP_TYPE_RINGBUF */];
	int (*max_entries)[1 << 20];
} events SEC(".maps");

static long (*const rb_output)(void *rb, void *data, unsigned long long size,
			       unsigned long long flags) = (void *)130;


// Where pt_regs holds the instruction pointer: ip on x86-64 (after 16
// registers), pc on arm64 (after x0-x30 and sp).
#if defined(__TARGET_ARCH_arm64)
#define PT_REGS_IP_OFF 256
#else
#define PT_REGS_IP_OFF 128
#endif

static __attribute__((always_inline)) inline void fill(struct pt_regs *ctx, struct event *e)
{
	e->ip = 0;
	mp__probe_read_kernel(&e->ip, sizeof(e->ip), (char *)ctx + PT_REGS_IP_OFF);
	e->cookie = mp_usdt_cookie(ctx);
	e->cnt = mp_usdt_arg_cnt(ctx);
	for (int i = 0; i < MP_USDT_MAX_ARGS; i++) {
		long v = 0;
		e->err[i] = mp_usdt_arg(ctx, i, &v);
		e->val[i] = v;
		e->size[i] = mp_usdt_arg_size(ctx, i);
	}
}

SEC("uprobe.multi")
int record(struct pt_regs *ctx)
{
	struct event e = {};

	fill(ctx, &e);
	rb_output(&events, &e, sizeof(e), 0);
	return 0;
}

// The same for per-site perf-event uprobes (the fallback path), which
// need a program loaded without the uprobe_multi attach type.
SEC("uprobe")
int record_single(struct pt_regs *ctx)
{
	struct event e = {};

	fill(ctx, &e);
	rb_output(&events, &e, sizeof(e), 0);
	return 0;
}

// MP_USDT with named, typed arguments: attached to mptest:structp
// (long x, int y, short z).
SEC("uprobe.multi")
int MP_USDT(named, long x, int y, short z)
{
	struct event e = {};

	fill(ctx, &e);
	e.named[0] = x;
	e.named[1] = y;
	e.named[2] = z;
	e.from_macro = 1;
	rb_output(&events, &e, sizeof(e), 0);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
