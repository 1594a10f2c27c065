/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * mp_pids.bpf.h: the pid set map of multiprobe's in-BPF pid filter
 * (github.com/multiprobe/multiprobe/pidfilter).
 *
 * You need not include it: multiprobe's Plan.Prepare adds the map to a
 * collection spec that lacks it. Include it to have the map in a bpf2go
 * objects struct, or to read it from your own code (mp_pid_wanted).
 *
 * The map is a hash from a process id (the tgid, what user space calls
 * the pid) to the number of multiprobe links that want it; key 0 lets
 * every process through. The layout is pidfilter.MapSpec's; a test
 * checks the two against each other.
 */
#ifndef MP_PIDS_BPF_H
#define MP_PIDS_BPF_H

#ifndef MP_MAX_PIDS
#define MP_MAX_PIDS 1024
#endif

struct {
	int (*type)[1 /* BPF_MAP_TYPE_HASH */];
	int (*max_entries)[MP_MAX_PIDS];
	unsigned int *key;
	unsigned int *value;
} mp_pids __attribute__((section(".maps"), used));

#endif /* MP_PIDS_BPF_H */
