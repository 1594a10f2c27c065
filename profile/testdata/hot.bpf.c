// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
//
// The programs package profile's tests measure: one hot source line, a
// loop of `loops` iterations, beside a cheap path; and one that spends
// its time in a helper.

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

// Set before loading; read-only, so the verifier knows the loop's bound.
volatile const __u32 loops = 2000;

SEC("socket")
int hot(struct __sk_buff *skb)
{
	__u64 acc = skb->len;

	if (skb->len == 1)
		return 1; // the cheap path
	for (__u32 i = 0; i < loops; i++) acc = acc * 6364136223846793005ULL + i; // the hot line
	return acc & 1;
}

// The program whose time goes to a helper: one line calls
// bpf_get_prandom_u32 `loops` times.
SEC("socket")
int helper(struct __sk_buff *skb)
{
	__u64 acc = 0;

	for (__u32 i = 0; i < loops; i++) acc += bpf_get_prandom_u32(); // the helper line
	return acc & 1;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
