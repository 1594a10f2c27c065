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
// Kernels before 5.15 have no BPF cookies. A program that reads its cookie
// with mp_cookie() from bpf/cookie.bpf.h works on both: with
// [ConfigureCollection] and [Options.CookieMap], Uprobes stores every
// site's cookie in a map under the site's runtime address, which mp_cookie
// looks up. For position-independent binaries that address depends on the
// process, so [Options.PID] must name it.
package fallback
