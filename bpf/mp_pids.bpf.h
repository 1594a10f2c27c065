/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * mp_pids.bpf.h: the maps of multiprobe's in-BPF pid filter
 * (github.com/multiprobe/multiprobe/pidfilter), for programs filtered with
 * pidfilter.Inject that want the maps in a bpf2go objects struct.
 *
 * Programs attached through multiprobe's Plan need neither this header nor
 * the maps: every Link that filters by pid in BPF gets a copy of the
 * program with the filter and maps of its own, so that links never see
 * each other's pids.
 *
 * mp_pids is a hash from a process id (the tgid, what user space calls the
 * pid) to the number of holders that want it; mp_pids_all holds, at index
 * 0, the number of holders that want every process. The layouts are
 * pidfilter.MapSpec's and pidfilter.AllMapSpec's; a test checks them
 * against each other.
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

struct {
	int (*type)[2 /* BPF_MAP_TYPE_ARRAY */];
	int (*max_entries)[1];
	unsigned int *key;
	unsigned int *value;
} mp_pids_all __attribute__((section(".maps"), used));

#endif /* MP_PIDS_BPF_H */
