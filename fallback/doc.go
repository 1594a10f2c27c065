// Package fallback attaches one BPF program to many user-space sites on
// kernels without uprobe_multi (before Linux 6.6): one perf-event uprobe
// and BPF perf link per site, made with cilium/ebpf's link package.
//
// [Uprobes] takes the same targets as attach.UprobeMulti and gives the
// sites the same cookies, ref-counter offsets and entry or return probes,
// all or nothing. Each site costs up to two file descriptors, so Uprobes
// checks RLIMIT_NOFILE first (raising the soft limit if it can). Detaching
// is the expensive part, about 0.1 s per site in the kernel, most of it
// serialised; [Link.Close] detaches the programs from all sites
// concurrently first and then removes the breakpoints.
//
// Perf-event uprobes cannot filter by process: their pid selects a single
// thread. Filter inside BPF instead with package pidfilter.
//
// Kernels before 5.15 have no BPF cookies. There [Options.Programs] gives
// each site a program of its own, which the root package's Plan.Attach
// makes by cloning the user's program with the site's cookie built in
// (bpf/mp_cookie.bpf.h).
package fallback
