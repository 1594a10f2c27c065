/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * cookie.bpf.h: the site's cookie in a uprobe program attached by
 * multiprobe, on every kernel (github.com/multiprobe/multiprobe/fallback).
 *
 * From Linux 5.15 a probe program reads its site's cookie with
 * bpf_get_attach_cookie(). Before, perf-event uprobes carry none, so
 * multiprobe stores every site's cookie in mp_cookies under the site's
 * runtime address, and mp_cookie() looks up the instruction pointer there
 * (at a uprobe the kernel has rewound it to the probed address). The
 * program's code is the same on both: call mp_cookie(ctx) where it would
 * call bpf_get_attach_cookie(ctx).
 *
 * The header is self-contained like usdt.bpf.h: it includes nothing and
 * declares the helpers it calls under private names, so it compiles next
 * to vmlinux.h, libbpf's <bpf/bpf_helpers.h>, usdt.bpf.h, or none of them.
 * The instruction pointer's offset in struct pt_regs comes from
 * __TARGET_ARCH_x86 or __TARGET_ARCH_arm64 (bpf2go -target amd64,arm64
 * defines them; with plain clang pass -D__TARGET_ARCH_x86), or from
 * MP_COOKIE_IP_OFF if defined first.
 *
 * multiprobe sets mp_no_cookie and sizes mp_cookies at load time
 * (fallback.ConfigureCollection) and fills mp_cookies when it attaches
 * (fallback.Options.CookieMap).
 */
#ifndef MP_COOKIE_BPF_H
#define MP_COOKIE_BPF_H

#ifndef MP_COOKIE_MAX_SITES
#define MP_COOKIE_MAX_SITES 4096
#endif

#ifndef MP_COOKIE_IP_OFF
#if defined(__TARGET_ARCH_x86)
#define MP_COOKIE_IP_OFF 128 /* struct pt_regs.ip */
#elif defined(__TARGET_ARCH_arm64)
#define MP_COOKIE_IP_OFF 256 /* struct user_pt_regs.pc */
#else
#error "cookie.bpf.h: define __TARGET_ARCH_x86 or __TARGET_ARCH_arm64, or MP_COOKIE_IP_OFF"
#endif
#endif

/* Runtime address of a site -> its cookie, for kernels without cookies. */
struct {
	int (*type)[1 /* BPF_MAP_TYPE_HASH */];
	int (*max_entries)[MP_COOKIE_MAX_SITES];
	unsigned long long *key;
	unsigned long long *value;
} mp_cookies __attribute__((section(".maps"), used));

/*
 * Set at load time. Being const volatile, it lives in .rodata, and the
 * verifier prunes the branch not taken: on a kernel without
 * bpf_get_attach_cookie (before 5.15) the call to it is dead code and is
 * removed before helpers are checked.
 */
const volatile _Bool mp_no_cookie = 0;

/* Helpers, by number, under names that clash with neither
 * bpf_helper_defs.h nor usdt.bpf.h. */
static void *(*const mp__cookie_map_lookup_elem)(void *map, const void *key) = (void *)1;
static unsigned long long (*const mp__cookie_get_attach_cookie)(void *ctx) = (void *)174;

/*
 * mp_cookie returns the cookie multiprobe gave the site that fired, or ~0
 * if it has none (a site attached by something else). ctx is the program's
 * context, a struct pt_regs.
 */
static inline __attribute__((always_inline)) unsigned long long mp_cookie(void *ctx)
{
	unsigned long long ip, *v;

	if (!mp_no_cookie)
		return mp__cookie_get_attach_cookie(ctx);
	/* A fixed offset: the verifier allows direct context reads only so. */
	ip = *(unsigned long long *)((char *)ctx + MP_COOKIE_IP_OFF);
	v = mp__cookie_map_lookup_elem(&mp_cookies, &ip);
	return v ? *v : ~0ULL;
}

#endif /* MP_COOKIE_BPF_H */
