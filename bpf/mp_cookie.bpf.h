/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * mp_cookie.bpf.h: the cookie of the site that fired, in a uprobe program
 * attached by multiprobe (github.com/multiprobe/multiprobe), on every
 * kernel. Call mp_cookie(ctx) where the program would call
 * bpf_get_attach_cookie(ctx).
 *
 * BPF cookies need Linux 5.15. On older kernels multiprobe loads one clone
 * of the program per site, each with its site's cookie as a constant in
 * this header's own read-only section (.rodata.mp_cookie), and the verifier
 * removes the bpf_get_attach_cookie call as dead code, so the same object
 * loads on both. The constant is exact for entry, return and USDT probes
 * alike: nothing is looked up by address. Plan.Prepare sets
 * mp_cookie_fixed; Plan.Attach makes the clones.
 *
 * The header is self-contained: it includes nothing and declares the
 * helper it calls under a private name, so it compiles next to vmlinux.h,
 * libbpf's <bpf/bpf_helpers.h>, mp_usdt.bpf.h, or none of them. The names
 * are mp_-prefixed so that it cannot be mistaken for a libbpf header.
 */
#ifndef MP_COOKIE_BPF_H
#define MP_COOKIE_BPF_H

/*
 * Set at load time. Being const volatile in a .rodata section, they are
 * frozen before the program is verified, and the verifier prunes the
 * branch not taken.
 */
const volatile _Bool mp_cookie_fixed __attribute__((section(".rodata.mp_cookie"), used)) = 0;
const volatile unsigned long long mp_cookie_value __attribute__((section(".rodata.mp_cookie"), used)) = ~0ULL;

static unsigned long long (*const mp__get_attach_cookie)(void *ctx) = (void *)174;

/*
 * mp_cookie returns the cookie multiprobe gave the site that fired, or ~0
 * for a site that has none. ctx is the program's context.
 */
static inline __attribute__((always_inline)) unsigned long long mp_cookie(void *ctx)
{
	if (mp_cookie_fixed)
		return mp_cookie_value;
	return mp__get_attach_cookie(ctx);
}

#endif /* MP_COOKIE_BPF_H */
