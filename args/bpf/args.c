// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
//
// The tracer of package args (and `multiprobe count --args`): counts per
// site like package count's counter and sends every hit's arguments to
// user space through a ring buffer: a USDT site's, read with
// bpf/mp_usdt.bpf.h, and the registers that hold a function's first
// integer arguments in the C calling convention and its return value, and
// up to STR_MAX of them read as C strings (args.Options.Strings). Go, which
// knows the site's kind, keeps the ones that mean something there.

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "mp_usdt.bpf.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1); // resized by package args
	__type(key, __u32);
	__type(value, __u64);
} counts SEC(".maps");

#define STR_MAX 3
#define STR_LEN 128

struct hit {
	__u32 site;
	__s32 argc;
	__s64 args[MP_USDT_MAX_ARGS];
	// Six arguments, the return value, and on x86-64 RBX, which with the
	// others passes a Go function's first six arguments (Go's ABIInternal:
	// RAX, RBX, RCX, RDI, RSI, R8); arm64's Go passes them as C does.
	__s64 regs[8];
	// What bpf_probe_read_user_str returned for each string: its length
	// with the NUL, or a negative errno.
	__s32 str_len[STR_MAX];
	__u32 pad;
	char str[STR_MAX][STR_LEN];
};

// The arguments to read as strings, set by package args before loading:
// at a USDT site an index into args, elsewhere into regs (6, the return
// value, at a return); STR_NONE for none.
#define STR_NONE 0xff
const volatile __u32 str_arg[STR_MAX] = {STR_NONE, STR_NONE, STR_NONE};

// Offsets in struct pt_regs of the argument registers, in order, and of the
// return value's: x86-64 rdi, rsi, rdx, rcx, r8, r9 and rax; arm64 x0 to x5
// and x0.
#if defined(__TARGET_ARCH_x86)
#define REG_ARG0 112
#define REG_ARG1 104
#define REG_ARG2 96
#define REG_ARG3 88
#define REG_ARG4 72
#define REG_ARG5 64
#define REG_RET 80
#define REG_EXTRA 40 // rbx
#elif defined(__TARGET_ARCH_arm64)
#define REG_ARG0 0
#define REG_ARG1 8
#define REG_ARG2 16
#define REG_ARG3 24
#define REG_ARG4 32
#define REG_ARG5 40
#define REG_RET 0
#define REG_EXTRA 48 // x6
// The three below follow the kernel's struct pt_regs (as package usdt
// tables it) and the ELF psABIs; no test VM runs them, so only x86-64 and
// arm64 are known to work. riscv64: a0 to a5, a0, a6. s390x passes five
// arguments in r2 to r6 and the sixth on the stack (REG_ARG5 reads r7):
// r2, r7. ppc64le: r3 to r8, r3, r9.
#elif defined(__TARGET_ARCH_riscv)
#define REG_ARG0 80
#define REG_ARG1 88
#define REG_ARG2 96
#define REG_ARG3 104
#define REG_ARG4 112
#define REG_ARG5 120
#define REG_RET 80
#define REG_EXTRA 128
#elif defined(__TARGET_ARCH_s390)
#define REG_ARG0 40
#define REG_ARG1 48
#define REG_ARG2 56
#define REG_ARG3 64
#define REG_ARG4 72
#define REG_ARG5 80
#define REG_RET 40
#define REG_EXTRA 80
#elif defined(__TARGET_ARCH_powerpc)
#define REG_ARG0 24
#define REG_ARG1 32
#define REG_ARG2 40
#define REG_ARG3 48
#define REG_ARG4 56
#define REG_ARG5 64
#define REG_RET 24
#define REG_EXTRA 72
#else
#error "args.c: no calling convention for this architecture"
#endif

#define REG(ctx, off) (*(__s64 *)((char *)(ctx) + (off)))

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
	h->regs[0] = REG(ctx, REG_ARG0);
	h->regs[1] = REG(ctx, REG_ARG1);
	h->regs[2] = REG(ctx, REG_ARG2);
	h->regs[3] = REG(ctx, REG_ARG3);
	h->regs[4] = REG(ctx, REG_ARG4);
	h->regs[5] = REG(ctx, REG_ARG5);
	h->regs[6] = REG(ctx, REG_RET);
	h->regs[7] = REG(ctx, REG_EXTRA);
	for (int i = 0; i < MP_USDT_MAX_ARGS; i++) {
		long v = 0;

		mp_usdt_arg(ctx, i, &v);
		h->args[i] = v;
	}
	for (int i = 0; i < STR_MAX; i++) {
		__u32 n = str_arg[i];
		__s64 addr;

		h->str_len[i] = 0;
		if (h->argc >= 0 && n < MP_USDT_MAX_ARGS)
			addr = h->args[n];
		else if (h->argc < 0 && n < 7)
			addr = h->regs[n];
		else
			continue;
		h->str_len[i] = bpf_probe_read_user_str(h->str[i], STR_LEN, (void *)addr);
	}
	bpf_ringbuf_submit(h, 0);
	return 0;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
