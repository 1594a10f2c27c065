// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
//
// What count.c and the CLI's latency.c share for counting by who made a
// call: BY_PID its process (the tgid), BY_CGROUP its cgroup (the cgroup v2
// id, which names a container). Go sets by before loading; the tables
// keyed by by_key are each program's own.

#ifndef MP_BY_H
#define MP_BY_H

#define BY_NONE 0
#define BY_PID 1
#define BY_CGROUP 2
volatile const __u32 by = BY_NONE;

struct by_key {
	__u32 key; // the site (count.c) or function (latency.c)
	__u32 pad;
	__u64 who;
};

// by_who is the caller, as by says.
static __always_inline __u64 by_who(void)
{
	return by == BY_PID ? bpf_get_current_pid_tgid() >> 32 : bpf_get_current_cgroup_id();
}

#endif
