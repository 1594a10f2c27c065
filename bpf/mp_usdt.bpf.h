/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * mp_usdt.bpf.h: read USDT probe arguments in a BPF program attached by
 * multiprobe (github.com/multiprobe/multiprobe/usdt).
 *
 * The header is self-contained apart from mp_cookie.bpf.h, which it
 * includes and which gives the site's cookie on every kernel: it declares
 * the BPF helpers it calls under private names and its map in the
 * BTF-defined form, so it compiles with plain
 *
 *	clang-19 -O2 -g -target bpf -c prog.bpf.c
 *
 * next to either vmlinux.h or libbpf's <bpf/bpf_helpers.h>, or neither.
 * Include it in one C file of a BPF object.
 *
 * Kernel floor: 5.5 (bpf_probe_read_user/kernel). The helpers are
 * GPL-only, so the program's license must be GPL-compatible. Before 5.15
 * (no BPF cookies) mp_cookie.bpf.h's per-site clones carry the cookie.
 *
 * How a handler finds the argument specs: multiprobe gives every site a
 * cookie whose upper 32 bits are a spec id (an index into mp_usdt_specs)
 * and whose lower 32 bits are the user's cookie (mp_usdt_cookie).
 *
 * Usage:
 *
 *	SEC("uprobe.multi")
 *	int MP_USDT(on_request, long id, const char *path, int status)
 *	{
 *		...
 *		return 0;
 *	}
 *
 * or, without the macro, mp_usdt_arg_cnt(ctx), mp_usdt_arg(ctx, n, &val),
 * mp_usdt_arg_size(ctx, n) and mp_usdt_cookie(ctx).
 *
 * The struct layouts below are mirrored by usdt.Spec and usdt.SpecArg in
 * Go; a test checks both against the BTF of a compiled object. Change them
 * together, never one alone.
 */
#ifndef MP_USDT_BPF_H
#define MP_USDT_BPF_H

#include "mp_cookie.bpf.h"

#ifndef MP_USDT_MAX_SPECS
#define MP_USDT_MAX_SPECS 1024
#endif

/* <sys/sdt.h> allows at most 12 arguments. */
#define MP_USDT_MAX_ARGS 12

/* Where an argument is (usdt.ArgKind). 0 is invalid on purpose. */
#define MP_USDT_ARG_CONST 1 /* the value is val */
#define MP_USDT_ARG_REG 2   /* in the register at reg_off */
#define MP_USDT_ARG_MEM 3   /* in memory at reg + val (val alone if reg_off < 0) */
#define MP_USDT_ARG_SIB 4   /* in memory at reg + (idx << scale_shift) + val */

struct mp_usdt_arg {
	long long val;		   /* constant, or displacement */
	short reg_off;		   /* struct pt_regs offset of the (base) register, -1: none */
	short idx_off;		   /* struct pt_regs offset of the index register, -1: none */
	unsigned char kind;	   /* MP_USDT_ARG_* */
	unsigned char size;	   /* 1, 2, 4 or 8 bytes */
	unsigned char is_signed;   /* sign- (1) or zero- (0) extend from size */
	unsigned char scale_shift; /* log2 of the index scale */
};

struct mp_usdt_spec {
	struct mp_usdt_arg args[MP_USDT_MAX_ARGS];
	unsigned int arg_cnt;
	unsigned int refs; /* holders of this spec id: multiprobe's, BPF ignores it */
};

/* Spec table, indexed by spec id; multiprobe fills it. */
struct {
	int (*type)[2 /* BPF_MAP_TYPE_ARRAY */];
	int (*max_entries)[MP_USDT_MAX_SPECS];
	unsigned int *key;
	struct mp_usdt_spec *value;
} mp_usdt_specs __attribute__((section(".maps"), used));

struct pt_regs;

#define MP__USDT_ENOENT 2
#define MP__USDT_ESRCH 3
#define MP__USDT_EINVAL 22

/* Helpers, by number, under names that cannot clash with bpf_helper_defs.h. */
static void *(*const mp__map_lookup_elem)(void *map, const void *key) = (void *)1;
static long (*const mp__probe_read_user)(void *dst, unsigned int size, const void *src) = (void *)112;
static long (*const mp__probe_read_kernel)(void *dst, unsigned int size, const void *src) = (void *)113;

#define MP__USDT_INLINE static inline __attribute__((always_inline))

/* The site's 64-bit cookie: spec id << 32 | user cookie. */
MP__USDT_INLINE unsigned long long mp__usdt_cookie64(void *ctx)
{
	return mp_cookie(ctx);
}

MP__USDT_INLINE struct mp_usdt_spec *mp__usdt_spec(void *ctx)
{
	unsigned int id = mp__usdt_cookie64(ctx) >> 32;

	/* Spec ids start at 1: 0 is a site that is not a USDT probe's, such
	 * as a uprobe's attached by the same program. */
	if (!id)
		return 0;
	return mp__map_lookup_elem(&mp_usdt_specs, &id);
}

/* mp_usdt_arg_cnt returns the number of arguments of the probe that fired,
 * or a negative errno when the site has no spec. */
MP__USDT_INLINE int mp_usdt_arg_cnt(void *ctx)
{
	struct mp_usdt_spec *spec = mp__usdt_spec(ctx);

	if (!spec)
		return -MP__USDT_ESRCH;
	return spec->arg_cnt;
}

/* mp_usdt_arg_size returns the size in bytes of argument n (negative
 * errno when there is no such argument). */
MP__USDT_INLINE int mp_usdt_arg_size(void *ctx, unsigned long long n)
{
	struct mp_usdt_spec *spec = mp__usdt_spec(ctx);

	if (!spec)
		return -MP__USDT_ESRCH;
	if (n >= MP_USDT_MAX_ARGS || n >= spec->arg_cnt)
		return -MP__USDT_ENOENT;
	return spec->args[n].size;
}

/* mp_usdt_cookie returns the user's 32-bit cookie of the site. */
MP__USDT_INLINE unsigned int mp_usdt_cookie(void *ctx)
{
	return (unsigned int)mp__usdt_cookie64(ctx);
}

MP__USDT_INLINE int mp__usdt_reg(void *ctx, short off, unsigned long long *v)
{
	*v = 0;
	if (off < 0)
		return 0; /* no register: contributes 0 */
	/* The largest struct pt_regs (ppc64) is under 512 bytes. */
	if (off > 512 - 8)
		return -MP__USDT_EINVAL;
	return mp__probe_read_kernel(v, sizeof(*v), (char *)ctx + off);
}

/* mp__usdt_zero returns 0 as a value the verifier cannot tell is 0: a
 * register of the probed program xor itself. mp_usdt_arg returns it on
 * success, and stores it in *res first, because a constant 0 stored by
 * the caller (as err = mp_usdt_arg(...) is) makes the verifier keep that
 * caller's states apart from those of the error paths, argument after
 * argument: reading 12 arguments with their errors and sizes went past
 * Linux 6.1's 1M instructions (47,464 for 6 arguments); with this it
 * takes 8,182 for 12. */
MP__USDT_INLINE long mp__usdt_zero(void *ctx)
{
	unsigned long long x = *(volatile unsigned long long *)ctx, z = x;

	__asm__ __volatile__("%0 ^= %1" : "+r"(z) : "r"(x));
	return z;
}

/* mp_usdt_arg reads argument n into *res, sign- or zero-extended from its
 * size. It returns 0, or a negative errno with *res set to 0. */
MP__USDT_INLINE int mp_usdt_arg(void *ctx, unsigned long long n, long *res)
{
	struct mp_usdt_spec *spec;
	struct mp_usdt_arg *arg;
	unsigned long long val = 0, base = 0, idx = 0;
	unsigned int size, shift;
	long zero = mp__usdt_zero(ctx);
	int err;

	*res = zero;
	spec = mp__usdt_spec(ctx);
	if (!spec)
		return -MP__USDT_ESRCH;
	if (n >= MP_USDT_MAX_ARGS || n >= spec->arg_cnt)
		return -MP__USDT_ENOENT;
	arg = &spec->args[n];
	size = arg->size;
	/* Bound size itself, not size - 1: the verifier of Linux 6.1 does not
	 * carry a bound on size - 1 back to size, and then refuses the read
	 * into the 8-byte val below. The empty asm keeps the compiler from
	 * merging the two tests into the single unsigned one it prefers. */
	if (size > 8)
		return -MP__USDT_EINVAL;
	__asm__ __volatile__("" : "+r"(size));
	if (size == 0)
		return -MP__USDT_EINVAL;

	switch (arg->kind) {
	case MP_USDT_ARG_CONST:
		val = arg->val;
		break;
	case MP_USDT_ARG_REG:
		err = mp__usdt_reg(ctx, arg->reg_off, &val);
		if (err)
			return err;
		break;
	case MP_USDT_ARG_MEM:
	case MP_USDT_ARG_SIB:
		err = mp__usdt_reg(ctx, arg->reg_off, &base);
		if (err)
			return err;
		if (arg->kind == MP_USDT_ARG_SIB) {
			err = mp__usdt_reg(ctx, arg->idx_off, &idx);
			if (err)
				return err;
			base += idx << (arg->scale_shift & 3);
		}
		err = mp__probe_read_user(&val, size, (void *)(base + arg->val));
		if (err)
			return err;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
		/* The bytes went to the top of val; bring them down. */
		val >>= 64 - size * 8;
#endif
		break;
	default:
		return -MP__USDT_EINVAL;
	}

	/* Keep the low size bytes, extended by the sign when signed. */
	shift = 64 - size * 8;
	val <<= shift;
	if (arg->is_signed)
		*res = (long)val >> shift;
	else
		*res = (long)(val >> shift);
	return zero;
}

/* mp__usdt_argv is argument n as a value, 0 when it cannot be read. */
MP__USDT_INLINE long mp__usdt_argv(void *ctx, unsigned long long n)
{
	long v = 0;

	mp_usdt_arg(ctx, n, &v);
	return v;
}

#define ___mp_usdt_cat(a, b) ___mp_usdt_cat_(a, b)
#define ___mp_usdt_cat_(a, b) a##b
#define ___mp_usdt_nth(_, _1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, N, ...) N
#define ___mp_usdt_narg(...) \
	___mp_usdt_nth(_, ##__VA_ARGS__, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
#define ___mp_usdt_a0() ctx
#define ___mp_usdt_a1(x) ___mp_usdt_a0(), mp__usdt_argv(ctx, 0)
#define ___mp_usdt_a2(x, a...) ___mp_usdt_a1(a), mp__usdt_argv(ctx, 1)
#define ___mp_usdt_a3(x, a...) ___mp_usdt_a2(a), mp__usdt_argv(ctx, 2)
#define ___mp_usdt_a4(x, a...) ___mp_usdt_a3(a), mp__usdt_argv(ctx, 3)
#define ___mp_usdt_a5(x, a...) ___mp_usdt_a4(a), mp__usdt_argv(ctx, 4)
#define ___mp_usdt_a6(x, a...) ___mp_usdt_a5(a), mp__usdt_argv(ctx, 5)
#define ___mp_usdt_a7(x, a...) ___mp_usdt_a6(a), mp__usdt_argv(ctx, 6)
#define ___mp_usdt_a8(x, a...) ___mp_usdt_a7(a), mp__usdt_argv(ctx, 7)
#define ___mp_usdt_a9(x, a...) ___mp_usdt_a8(a), mp__usdt_argv(ctx, 8)
#define ___mp_usdt_a10(x, a...) ___mp_usdt_a9(a), mp__usdt_argv(ctx, 9)
#define ___mp_usdt_a11(x, a...) ___mp_usdt_a10(a), mp__usdt_argv(ctx, 10)
#define ___mp_usdt_a12(x, a...) ___mp_usdt_a11(a), mp__usdt_argv(ctx, 11)
#define ___mp_usdt_args(a...) ___mp_usdt_cat(___mp_usdt_a, ___mp_usdt_narg(a))(a)

/*
 * MP_USDT declares a probe handler whose parameters after ctx are the
 * probe's arguments, read with mp_usdt_arg and converted to the declared
 * types (pointers included, hence the silenced -Wint-conversion). Put the
 * SEC() annotation in front of it.
 */
#define MP_USDT(name, args...)                                                 \
	name(struct pt_regs *ctx);                                             \
	MP__USDT_INLINE typeof(name(0)) ____##name(struct pt_regs *ctx, ##args); \
	typeof(name(0)) name(struct pt_regs *ctx)                              \
	{                                                                      \
		_Pragma("GCC diagnostic push")                                 \
		_Pragma("GCC diagnostic ignored \"-Wint-conversion\"")         \
		return ____##name(___mp_usdt_args(args));                      \
		_Pragma("GCC diagnostic pop")                                  \
	}                                                                      \
	MP__USDT_INLINE typeof(name(0)) ____##name(struct pt_regs *ctx, ##args)

#endif /* MP_USDT_BPF_H */
